"""Hand-written fakes of our own ports, for unit tests."""

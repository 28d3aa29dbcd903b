"""submitter: takes job requests, validates and queues them, submits them to Ray, tracks them."""

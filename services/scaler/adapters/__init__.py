"""The scaler's adapters: the local pool provider, Ray's cluster state, its demand bucket."""

"""A folder the launcher puts first on a job's PYTHONPATH: its `sitecustomize` runs at the
start-up of every Python process of the command (`coverage`, `ddtrace-run` and
`opentelemetry-instrument` start their hooks the same way)."""

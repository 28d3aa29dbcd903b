"""The submitter's adapters: the jobs bucket, Ray's Job Submission API, workspaces."""

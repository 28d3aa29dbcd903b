"""The checkpointer's adapters: the jobs bucket, the checkpoint store, Ray's GCS."""

"""checkpointer: resumes preempted jobs from their latest checkpoint on new capacity."""

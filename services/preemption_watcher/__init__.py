"""preemption_watcher: turns GCE preemption notices and Kubernetes node signals into events."""

"""Pure translations of cloud payloads (GCE log entries, Kubernetes Nodes) into signals."""

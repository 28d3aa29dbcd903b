"""Pure translations of the clouds' own payloads (GCE log entries, Kubernetes Nodes) into signals."""

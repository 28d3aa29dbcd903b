"""The embedded local stack: NATS with JetStream, a Ray head, the four services, on one machine."""

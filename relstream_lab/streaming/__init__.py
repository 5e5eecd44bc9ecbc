"""The streaming benchmark: what the Kafka path costs beside a direct run."""

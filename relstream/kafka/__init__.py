"""Kafka for every relstream process, in four rooms (docs/architecture/delivery.md, "Kafka's
rooms"): `clients` (every client made, its settings, topic names), `delivery` (publishing
and exactly once), `membership` (static group membership) and `tools` (the operator's:
the embedded brokers, status, usage, replay, reset)."""

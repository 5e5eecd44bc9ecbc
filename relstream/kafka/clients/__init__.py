"""Every Kafka client relstream makes (aiokafka in `aio`, kafka-python in `sync`), their
settings (TLS/SASL, limits), the patches they carry, topic names, and reading partitions to
their end: what the other rooms build on. Imports no other room."""

"""Kafka for every relstream process: topic names (`topics`), client settings and the one
consume/produce helper (`clients`), and the embedded brokers (`brokers`)."""

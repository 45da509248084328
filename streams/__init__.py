"""Kafka-facing side of cronlog: the Faust app, its agents, settings and topics."""

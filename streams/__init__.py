"""Kafka-facing side of cronlog: the node's loops (ingress, gate, ledger, scheduler,
dispatcher), settings and topics; `streams/core/` is the pure domain."""

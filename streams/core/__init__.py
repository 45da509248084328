"""The pure domain: job specs, schedule maths, command validation and the ledger's state
machine. Plain Python, no Kafka or database imports; time and ids are passed in."""

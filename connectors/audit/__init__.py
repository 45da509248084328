"""The audit (`cronlog audit`): the exactly-once promises checked against the topics.

- `connectors.audit.checker`: the pure checker (no Kafka): fed run-events and the worker
  reports in log order, it reports duplicates, illegal transitions, double claims and
  starts, missing firings, runs never final and executions the ledger did not sanction.
  Its checks are modules of their own beside it: `run_events` (event by event),
  `firings`, `periods`, `allowance` (at the end), `worker_reports` and `overlaps` (the
  reports), on what `history` and `grants` keep; `findings`, `lateness` and `summary`
  make the report.
- `connectors.audit.replay`: reads the topics from the start into the checker (the CLI,
  the benchmarks and the tests call `run_audit`).

Not a projection: it writes nothing and needs no database.
"""

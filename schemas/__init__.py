"""Avro schemas and codecs of the records cronlog writes.

- `schemas.records`, `schemas.spec`: the records and job specs as plain frozen
  dataclasses, the contract every other module imports (and which imports nothing).
- `schemas.codec`: one Codec per topic (JOB_LOG, RUN_EVENTS, JOB_STATE, RUN_STATE,
  DISPATCH, HEARTBEAT, WORKER_INBOX, RUN_LOG), Avro single-object encoding, records in
  and out; `schemas.convert` turns records into Avro dicts and back.
- `schemas.registry`: the .avsc files under avro/, their versions and fingerprints
  (`python -m schemas.registry snapshot` after changing a schema).
- `schemas.compat`: the Avro schema-resolution check between two versions (the `avro`
  package's compatibility checker).
- `schemas.json`: JSON views of the records and dead-letter envelopes (orjson).
"""

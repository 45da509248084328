"""cronlog's run events in your own Faust app (faust-streaming): a codec that decodes
`run-events` records with cronlog's own codec (`schemas.codec.RUN_EVENTS`, every schema
version ever shipped), so an agent receives typed records: `schemas.records.RunEvent`
for a run's transition, `JobEvent` for a job change.

    import faust
    from connectors.faust_codec import RunEvents
    from schemas.records import RunEvent

    app = faust.App("failures", broker="kafka://127.0.0.1:9092")
    events = app.topic("cronlog.run-events", value_serializer=RunEvents())

    @app.agent(events)
    async def failures(stream):
        async for event in stream:
            if isinstance(event, RunEvent) and event.state == "failed":
                print(event.job_id, event.run_id, event.reason)

Run it with `faust -A yourmodule worker`. The topic's records are in transactions: give
the app `consumer_isolation_level` if your Faust has it, or read only final states
(`succeeded`, `failed`, `cancelled`, `skipped`) which the ledger never takes back.

Faust's own environment: faust-streaming's `mode-streaming` pins croniter below 6, which
cronlog's schedule maths need, so the two cannot share one environment. The app's has
`faust-streaming`, `aiokafka[lz4]` (cronlog's batches are lz4), `fastavro` and `orjson`,
and cronlog itself installed without its dependencies (`pip install --no-deps cronlog`):
this module imports only `schemas`, never the schedule maths.
"""

from __future__ import annotations

from typing import Any

import faust

from schemas.codec import RUN_EVENTS


class RunEvents(faust.Codec):  # type: ignore[misc]  # faust is not in cronlog's environment
    """run-events values: Avro single-object bytes <-> RunEvent / JobEvent."""

    def _loads(self, s: bytes) -> Any:
        return RUN_EVENTS.decode(s)

    def _dumps(self, s: Any) -> bytes:
        return RUN_EVENTS.encode(s)

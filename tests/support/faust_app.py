"""A user's Faust app, as the README shows it: it reads cronlog's run-events with
cronlog's codec and writes one line per event it received, typed (for
tests/integration/test_faust_app.py; configured by the environment)."""

from __future__ import annotations

import os
from pathlib import Path

import faust

from connectors.faust_codec import RunEvents
from schemas.records import JobEvent, RunEvent

app = faust.App(
    os.environ["FAUST_APP_ID"],
    broker=f"kafka://{os.environ['CRONLOG_KAFKA']}",
    store="memory://",
    web_enabled=False,
    topic_disable_leader=True,
)
events = app.topic(os.environ["FAUST_TOPIC"], value_serializer=RunEvents())
OUT = Path(os.environ["FAUST_OUT"])


@app.agent(events)
async def record(stream):  # type: ignore[no-untyped-def]
    async for event in stream:
        if isinstance(event, RunEvent):
            line = f"RunEvent {event.job_id} {event.run_id} {event.state}\n"
        elif isinstance(event, JobEvent):
            line = f"JobEvent {event.job_id} {event.kind}\n"
        else:
            line = f"other {type(event).__name__}\n"
        with OUT.open("a") as out:
            out.write(line)

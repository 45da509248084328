"""A Faust app with one agent and one table, run as a subprocess by test_faust_recovery.

It counts records per key in a table (memory store: every start must rebuild the table
from its changelog topic) and emits the new count for each record, so the test can read
what the table held. Configured by env: CRONLOG_KAFKA, TEST_PREFIX.
"""

from __future__ import annotations

import os

import faust

PREFIX = os.environ["TEST_PREFIX"]

app = faust.App(
    f"{PREFIX}counter",
    broker=f"kafka://{os.environ['CRONLOG_KAFKA']}",
    store="memory://",
    web_enabled=False,
    topic_partitions=3,
    topic_replication_factor=1,
    broker_session_timeout=6.0,
    broker_heartbeat_interval=1.0,
    datadir=os.environ.get("TEST_DATADIR", f"/tmp/{PREFIX}faust"),
)

source = app.topic(
    f"{PREFIX}commands",
    key_type=bytes,
    value_type=bytes,
    key_serializer="raw",
    value_serializer="raw",
)
sink = app.topic(
    f"{PREFIX}run-events",
    key_type=bytes,
    value_type=bytes,
    key_serializer="raw",
    value_serializer="raw",
)
counts = app.Table("counts", default=int, partitions=3, key_type=str, value_type=int)


@app.agent(source)
async def count(stream: faust.StreamT[bytes]) -> None:
    async for key, _value in stream.items():
        name = key.decode()
        counts[name] += 1
        # Await delivery: the test reads these to see the table's value.
        await (await sink.send(key=key, value=str(counts[name]).encode()))


if __name__ == "__main__":
    app.main()

"""A Faust app with one agent and one table consumes a topic, is stopped, and recovers
its table from the changelog when it starts again (memory store: nothing on disk)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from streams.settings import Settings
from tests.support.kafka import consumer, drain

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


class FaustProcess:
    def __init__(self, settings: Settings, log: Path):
        env = {
            **os.environ,
            "CRONLOG_KAFKA": settings.kafka,
            "TEST_PREFIX": settings.topic_prefix,
            "TEST_DATADIR": str(log.parent / "data"),
        }
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.integration.faust_counter_app",
                    "worker",
                    "-l",
                    "info",
                    "--without-web",
                ],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def wait_ready(self, timeout_s: float = 90) -> None:
        """Wait for Faust's "Worker: Ready" (recovery done, streams seeked).

        Records that arrive while Faust starts can be delivered twice: its fetcher
        resumes before it seeks the streams to the committed offsets (seen here with
        faust-streaming 0.15.3). That is one more reason cronlog's ledger does not rest on
        Faust's at-least-once processing; this test is about table recovery, so it
        sends only once the worker is ready.
        """
        marker = f"[{self.proc.pid}] [INFO] [^Worker]: Ready"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"Faust exited with {self.proc.returncode}; log: {self.log}")
            if marker in self.log.read_text(errors="replace"):
                return
            time.sleep(0.2)
        raise AssertionError(f"Faust was not ready after {timeout_s} s; log: {self.log}")

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"Faust did not stop on SIGTERM; log: {self.log}") from None


@pytest.fixture
def faust_log(tmp_path: Path) -> Iterator[Path]:
    log = tmp_path / "faust.log"
    yield log
    if log.exists():
        sys.stderr.write(log.read_text()[-4000:])


def _send(settings: Settings, keys: list[str]) -> None:
    producer = Producer({"bootstrap.servers": settings.kafka})
    for key in keys:
        producer.produce(settings.topic("commands"), key=key.encode(), value=b"tick")
    assert producer.flush(30) == 0


def _latest_counts(settings: Settings, expected: int) -> dict[str, int]:
    reader = consumer(settings, "run-events")
    try:
        messages = drain(reader, expected, timeout_s=90, settle_s=1.0)
    finally:
        reader.close()
    latest: dict[str, int] = {}
    for msg in sorted(messages, key=lambda m: (m.partition(), m.offset())):
        latest[(msg.key() or b"").decode()] = int(msg.value() or b"0")
    return latest


def test_table_survives_a_restart(topics: Settings, faust_log: Path) -> None:
    first = FaustProcess(topics, faust_log)
    try:
        first.wait_ready()
        _send(topics, ["a"] * 5 + ["b"] * 3)
        assert _latest_counts(topics, 8) == {"a": 5, "b": 3}
    finally:
        assert first.stop() == 0

    changelog = f"{topics.topic_prefix}counter-counts-changelog"
    assert (
        changelog in AdminClient({"bootstrap.servers": topics.kafka}).list_topics(timeout=10).topics
    )

    second = FaustProcess(topics, faust_log)
    try:
        second.wait_ready()
        _send(topics, ["a", "b", "c"])
        # 8 earlier outputs + 3 new: the table was rebuilt from the changelog, so the
        # counts continue instead of restarting at 1.
        assert _latest_counts(topics, 11) == {"a": 6, "b": 4, "c": 1}
    finally:
        assert second.stop() == 0

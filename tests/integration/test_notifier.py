"""`cronlog notifier` against real processes: a scheduler node, a worker and the notifier
on the real broker, calling a real HTTP receiver in the test.

- Exactly one delivery id per failed run, across a SIGKILL of the notifier: receivers
  dedupe by it; every failed run is delivered at least once.
- A receiver that answers 500 is called `--max-attempts` times, then the notification is
  in notifications.dlq with its body and last error.
- A run its worker cannot place (more CPU than any worker offers) is reported late once
  its `sla_s` has passed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import pytest

from schemas.records import FINAL_STATES
from streams.settings import Settings
from tests.support.kafka import consumer, drain
from tests.support.nodes import (
    CronlogProcess,
    EventReader,
    Node,
    WorkerProc,
    committed_past,
    job,
    runs_by_id,
    send_commands,
    stop_all,
)
from tests.support.waiting import eventually, until_passes

ATTEMPTS = 3


class Receiver:
    """An HTTP receiver: /ok answers 200, /fail 500; every call is recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []  # (path, delivery id, body)
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = orjson.loads(self.rfile.read(length))
                with receiver.lock:
                    receiver.calls.append(
                        (self.path, self.headers.get("X-Cronlog-Delivery", ""), body)
                    )
                self.send_response(200 if self.path == "/ok" else 500)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def received(self, path: str, kind: str) -> list[tuple[str, dict[str, Any]]]:
        with self.lock:
            return [(d, b) for p, d, b in self.calls if p == path and b["kind"] == kind]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()


def _at(seconds: float) -> str:
    moment = datetime.now(UTC) + timedelta(seconds=seconds)
    return moment.replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _notifier(settings: Settings, logs: Path, *allowed: str) -> CronlogProcess:
    """The notifier, allowed to reach the test's receiver on loopback (`allowed`; by
    default it would refuse it)."""
    args = ["notifier", "--max-attempts", str(ATTEMPTS), "--backoff-s", "0.2"]
    args += [arg for each in allowed for arg in ("--allow-destination", each)]
    return CronlogProcess(settings, "notifier", logs, [*args, "--loglevel", "info"])


def test_webhooks_once_per_failure_across_a_kill_retries_then_dead_letters(
    topics: Settings, tmp_path: Path, receiver: Receiver
) -> None:
    ok = {"url": f"{receiver.url}/ok", "on": ["failed"]}
    node = Node(topics, "nt-n1", tmp_path).start()
    worker = WorkerProc(topics, "nt-w1", tmp_path, cpu=2, memory_mb=512).start()
    notifier = _notifier(topics, tmp_path, "127.0.0.1/32").start()
    events = EventReader(topics, "nt-events")
    try:
        send_commands(
            topics,
            [
                job("nt-fail", ["false"], owner="team-n", schedule={"every": "1s"}, notify=ok),
                job(
                    "nt-late",
                    ["true"],
                    owner="team-n",
                    schedule={"at": _at(3)},
                    resources={"cpu": 64},  # no worker offers it: never starts
                    sla_s=1,
                    notify={"url": f"{receiver.url}/ok", "on": ["late"]},
                ),
            ],
        )

        def failed(job_id: str) -> dict[str, int]:
            """Its runs that failed (a `lost` failure, its worker declared dead under a
            loaded machine, is another kind, which this route does not ask for), by event
            id, with when the ledger wrote each."""
            return {
                e.event_id: written_ms
                for e, written_ms in events.run_events()
                if e.job_id == job_id and e.state == "failed" and not e.reason.startswith("lost")
            }

        def failed_ids(job_id: str) -> set[str]:
            return set(failed(job_id))

        eventually(lambda: len(receiver.received("/ok", "failed")) >= 3, "three deliveries")
        notifier.kill()  # SIGKILL mid-stream: deliveries in flight, offsets not committed
        killed_ms = int(time.time() * 1000)
        # Failures go on meanwhile: three written after the kill, which no notifier read.
        events.wait_until(
            lambda: sum(ms > killed_ms for ms in failed("nt-fail").values()) >= 3,
            60,
            "failures while the notifier is down",
        )
        notifier = _notifier(topics, tmp_path, "127.0.0.1/32").start()
        # Fired after the restart, so its calls are all this notifier's.
        refuse = {"url": f"{receiver.url}/fail", "on": ["failed"]}
        send_commands(
            topics,
            [job("nt-refuse", ["false"], owner="team-n", schedule={"at": _at(2)}, notify=refuse)],
        )
        eventually(lambda: len(receiver.received("/ok", "failed")) >= 8, "more deliveries")
        send_commands(topics, [{"type": "job.pause", "job_id": "nt-fail"}])

        # Every failed run of nt-fail delivered, and nothing else.
        differ: list[object] = []

        def all_delivered() -> bool:
            events.poll_for(0.5)
            got = {d for d, _ in receiver.received("/ok", "failed")}
            want = failed_ids("nt-fail")
            differ[:] = [sorted(want - got)[:5], sorted(got - want)[:5]]
            return bool(want) and got == want

        try:
            eventually(all_delivered, "a delivery for every failed run", timeout_s=90)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; not delivered, unexpected: {differ}") from None
        # Anything more that might come (it must not) has come once: the pause is decided
        # (no new run of nt-fail), every run of nt-fail has ended (no event of it follows),
        # and the notifier's group committed past every event read, which it does only
        # once each one's notifications are settled (the receiver records a call before
        # it answers) and which it reads again only after a rebalance (there is none).
        events.settle()
        events.wait_until(
            lambda: all(
                evs[-1].state in FINAL_STATES
                for evs in runs_by_id(events).values()
                if evs[0].job_id == "nt-fail"
            ),
            60,
            "every run of nt-fail ended",
        )
        until_passes(
            partial(committed_past, topics, "notifier", "run-events", dict(events.after_last))
        )
        deliveries = receiver.received("/ok", "failed")
        ids = [d for d, _ in deliveries]
        assert set(ids) == failed_ids("nt-fail")
        for delivery_id, body in deliveries:
            assert body["delivery_id"] == delivery_id
            assert body["job_id"] == "nt-fail"
            assert body["owner"] == "team-n"
            assert delivery_id.startswith(body["run_id"] + "#")
        one_per_run = {b["run_id"] for _, b in deliveries}
        assert len(one_per_run) == len(set(ids))  # one delivery id per failed run
        print(
            f"failed runs {len(set(ids))}, calls {len(ids)} "
            f"(repeated after the kill: {len(ids) - len(set(ids))})"
        )

        # The refusing receiver: ATTEMPTS calls with one delivery id, then the DLQ.
        events.wait_until(lambda: failed_ids("nt-refuse"), 60, "nt-refuse to fail")
        (refused_id,) = failed_ids("nt-refuse")
        eventually(lambda: len(receiver.received("/fail", "failed")) >= ATTEMPTS, "the retries")
        dlq = consumer(topics, "notifications.dlq")
        letters = [orjson.loads(m.value() or b"") for m in drain(dlq, 1, timeout_s=30, to_end=True)]
        letters = [d for d in letters if d["body"]["job_id"] == "nt-refuse"]
        dlq.close()
        assert [(d["delivery_id"], d["attempts"], d["error"]) for d in letters] == [
            (refused_id, ATTEMPTS, "HTTP 500")
        ]
        assert letters[0]["url"] == f"{receiver.url}/fail"
        assert letters[0]["body"]["run_id"] == refused_id.split("#")[0]
        calls = receiver.received("/fail", "failed")
        assert [d for d, _ in calls] == [refused_id] * ATTEMPTS

        # Late: never started, reported once with the run's stable id.
        late = eventually(lambda: receiver.received("/ok", "late"), "the late run")
        assert {d for d, _ in late} == {f"{late[0][1]['run_id']}:late"}
        assert late[0][1]["job_id"] == "nt-late"
        assert late[0][1]["state"] == "not started"
    finally:
        events.close()
        stop_all((notifier, worker, node))


def test_webhooks_aimed_inside_are_refused_and_dead_lettered(
    topics: Settings, tmp_path: Path, receiver: Receiver
) -> None:
    """An owner aims webhooks at loopback (a service beside the notifier), at the cloud
    metadata address and at a name that resolves to loopback: nothing is called, each
    notification is dead-lettered at once with the reason, and a public route (none
    reachable from here) is not what is refused."""
    node = Node(topics, "ns-n1", tmp_path).start()
    worker = WorkerProc(topics, "ns-w1", tmp_path, cpu=2, memory_mb=512).start()
    notifier = _notifier(topics, tmp_path).start()  # the default: public addresses only
    events = EventReader(topics, "ns-events")
    urls = {
        "ns-loopback": f"{receiver.url}/ok",
        "ns-metadata": "http://169.254.169.254/latest/meta-data/",
        "ns-localhost": f"http://localhost:{receiver.server.server_address[1]}/ok",
    }
    try:
        send_commands(
            topics,
            [
                job(n, ["false"], owner="team-s", notify={"url": u, "on": ["failed"]})
                for n, u in urls.items()
            ],
        )
        send_commands(
            topics,
            [{"type": "job.run_now", "job_id": n, "request_id": "r1"} for n in urls],
        )
        dlq = consumer(topics, "notifications.dlq")
        letters: dict[str, dict[str, Any]] = {}

        def all_refused() -> bool:
            for message in dlq.consume(100, timeout=0.5):
                letter = orjson.loads(message.value() or b"")
                if letter["body"]["job_id"] in urls:
                    letters[letter["body"]["job_id"]] = letter
            return set(letters) == set(urls)

        eventually(all_refused, "a dead letter per refused webhook", timeout_s=90)
        dlq.close()
    finally:
        events.close()
        stop_all((notifier, worker, node))
    for job_id, letter in letters.items():
        assert letter["url"] == urls[job_id]
        assert letter["attempts"] == 1  # refused, not retried
        assert letter["error"].startswith("refused: ")
    assert "(loopback)" in letters["ns-loopback"]["error"]
    assert "(link-local)" in letters["ns-metadata"]["error"]
    assert "(loopback)" in letters["ns-localhost"]["error"]
    assert receiver.calls == []

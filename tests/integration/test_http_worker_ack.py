"""The HTTP worker gateway delivers until acknowledged, on the real API and broker: a
heartbeat answer the worker never got comes again with the next heartbeat (same seqs,
same order), an acknowledged one does not; a heartbeat without `ack` keeps the older
hand-over-once behaviour; an API restarted (or an inbox forgotten) rebuilds the inbox
from worker-inbox after the worker's ack; an inbox is bounded. Inbox messages are
produced straight to worker-inbox, as the ledger and the dispatchers write them."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer

from connectors.api.service import Service
from connectors.api.worker_gateway import WorkerGateway, _Inbox, inbox_partition
from schemas.codec import WORKER_INBOX
from schemas.records import (
    CancelOrder,
    ClaimReply,
    DispatchRequest,
    WorkerAssignment,
    WorkerMessage,
)
from schemas.spec import Resources
from streams.kafka import producer_config
from streams.settings import Settings
from tests.support.nodes import CronlogProcess
from tests.support.ports import free_port
from tests.support.waiting import eventually

W = {"Authorization": "Bearer tok-w-0123456789ab"}
KINDS = ("assignments", "grants", "kills")


class Api:
    """`cronlog api` as a real process, restartable on the same port."""

    def __init__(self, settings: Settings, logs: Path):
        self.settings = settings
        self.port = free_port()
        self.proc = CronlogProcess(
            settings,
            "api",
            logs,
            ["api", "--port", str(self.port), "--loglevel", "warning"],
            # An admin token may act as any worker (a worker token names one worker).
            extra_env={"CRONLOG_API_ADMIN_TOKENS": "tok-w-0123456789ab"},
        )
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=60)
        self.producer = Producer(producer_config(settings))

    def start(self) -> None:
        self.proc.start()

        def healthy() -> bool:
            try:
                return self.client.get("/readyz").status_code == 200
            except httpx.TransportError:
                return False

        eventually(healthy, "the API to be ready")
        # The gateway follows worker-inbox from its end: wait until it follows every
        # partition, so that a message produced from now on reaches an inbox.
        for partition in range(self.settings.partitions):
            worker = next(
                f"warm-{partition}-{i}"
                for i in itertools.count()
                if inbox_partition(f"warm-{partition}-{i}", self.settings.partitions) == partition
            )
            seq: int = self.beat(worker, 0)["seq"]
            self.send(kill(worker, f"warm@{partition}"))

            def arrived(worker: str = worker, seq: int = seq) -> bool:
                return bool(self.messages(self.beat(worker, seq)))

            eventually(arrived, f"the gateway to follow partition {partition}")

    def stop(self) -> None:
        self.proc.stop()

    def send(self, *messages: WorkerMessage) -> None:
        for message in messages:
            self.producer.produce(
                self.settings.topic("worker-inbox"),
                key=message.worker_id.encode(),
                value=WORKER_INBOX.encode(message),
            )
        assert self.producer.flush(30) == 0

    def beat(self, worker_id: str, ack: int | None) -> dict[str, Any]:
        body: dict[str, Any] = {"capacity": {"cpu": 1, "memory_mb": 256}}
        if ack is not None:
            body["ack"] = ack
        answer = self.client.post(f"/workers/{worker_id}/heartbeat", json=body, headers=W)
        assert answer.status_code == 200, answer.text
        return answer.json()  # type: ignore[no-any-return]

    @staticmethod
    def messages(answer: dict[str, Any]) -> list[tuple[int, str, str]]:
        """(seq, kind, run_id) of an answer's messages, in seq order."""
        return sorted((m["seq"], kind, m["run_id"]) for kind in KINDS for m in answer[kind])


@pytest.fixture(scope="module")
def api(topics: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    server = Api(topics, tmp_path_factory.mktemp("http-ack"))
    server.start()
    try:
        yield server
    finally:
        server.client.close()
        server.stop()


def kill(worker_id: str, run_id: str) -> CancelOrder:
    return CancelOrder(worker_id, run_id, 1, "cancelled by request", int(time.time() * 1000))


def grant(worker_id: str, run_id: str) -> ClaimReply:
    return ClaimReply(worker_id, run_id, 1, True, "", int(time.time() * 1000))


def assign(worker_id: str, run_id: str) -> WorkerAssignment:
    now = int(time.time() * 1000)
    job_id = run_id.partition("@")[0]
    dispatch = DispatchRequest(
        run_id, job_id, 1, "team-a", ("true",), (), Resources(cpu=0.1), 60.0, 0, now, now, now
    )
    return WorkerAssignment(worker_id, now, dispatch)


def test_a_lost_answer_comes_again_and_an_acked_one_does_not(api: Api) -> None:
    start = api.beat("lossy", 0)
    assert api.messages(start) == []
    api.send(grant("lossy", "j@1"), kill("lossy", "j@2"), assign("lossy", "j@3"))
    # The first answer with the three messages is "lost": the worker never saw it, so
    # its next heartbeat acknowledges only what it had before.
    lost = eventually(
        lambda: len(api.messages(a := api.beat("lossy", start["seq"]))) == 3 and a,
        "the three messages",
    )
    first = api.messages(lost)
    assert [(kind, run) for _, kind, run in first] == [
        ("grants", "j@1"),
        ("kills", "j@2"),
        ("assignments", "j@3"),
    ]
    assert lost["seq"] >= first[-1][0]
    assert lost["assignments"][0]["command"] == ["true"]
    again = api.beat("lossy", start["seq"])
    assert api.messages(again) == first  # the same messages, seqs and order
    assert again["seq"] == lost["seq"]

    # Acknowledged: gone for good, and what comes next comes alone.
    acked = api.beat("lossy", lost["seq"])
    assert api.messages(acked) == []
    assert acked["seq"] >= lost["seq"]
    assert api.messages(api.beat("lossy", acked["seq"])) == []
    api.send(kill("lossy", "j@4"))
    later = eventually(
        lambda: api.messages(a := api.beat("lossy", acked["seq"])) and a, "the next stop order"
    )
    assert [(kind, run) for _, kind, run in api.messages(later)] == [("kills", "j@4")]
    assert api.messages(later)[0][0] > lost["seq"]
    assert api.messages(api.beat("lossy", later["seq"])) == []


def test_a_partial_ack_keeps_what_came_after(api: Api) -> None:
    start = api.beat("partial", 0)
    api.send(kill("partial", "p@1"), kill("partial", "p@2"))
    both = eventually(
        lambda: len(api.messages(a := api.beat("partial", start["seq"]))) == 2 and a,
        "two stop orders",
    )
    (seq1, _, _), second = api.messages(both)
    assert api.messages(api.beat("partial", seq1)) == [second]


def test_without_ack_an_answer_is_handed_over_once(api: Api) -> None:
    """The older protocol (no `ack` in the body): at most once, as before."""
    assert set(api.beat("legacy", None)) == set(KINDS)  # no "seq": as before
    api.send(kill("legacy", "l@1"))
    got = eventually(lambda: api.messages(api.beat("legacy", None)), "the stop order")
    assert [(kind, run) for _, kind, run in got] == [("kills", "l@1")]
    assert api.messages(api.beat("legacy", None)) == []


def test_a_bad_ack_is_refused(api: Api) -> None:
    for bad in (-1, "3", True, 1.5, 2**63):
        answer = api.client.post(
            "/workers/bad/heartbeat", json={"capacity": {"cpu": 1}, "ack": bad}, headers=W
        )
        assert answer.status_code == 422, (bad, answer.text)
        assert answer.json()["error"]["field"] == "ack"


def test_an_ack_beyond_the_end_of_worker_inbox_is_ignored(api: Api) -> None:
    """A worker holding an ack from a recreated topic must not lose new messages."""
    answer = api.beat("future", 10**15)
    assert answer["seq"] < 10**15
    api.send(kill("future", "f@1"))
    got = eventually(lambda: api.messages(api.beat("future", answer["seq"])), "the stop order")
    assert [(kind, run) for _, kind, run in got] == [("kills", "f@1")]


def test_a_restarted_api_rebuilds_the_inbox_from_the_ack(api: Api) -> None:
    start = api.beat("survivor", 0)
    api.send(grant("survivor", "s@1"))
    handled = eventually(
        lambda: api.messages(a := api.beat("survivor", start["seq"])) and a, "the grant"
    )
    api.send(kill("survivor", "s@2"))
    # Given with the next answer, which the worker never gets: the API restarts.
    eventually(lambda: api.messages(api.beat("survivor", handled["seq"])), "the stop order (lost)")
    api.stop()
    api.send(assign("survivor", "s@3"))  # while no API runs
    api.start()

    rebuilt = api.beat("survivor", handled["seq"])
    assert [(kind, run) for _, kind, run in api.messages(rebuilt)] == [
        ("kills", "s@2"),
        ("assignments", "s@3"),
    ]
    assert rebuilt["seq"] >= api.messages(rebuilt)[-1][0]
    assert api.messages(api.beat("survivor", handled["seq"])) == api.messages(rebuilt)
    assert api.messages(api.beat("survivor", rebuilt["seq"])) == []


def test_a_inbox_is_bounded_and_answers_are_batched(
    topics: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """In process (no HTTP): a worker that never acks keeps only the newest messages,
    with a log line; an answer carries at most max_answer messages and a seq that
    acknowledges only those."""
    gateway = WorkerGateway(Service(topics))
    gateway.max_pending, gateway.max_answer = 5, 2
    box = _Inbox(0)
    box.ready.set()
    gateway.inboxes["slow"] = box
    with caplog.at_level(logging.WARNING, logger="cronlog.api.workers"):
        for offset in range(8):
            gateway.deliver(0, offset, WORKER_INBOX.encode(kill("slow", f"b@{offset}")))
    assert box.seqs == [4, 5, 6, 7, 8]
    assert box.dropped == 3
    assert "worker slow has 5 unacknowledged messages: dropped the oldest (seq 1" in caplog.text
    first = gateway.answer(box, 0)
    assert [k["seq"] for k in first["kills"]] == [4, 5]
    assert first["seq"] == 5
    second = gateway.answer(box, 0)
    assert second == first  # not acknowledged: the same again
    box.ack(first["seq"])
    third = gateway.answer(box, first["seq"])
    assert [k["seq"] for k in third["kills"]] == [6, 7]
    box.ack(third["seq"])
    last = gateway.answer(box, third["seq"])
    assert [k["seq"] for k in last["kills"]] == [8]
    assert last["seq"] == 8
    gateway.deliver(0, 3, WORKER_INBOX.encode(kill("slow", "b@late")))
    assert box.seqs == [8]  # an acknowledged seq is not taken again

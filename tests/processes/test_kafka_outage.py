"""The pieces that let the node's loops ride out a broker outage (streams/kafka.py): the
watchdog on client calls that can hang, retry-until-done, and the stuck-group watch.
A closed loopback port stands for a broker that is down (the watch on a broker that
answers is in tests/integration/test_kafka_clients.py)."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from confluent_kafka import KafkaError, KafkaException

from streams.kafka import GroupWatch, Hung, bounded, broker_answers, until_done, wait_for_broker
from streams.settings import Settings


def _down() -> Settings:
    """Settings pointing at a loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return Settings(kafka=f"127.0.0.1:{port}")


def test_bounded_returns_the_result_and_raises_the_error() -> None:
    assert bounded(lambda: 42, 5, "answer") == 42
    with pytest.raises(KafkaException):
        bounded(lambda: (_ for _ in ()).throw(KafkaException(KafkaError(KafkaError._FAIL))), 5, "x")


def test_bounded_abandons_a_call_that_hangs() -> None:
    release = threading.Event()
    started = time.monotonic()
    with pytest.raises(Hung, match="send_offsets"):
        bounded(lambda: release.wait(60), 0.3, "send_offsets")
    assert time.monotonic() - started < 5  # did not wait for the call
    release.set()


def test_until_done_retries_transient_errors_and_not_fatal_ones() -> None:
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise KafkaException(KafkaError(KafkaError._ALL_BROKERS_DOWN))
        return "ok"

    assert until_done(flaky, "flaky", sleep_s=0.01) == "ok"
    assert len(calls) == 3

    def fatal() -> None:
        raise KafkaException(KafkaError(KafkaError._FENCED, fatal=True))

    with pytest.raises(KafkaException):
        until_done(fatal, "fatal", sleep_s=0.01)


def test_until_done_gives_up_when_stopped() -> None:
    stop = threading.Event()

    def down() -> None:
        stop.set()
        raise KafkaException(KafkaError(KafkaError._TRANSPORT))

    assert until_done(down, "down", stop, sleep_s=0.01) is None


def test_waiting_for_a_broker_that_is_down_says_so_and_stops_on_request(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = _down()
    assert not broker_answers(settings, 0.5)
    stop = threading.Event()
    threading.Timer(1.5, stop.set).start()
    with caplog.at_level("WARNING", logger="cronlog.kafka"):
        assert wait_for_broker(settings, "node x", stop) is False
    assert "node x: waiting for the broker at " + settings.kafka in caplog.text


def _stats(state: str, join_state: str) -> str:
    return json.dumps({"cgrp": {"state": state, "join_state": join_state}})


def test_group_watch_flags_a_group_left_unjoined_only_while_the_broker_is_down() -> None:
    watch = GroupWatch(_down(), "scheduler x", stuck_after_s=0.2, check_every_s=0.1)
    stats = watch.config()["stats_cb"]
    stats(_stats("up", "steady"))
    assert watch.since is None
    assert not watch.stuck()
    stats(_stats("up", "wait-join"))
    assert watch.since is not None
    assert not watch.stuck()  # not for long yet
    time.sleep(0.3)
    # Out of the group for long, but the broker does not answer: waiting, not stuck.
    before = time.monotonic()
    assert not watch.stuck()
    assert watch.since is not None
    assert watch.since >= before  # the clock restarted: it counts from the broker's return
    stats(_stats("up", "steady"))
    assert watch.since is None

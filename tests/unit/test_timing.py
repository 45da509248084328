"""The timing budget (streams/core/timing.py): every inequality holds with its margin, a
default that breaks one is caught, and the code takes its defaults from the one record
(the worker, the dispatcher, the Kafka clients, the ledger, the CLI and the local
cluster's broker settings)."""

from __future__ import annotations

import inspect
import re
from dataclasses import replace
from pathlib import Path

import pytest

from connectors.cli import processes
from connectors.worker.worker import WorkerConfig
from streams import kafka
from streams.core.ledger import LedgerConfig
from streams.core.liveness import Liveness
from streams.core.placement import Capacity
from streams.core.timing import TIMING, Check, Timing
from streams.dispatcher_kernel import DispatcherConfig
from streams.groups import group_settings

BROKER_PROPERTIES = Path(__file__).parents[2] / "compose" / "kafka" / "server.properties.in"


@pytest.mark.parametrize("check", TIMING.checks(), ids=lambda c: c.name)
def test_every_inequality_holds_with_its_margin(check: Check) -> None:
    assert check.holds, (
        f"{check.name}: {check.left_s:g} s + {check.margin_s:g} s > {check.right_s:g} s "
        f"({check.why})"
    )


@pytest.mark.parametrize(
    ("change", "broken"),
    [
        ({"lease_s": 6.0}, "lease outlives a broker failover"),
        ({"broker_session_s": 6.0}, "lease outlives a broker failover"),
        ({"dead_after_s": 8.0}, "the verdict follows the lease"),
        ({"heartbeat_s": 3.0}, "every moment is covered by a beat's window"),
        ({"suspect_after_s": 3.0}, "a slow beat is not suspicion"),
        ({"lead_s": 5.0}, "the lead covers a broker failover"),
        ({"claim_timeout_s": 15.0}, "a claim deadline is a last resort"),
        ({"transaction_timeout_s": 5.0}, "a zombie's transaction ends with its session"),
    ],
)
def test_a_default_that_breaks_an_inequality_is_caught(
    change: dict[str, float], broken: str
) -> None:
    failing = {c.name for c in replace(TIMING, **change).checks() if not c.holds}
    assert broken in failing


def test_the_checks_are_named_once() -> None:
    names = [c.name for c in Timing().checks()]
    assert len(names) == len(set(names))


def test_the_worker_and_the_detector_take_the_budget() -> None:
    worker = WorkerConfig("w", Capacity(1.0, 1, 0))
    assert (worker.heartbeat_s, worker.ack_window_s, worker.lease_s) == (
        TIMING.heartbeat_s,
        TIMING.ack_window_s,
        TIMING.lease_s,
    )
    assert (worker.fence_grace_s, worker.max_gap_s) == (TIMING.kill_grace_s, TIMING.executor_gap_s)
    dispatcher = DispatcherConfig()
    assert (dispatcher.suspect_after_s, dispatcher.dead_after_s) == (
        TIMING.suspect_after_s,
        TIMING.dead_after_s,
    )
    assert dispatcher.lease_bound_ms == 1000 * (TIMING.lease_s + TIMING.lease_bound_margin_s)
    assert (Liveness().suspect_after_s, Liveness().dead_after_s) == (
        TIMING.suspect_after_s,
        TIMING.dead_after_s,
    )


def test_the_clients_the_ledger_and_the_cli_take_the_budget() -> None:
    assert group_settings() == {
        "consumer.session.timeout.ms": str(int(1000 * TIMING.consumer_session_s)),
        "consumer.heartbeat.interval.ms": str(int(1000 * TIMING.consumer_heartbeat_s)),
    }
    assert 1000 * TIMING.transaction_timeout_s == kafka.TRANSACTION_TIMEOUT_MS
    assert LedgerConfig().claim_timeout_ms == 1000 * TIMING.claim_timeout_s
    scheduler = inspect.signature(processes.scheduler).parameters
    assert scheduler["lead_s"].default == TIMING.lead_s
    worker = inspect.signature(processes.worker).parameters
    assert worker["heartbeat_s"].default == TIMING.heartbeat_s


def test_the_local_brokers_fence_a_dead_broker_within_the_budget() -> None:
    text = BROKER_PROPERTIES.read_text()

    def setting(name: str) -> float:
        found = re.search(rf"^{re.escape(name)}=(\d+)$", text, re.MULTILINE)
        assert found is not None, f"{name} is not set in {BROKER_PROPERTIES.name}"
        return int(found.group(1)) / 1000

    assert setting("broker.session.timeout.ms") == TIMING.broker_session_s
    assert setting("broker.heartbeat.interval.ms") == TIMING.broker_heartbeat_s
    assert setting("controller.quorum.fetch.timeout.ms") == TIMING.quorum_fetch_timeout_s
    assert setting("controller.quorum.election.timeout.ms") == TIMING.quorum_election_timeout_s


def test_the_local_brokers_give_every_group_the_budgets_session() -> None:
    text = BROKER_PROPERTIES.read_text()
    for key, value in group_settings().items():
        found = re.search(rf"^group\.{re.escape(key)}=(\d+)$", text, re.MULTILINE)
        assert found is not None, f"group.{key} is not set in {BROKER_PROPERTIES.name}"
        assert found.group(1) == value

"""Prometheus metrics and health on every process (streams/metrics.py), scraped from
real processes: a scheduler node and its ledger process, a worker, the projector; and
the same processes' `--log-format json` (streams/logs.py)."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import orjson
import psycopg
import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from schemas.records import FINAL_STATES
from streams.metrics import MetricsServer
from streams.settings import Settings
from tests.support.nodes import (
    CronlogProcess,
    EventReader,
    WorkerProc,
    job,
    runs_by_id,
    send_commands,
    stop_all,
)
from tests.support.ports import free_ports
from tests.support.waiting import eventually


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


def samples(text: str) -> list[Sample]:
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def value(text: str, name: str, **labels: str) -> float:
    return sum(
        s.value
        for s in samples(text)
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def test_the_server_answers_metrics_health_and_readiness() -> None:
    registry = CollectorRegistry()
    Counter("cronlog_test_things_total", "Things.", registry=registry).inc(3)
    why: list[str | None] = ["catching up"]
    server = MetricsServer(0, [registry], lambda: why[0], host="127.0.0.1").start()
    try:
        status, text = get(server.port, "/metrics")
        assert status == 200
        assert value(text, "cronlog_test_things_total") == 3
        assert value(text, "process_cpu_seconds_total") > 0  # the process's own
        assert get(server.port, "/healthz") == (200, "ok\n")
        assert get(server.port, "/readyz") == (503, "catching up\n")
        why[0] = None
        assert get(server.port, "/readyz") == (200, "ready\n")
        assert get(server.port, "/nope")[0] == 404
    finally:
        server.stop()


@pytest.fixture
def processes(topics: Settings, tmp_path: Path) -> Iterator[dict[str, int]]:
    """The ports of each process; their logs (JSON lines) under tmp_path."""
    node_port, worker_port, projector_port = free_ports(3, span=2)  # the node's + 1: its ledger's
    ports = {"node": node_port, "worker": worker_port, "projector": projector_port}
    ports["ledger"] = node_port + 1
    node = CronlogProcess(
        topics,
        "m-node",
        tmp_path,
        [
            "scheduler",
            "--node-id",
            "m-node",
            "--metrics-port",
            str(ports["node"]),
            "--log-format",
            "json",
        ],
    )
    worker = WorkerProc(
        topics,
        "m-worker",
        tmp_path,
        cpu=4,
        memory_mb=4096,
        # The port and the log format from the environment, this time.
        extra_env={"CRONLOG_METRICS_PORT": str(ports["worker"]), "CRONLOG_LOG_FORMAT": "json"},
    )
    worker.argv += ["--executor", "noop", "--loglevel", "info"]  # the last one counts
    projector = CronlogProcess(
        topics, "m-projector", tmp_path, ["projector", "--metrics-port", str(ports["projector"])]
    )
    started = [node.start(), worker.start(), projector.start()]
    yield ports
    stop_all(started)


def test_every_process_is_scraped_and_the_lateness_histogram_counts_every_start(
    topics: Settings, processes: dict[str, int], tmp_path: Path
) -> None:
    for name, port in processes.items():

        def ready(port: int = port) -> bool:
            return get(port, "/readyz")[0] == 200

        eventually(ready, f"{name} ready", 120)
        assert get(port, "/healthz")[0] == 200, name
    jobs = [f"m-{i}" for i in range(3)]
    send_commands(
        topics,
        [job(j, ["true"], schedule={"every": "1s"}, owner="team-m") for j in jobs],
    )
    events = EventReader(topics, "metrics-check")

    def started_runs() -> set[str]:
        return {
            run_id
            for run_id, evs in runs_by_id(events).items()
            if evs[0].job_id in jobs and any(e.state == "running" and e.attempt == 1 for e in evs)
        }

    try:
        events.wait_until(lambda: len(started_runs()) >= 12, 60, "a dozen runs started")
        send_commands(topics, [{"type": "job.pause", "job_id": j} for j in jobs])
        # Paused (decided: no run of them is made after), and every run made ended.
        events.settle()
        events.wait_until(
            lambda: all(
                evs[-1].state in FINAL_STATES
                for evs in runs_by_id(events).values()
                if evs[0].job_id in jobs
            ),
            60,
            "every run of the paused jobs ended",
        )
        started = started_runs()
        succeeded = {
            run_id
            for run_id, evs in runs_by_id(events).items()
            if evs[0].job_id in jobs and evs[-1].state == "succeeded"
        }
    finally:
        events.close()
    _, worker = get(processes["worker"], "/metrics")
    assert value(worker, "cronlog_run_start_lateness_seconds_count", owner="team-m") == len(started)
    assert value(worker, "cronlog_worker_reports_total", kind="started") == len(started)
    assert value(worker, "cronlog_worker_capacity", resource="cpu") == 4

    def projected() -> bool:
        _, text = get(processes["projector"], "/metrics")
        return value(text, "cronlog_runs_finished_total", state="succeeded") == len(succeeded)

    eventually(projected, "the projector's count of succeeded runs", 60)
    _, text = get(processes["projector"], "/metrics")
    assert {s.labels["state"] for s in samples(text) if s.name == "cronlog_runs_live"} == {
        "waiting",
        "due",
        "dispatched",
        "running",
        "retrying",
    }
    with psycopg.connect(topics.database_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM runs WHERE job_id = ANY(%s) AND state = 'succeeded'", (jobs,)
        ).fetchone()
    assert row is not None
    assert row[0] == len(succeeded)
    _, node = get(processes["node"], "/metrics")
    assert value(node, "cronlog_scheduler_proposals_total", kind="fire") >= len(started)
    assert value(node, "cronlog_scheduler_partitions", status="owned") == topics.partitions
    assert value(node, "cronlog_dispatcher_placements_total", outcome="placed") >= len(started)
    assert value(node, "cronlog_ingress_commands_total", outcome="accepted") >= 2 * len(jobs)
    # Capacity reserved by the dispatcher, per resource, never negative.
    reserved = {
        s.labels["resource"]: s.value
        for s in samples(node)
        if s.name == "cronlog_dispatcher_reserved"
    }
    assert set(reserved) == {"cpu", "memory_mb", "gpu"}
    assert all(v >= 0 for v in reserved.values())
    _, ledger = get(processes["ledger"], "/metrics")
    assert value(ledger, "cronlog_ledger_partitions") == topics.partitions
    # Each started run: at least its claim, its start and its finish were applied.
    applied = value(ledger, "cronlog_ledger_decisions_total", outcome="applied")
    assert applied >= 3 * len(started)
    assert value(ledger, "cronlog_ledger_transaction_seconds_count") > 0
    # Consumer lag per component: the jobs are paused, so each reads to the end (the
    # gauge is set at most every 5 s).
    ports = {"ledger": "ledger", "scheduler": "node", "dispatcher": "node", "worker": "worker"}
    ports["ingress"] = "node"
    topic_of = {
        "ingress": "commands",
        "ledger": "job-log",
        "scheduler": "jobs",
        "dispatcher": "dispatch",
        "worker": "worker-inbox",
    }

    def lag(component: str) -> float | None:
        _, text = get(processes[ports[component]], "/metrics")
        found = [
            s.value
            for s in samples(text)
            if s.name == "cronlog_consumer_lag_records"
            and s.labels == {"component": component, "topic": topic_of[component]}
        ]
        return found[0] if found else None

    for component in ports:
        eventually(partial(lambda c: lag(c) == 0, component), f"{component} lag 0", 30)
    for name, port in processes.items():
        _, text = get(port, "/metrics")
        check_names(name, text)
    check_json_logs(tmp_path / "m-node.log", {"scheduler", "ledger"}, "m-node")
    check_json_logs(tmp_path / "m-worker.log", {"worker"}, "m-worker")


def check_json_logs(path: Path, components: set[str], instance: str) -> None:
    """Every line one JSON object (librdkafka's and Faust's included), from each of
    these components, with the node or worker id as its instance."""
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    assert lines, path
    seen = set()
    for line in lines:
        fields = orjson.loads(line)
        assert isinstance(fields, dict), line
        assert {"ts", "level", "logger", "component", "message"} <= set(fields), line
        seen.add(fields["component"])
        assert fields.get("instance") == instance, line
    assert components <= seen, (components, seen)


def check_names(process: str, text: str) -> None:
    """Prometheus conventions: the cronlog_ prefix, _total only on counters, base units,
    and no label of unbounded cardinality (job or run ids)."""
    ours = [f for f in text_string_to_metric_families(text) if f.name.startswith("cronlog_")]
    assert ours, process
    for family in ours:
        if family.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples), family
        else:
            assert not family.name.endswith("_total"), family.name
        if family.type == "histogram" and "duration" in family.documentation.lower():
            assert family.name.endswith("_seconds"), family.name
        for sample in family.samples:
            assert not {"job_id", "run_id", "worker_id"} & set(sample.labels), sample

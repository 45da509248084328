"""Run `cronlog scheduler` nodes as real subprocesses, and read what they wrote."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Self

import orjson
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from schemas.codec import RUN_EVENTS, CodecError
from schemas.records import JobEvent, RunEvent
from streams.core.timing import TIMING
from streams.kafka import consumer_config, producer_config
from streams.settings import Settings
from tests.support.secure import role_env
from tests.support.waiting import eventually, retried, until_passes

ROOT = Path(__file__).resolve().parents[2]


def env_for(settings: Settings) -> dict[str, str]:
    return {
        **os.environ,
        "CRONLOG_KAFKA": settings.kafka,
        "CRONLOG_TOPIC_PREFIX": settings.topic_prefix,
        "CRONLOG_PARTITIONS": str(settings.partitions),
        "CRONLOG_DATABASE_URL": settings.database_url,
        # The suite runs as root on CI: its workers run their (harmless) jobs as root on
        # purpose; tests/integration/test_run_as.py covers --run-as and the refusal.
        "CRONLOG_WORKER_ALLOW_ROOT": "1",
    }


def topics_create(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    """`cronlog topics create` for the module's settings, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "connectors.cli", "topics", "create", *args],
        env=env_for(settings),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


class CronlogProcess:
    """A real `cronlog ...` subprocess with its own log file."""

    def __init__(
        self,
        settings: Settings,
        name: str,
        logdir: Path,
        args: list[str],
        extra_env: dict[str, str] | None = None,
        prefix: tuple[str, ...] = (),
    ):
        """``prefix``: what runs the command (`ip netns exec NS`: another host)."""
        self.settings = settings
        self.name = name
        self.log = logdir / f"{name}.log"
        self.args = args
        self.argv = [*prefix, sys.executable, "-m", "connectors.cli", *args]
        self.extra_env = extra_env or {}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=ROOT,
                env={
                    **env_for(self.settings),
                    **role_env(self.args, self.settings),
                    **self.extra_env,
                },
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        return self

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        assert self.proc is not None
        self.proc.wait(30)

    def stop(self) -> None:
        self.ask_stop()
        self.await_stop()

    def ask_stop(self) -> None:
        """SIGTERM (after SIGCONT: a stopped process must be able to exit)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGCONT)
        self.proc.send_signal(signal.SIGTERM)

    def await_stop(self) -> None:
        """Wait for the exit `ask_stop` asked for; killed after 30 s."""
        if self.proc is None:
            return
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def last_words(self, lines: int = 40) -> str:
        """The end of this process's log: why it died, when a test finds it dead."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError as exc:
            return f"(no log: {exc})"
        return "\n".join(text.splitlines()[-lines:])


def stop_all(procs: Iterable[CronlogProcess]) -> None:
    """Stop every process of `procs` together: each takes seconds to close its clients,
    and nothing a test checks afterwards depends on their order."""
    procs = list(procs)
    for proc in procs:
        proc.ask_stop()
    for proc in procs:
        proc.await_stop()


def deaths(procs: list[CronlogProcess]) -> str:
    """Each dead process of `procs` with its exit code and the end of its log ('' if
    none died): the message of a test's "no process died on its own" check."""
    return "\n".join(
        f"--- {p.name} exited {p.proc.returncode if p.proc else None}:\n{p.last_words()}"
        for p in procs
        if not p.alive
    )


class Node(CronlogProcess):
    """A node: ingress, gate, ledger, scheduler, dispatcher. `extra_env` reaches
    the node and its children (say, libfaketime's variables to skew its clock); `args`
    are more options of `cronlog scheduler`."""

    def __init__(
        self,
        settings: Settings,
        name: str,
        logdir: Path,
        extra_env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
        prefix: tuple[str, ...] = (),
    ):
        super().__init__(
            settings,
            name,
            logdir,
            ["scheduler", "--node-id", name, "--loglevel", "warning", *args],
            extra_env,
            prefix,
        )


class ProjectorProc(CronlogProcess):
    def __init__(self, settings: Settings, log: Path):
        super().__init__(settings, log.stem, log.parent, ["projector", "--loglevel", "warning"])


def send_commands(settings: Settings, commands: list[bytes | dict[str, object]]) -> None:
    producer = Producer(producer_config(settings))
    for command in commands:
        # Keyed by job_id, as the contract asks: one job's commands stay in order.
        if isinstance(command, bytes):
            producer.produce(settings.topic("commands"), value=command)
        else:
            key = str(command.get("job_id", "")).encode() or None
            producer.produce(settings.topic("commands"), key=key, value=orjson.dumps(command))
    assert producer.flush(30) == 0


@dataclass(frozen=True)
class Seen:
    event: RunEvent | JobEvent
    written_ms: int  # Kafka timestamp: when the ledger produced it


class EventReader:
    """Follows run-events (read_committed) from the beginning."""

    def __init__(self, settings: Settings, group: str):
        self.consumer = Consumer(
            consumer_config(
                settings,
                settings.group(group),
                **{
                    "auto.offset.reset": "earliest",
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                },
            )
        )
        self.settings = settings
        self.topic = settings.topic("run-events")
        self.consumer.subscribe([self.topic])
        self.seen: list[Seen] = []
        # Per partition, the offset after the last record read (transaction markers not
        # counted): where a consumer that has handled every record read commits.
        self.after_last: dict[int, int] = {}

    def poll_for(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for msg in self.consumer.consume(1000, timeout=0.2):
                if msg.error() is not None:
                    continue
                partition, offset = msg.partition() or 0, msg.offset() or 0
                self.after_last[partition] = max(offset + 1, self.after_last.get(partition, 0))
                if msg.value():
                    try:
                        event = RUN_EVENTS.decode(msg.value() or b"")
                    except CodecError:
                        continue  # a poison record some test put there on purpose
                    self.seen.append(Seen(event, msg.timestamp()[1]))

    def wait_until(self, predicate: object, timeout_s: float, what: str) -> None:
        """Until `predicate()` holds, reading run-events for half a second between."""
        assert callable(predicate)

        def holds() -> bool:
            if predicate():
                return True
            self.poll_for(0.5)
            return False

        eventually(holds, what, timeout_s, interval_s=0)

    def wait_registered(self, job_ids: list[str], timeout_s: float = 60) -> None:
        """Until the ledger has registered every job of `job_ids` (its `upserted` event):
        what a test waits for before a request that must find the job, instead of a
        fixed sleep."""

        def registered() -> bool:
            done = {e.job_id for e in self.job_events() if e.kind == "upserted"}
            return set(job_ids) <= done

        self.wait_until(registered, timeout_s, f"{', '.join(job_ids)} registered")

    def read_to_end(self, timeout_s: float = 60) -> None:
        """Until everything run-events holds now is read: this reader's position on every
        partition at the end it has now (past a transaction's marker; a transaction still
        open is waited for)."""
        ends = retried(partial(end_offsets, self.settings, "run-events"), timeout_s)

        def at_end() -> None:
            self.poll_for(0.2)
            wanted = [TopicPartition(self.topic, p) for p, end in ends.items() if end > 0]
            behind = {
                tp.partition: (tp.offset, ends[tp.partition])
                for tp in self.consumer.position(wanted)
                if tp.offset < ends[tp.partition]
            }
            assert not behind, f"run-events not read to its end, (position, end): {behind}"

        until_passes(at_end, timeout_s, interval_s=0)

    def settle(self, timeout_s: float = 60) -> None:
        """Until everything written to the node's inputs by now is decided and its run
        events read: the ingress and gate groups committed past the ends `commands` and
        `worker-reports` have now (a relay commits a batch once it is in job-log), then the
        ledger's group past the end job-log has after that (it commits its offsets in the
        transaction of their outputs), then run-events read to its end after that. A
        positive sign that any run event those inputs cause has been seen: what a test
        waits for before it asserts that something did not happen."""
        for stage in (
            (("ingress", "commands"), ("gate", "worker-reports")),
            (("ledger", "job-log"),),
        ):
            ends = {
                topic: retried(partial(end_offsets, self.settings, topic), timeout_s)
                for _, topic in stage
            }
            for group, topic in stage:
                until_passes(
                    partial(committed_past, self.settings, group, topic, ends[topic]), timeout_s
                )
        self.read_to_end(timeout_s)

    def run_events(self) -> list[tuple[RunEvent, int]]:
        return [(s.event, s.written_ms) for s in self.seen if isinstance(s.event, RunEvent)]

    def job_events(self) -> list[JobEvent]:
        return [s.event for s in self.seen if isinstance(s.event, JobEvent)]

    def close(self) -> None:
        self.consumer.close()


def end_offsets(settings: Settings, topic: str) -> dict[int, int]:
    """The end (high watermark) of every partition of a contract topic now. Asked by a
    consumer of its own that fetches nothing: a busy one's requests wait behind its fetch."""
    name = settings.topic(topic)
    probe = Consumer(consumer_config(settings, None))
    try:
        return {
            p: probe.get_watermark_offsets(TopicPartition(name, p), 10, cached=False)[1]
            for p in range(settings.partitions)
        }
    except KafkaException as exc:  # a broker a fault test killed a moment ago: ask again
        raise AssertionError(f"the ends of {topic}: {exc}") from exc
    finally:
        probe.close()


def committed_past(settings: Settings, group: str, topic: str, ends: dict[int, int]) -> None:
    """That the node's consumer group `group` committed offsets at or past `ends` on
    every partition of `topic` that holds anything."""
    name = settings.topic(topic)
    probe = Consumer(consumer_config(settings, settings.group(group)))
    try:
        wanted = [TopicPartition(name, p) for p, end in ends.items() if end > 0]
        committed = probe.committed(wanted, timeout=10) if wanted else []
    except KafkaException as exc:  # the group's coordinator moving: ask again
        raise AssertionError(f"{group}'s committed offsets on {topic}: {exc}") from exc
    finally:
        probe.close()
    behind = {
        tp.partition: (tp.offset, ends[tp.partition])
        for tp in committed
        if tp.offset < ends[tp.partition]
    }
    assert not behind, f"{group} behind on {topic}, (committed, end): {behind}"


class WorkerProc(CronlogProcess):
    """A real `cronlog worker` process, with its state under the log folder."""

    def __init__(
        self,
        settings: Settings,
        worker_id: str,
        logdir: Path,
        cpu: float = 1,
        memory_mb: int = 512,
        gpu: int = 0,
        labels: tuple[str, ...] = (),
        heartbeat_s: float = TIMING.heartbeat_s,
        extra_env: dict[str, str] | None = None,
        prefix: tuple[str, ...] = (),
    ):
        args = [
            "worker",
            "--id",
            worker_id,
            "--cpu",
            str(cpu),
            "--memory-mb",
            str(memory_mb),
            "--gpu",
            str(gpu),
            "--heartbeat-s",
            str(heartbeat_s),
            "--loglevel",
            "warning",
            *(arg for label in labels for arg in ("--label", label)),
        ]
        super().__init__(
            settings,
            worker_id,
            logdir,
            args,
            {"CRONLOG_STATE_DIR": str(logdir / "state"), **(extra_env or {})},
            prefix,
        )
        self.worker_id = worker_id


def job(job_id: str, command: list[str], **extra: object) -> dict[str, object]:
    """A job.upsert; without a schedule it gets a far one-off, so it runs only on demand."""
    extra.setdefault("schedule", {"at": "2099-01-01T00:00:00Z"})
    return {
        "type": "job.upsert",
        "job_id": job_id,
        "owner": extra.pop("owner", "t"),
        "command": command,
        **extra,
    }


def runs_by_id(events: EventReader) -> dict[str, list[RunEvent]]:
    found: dict[str, list[RunEvent]] = {}
    for event, _ in events.run_events():
        found.setdefault(event.run_id, []).append(event)
    return found


def cli_with_only(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`cronlog ...` with only `env` beyond PATH and HOME: no Kafka or database settings
    (a user's CLI over the API, `cronlog tokens` on a file)."""
    base = {k: os.environ[k] for k in ("PATH", "HOME") if k in os.environ}
    return subprocess.run(
        [sys.executable, "-m", "connectors.cli", *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

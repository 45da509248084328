"""The soak's load (bench/soak.py): the jobs a real fleet has, and the traffic of people
on the API while it runs.

Jobs (registered on `commands`, owner `soak`); every job appends a line about itself to
its own file in the marks folder (`RUN ATTEMPT s NS` at its start, and for long jobs
`RUN ATTEMPT e NS` at their end), so the checks can see what ran, whatever the reports
say:

- `short-*`: `sh` every 1-5 s, the bulk of the firings;
- `cron-*`: a six-field cron every 2 s, each in another time zone (half-hour and
  45-minute offsets among them);
- `long-*`: `sleep` 10-45 s every 60 s, `concurrency: forbid`, only on native workers
  (label `kind=native`): the runs a fault must not kill unless it hits their worker;
- `chain-*-a/b/c`: a three-step dependency chain every 10 s;
- `flaky-*`: fails every attempt, idempotent, three attempts a second apart;
- `ctl-*`: `sh` every 2 s, paused, resumed and edited through the API while it runs
  (excluded from the missed-firing check: the ledger decides what a pause withdraws).

The API traffic (a thread): run-now of short jobs with an idempotency key, pause/resume
and edits of the `ctl-*` jobs. A command counts as acknowledged only on a 2xx answer;
the checks find each acknowledged one in the history.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.support.nodes import job

ZONES = (
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Asia/Kolkata",
    "Asia/Kathmandu",
    "Australia/Lord_Howe",
    "Pacific/Chatham",
    "America/St_Johns",
    "Asia/Tokyo",
    "America/Los_Angeles",
)
CHAINS = 4
FLAKY = 5
CTL = 8
LONG = 6


def _mark(marks: Path, end: bool = False) -> str:
    line = f'echo "$CRONLOG_RUN_ID $CRONLOG_ATTEMPT {{}} $(date +%s%N)" >> {marks}/$CRONLOG_JOB_ID'
    return line.format("e" if end else "s")


@dataclass(frozen=True)
class Load:
    """The jobs registered, by role."""

    short: list[str]
    cron: list[str]
    long: list[str]
    chains: list[list[str]]
    flaky: list[str]
    ctl: list[str]
    commands: list[dict[str, object]]

    @property
    def all_jobs(self) -> list[str]:
        heads = [j for chain in self.chains for j in chain]
        return [*self.short, *self.cron, *self.long, *heads, *self.flaky, *self.ctl]

    @property
    def scheduled(self) -> list[str]:
        """Jobs whose every firing between registration and the final pause must have
        its run (not the dependents: their runs follow their upstream's)."""
        heads = [chain[0] for chain in self.chains]
        return [*self.short, *self.cron, *self.long, *heads, *self.flaky]


def make_load(rng: random.Random, short_jobs: int, marks: Path) -> Load:
    small = {"cpu": 0.1, "memory_mb": 32}
    mark = ["sh", "-c", _mark(marks)]
    commands: list[dict[str, object]] = []
    short = [f"short-{i:04d}" for i in range(short_jobs)]
    for job_id in short:
        every = rng.choice((1, 2, 3, 4, 5))
        commands.append(job(job_id, mark, schedule={"every": f"{every}s"}, resources=small))
    cron = [f"cron-{i:02d}" for i in range(len(ZONES))]
    for job_id, zone in zip(cron, ZONES, strict=True):
        schedule = {"cron": "*/2 * * * * *", "timezone": zone}
        commands.append(job(job_id, mark, schedule=schedule, resources=small))
    long = [f"long-{i:02d}" for i in range(LONG)]
    for job_id in long:
        sleep_s = rng.randint(10, 45)
        script = f"{_mark(marks)}; sleep {sleep_s}; {_mark(marks, end=True)}"
        commands.append(
            job(
                job_id,
                ["sh", "-c", script],
                schedule={"every": "60s"},
                concurrency="forbid",
                resources={**small, "labels": {"kind": "native"}},
            )
        )
    chains = [[f"chain-{i}-{step}" for step in "abc"] for i in range(CHAINS)]
    for a, b, c in chains:
        commands.append(job(a, mark, schedule={"every": "10s"}, resources=small))
        for upstream, downstream in ((a, b), (b, c)):
            commands.append({**job(downstream, mark, resources=small), "depends_on": [upstream]})
            commands[-1].pop("schedule")
    flaky = [f"flaky-{i}" for i in range(FLAKY)]
    for job_id in flaky:
        commands.append(
            job(
                job_id,
                ["sh", "-c", f"{_mark(marks)}; exit 3"],
                schedule={"every": "5s"},
                idempotent=True,
                retry={"max_attempts": 3, "backoff_s": 1},
                resources=small,
            )
        )
    ctl = [f"ctl-{i}" for i in range(CTL)]
    for job_id in ctl:
        commands.append(job(job_id, mark, schedule={"every": "2s"}, resources=small))
    for command in commands:
        command["owner"] = "soak"
    return Load(short, cron, long, chains, flaky, ctl, commands)


@dataclass
class Traffic:
    """What people did on the API, acknowledged (2xx) or not."""

    run_now: list[str] = field(default_factory=list)  # run ids acknowledged
    # Per ctl job, its acknowledged pause/resume/edit, in order: (op, value, sent at ms).
    acked: dict[str, list[tuple[str, str, int]]] = field(default_factory=dict)
    # Jobs with a command whose answer never came: it may or may not have applied.
    unsure: set[str] = field(default_factory=set)
    refused: int = 0  # answers that were not 2xx, or no answer (the API down)


class ApiTraffic(threading.Thread):
    """About one API call a second, until stopped."""

    def __init__(self, url: str, token: str, load: Load, seed: int):
        super().__init__(daemon=True, name="soak-api-traffic")
        self.client = httpx.Client(
            base_url=url, timeout=10, headers={"Authorization": f"Bearer {token}"}
        )
        self.load = load
        self.rng = random.Random(seed)
        self.done = Traffic()
        self.paused: dict[str, bool] = dict.fromkeys(load.ctl, False)
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(self.rng.uniform(0.5, 1.5)):
            self.one()

    def stop(self) -> Traffic:
        self.halt.set()
        self.join(30)
        return self.done

    def one(self) -> None:
        roll = self.rng.random()
        if roll < 0.5:
            job_id = self.rng.choice(self.load.short)
            key = uuid.uuid4().hex[:12]
            answer = self._call("POST", f"/jobs/{job_id}/run-now", {"Idempotency-Key": key})
            if answer is not None:
                self.done.run_now.append(str(answer.json()["run_id"]))
            return
        job_id = self.rng.choice(self.load.ctl)
        sent_ms = int(time.time() * 1000)
        if roll < 0.8:
            op = "resume" if self.paused[job_id] else "pause"
            answer = self._call("POST", f"/jobs/{job_id}/{op}", {}, job_id)
            if answer is not None:
                self.paused[job_id] = op == "pause"
                self.done.acked.setdefault(job_id, []).append((op, "", sent_ms))
            return
        value = uuid.uuid4().hex[:8]
        body: dict[str, object] = {"env": {"EDIT": value}}
        answer = self._call("PATCH", f"/jobs/{job_id}", {}, job_id, body)
        if answer is not None:
            self.done.acked.setdefault(job_id, []).append(("edit", value, sent_ms))

    def _call(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        job_id: str = "",
        body: dict[str, object] | None = None,
    ) -> httpx.Response | None:
        try:
            answer = self.client.request(method, path, headers=headers, json=body)
        except httpx.HTTPError:
            self.done.refused += 1
            if job_id:
                self.done.unsure.add(job_id)
            return None
        if 200 <= answer.status_code < 300:
            return answer
        self.done.refused += 1
        if answer.status_code >= 500 and job_id:
            self.done.unsure.add(job_id)
        return None

"""Random job specs for the seeded simulation (tests/unit/test_simulation.py): every field
of `JobSpec` generated, and changed one at a time, with values that make the ledger's
rules matter within the simulation's minutes (seconds-granular cron in several zones,
bounds around now, calendars that hold the simulated day or not, low `max_runs`,
parameters with and without defaults, `{name}` placeholders in the command).

Everything here is pure and draws only from the `random.Random` it is given.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from schemas.spec import (
    AtSchedule,
    CronSchedule,
    EverySchedule,
    Exclusion,
    JobSpec,
    Notify,
    Param,
    Resources,
    RetryPolicy,
    Schedule,
)
from streams.core.secret_grants import SecretGrants

# Zones whose dates differ around the simulated time (2027-01-15T08:00Z): it is midnight
# in Los Angeles, 13:30 in Kolkata, 19:00 on Lord Howe (a half-hour DST offset).
ZONES = ("UTC", "America/Los_Angeles", "Asia/Kolkata", "Australia/Lord_Howe")
# The simulated day in UTC, the day before (backfills reach it in Los Angeles), the next.
DAYS = ("2027-01-15", "2027-01-14", "2027-01-16")
PARAMS = (
    Param("day", "string", '"2027-01-15"'),
    Param("n", "integer", "3"),
    Param("ratio", "number", None),  # required: a scheduled run cannot give it
    Param("dry", "boolean", "false"),
)
OWNERS = ("o", "p")
# Who may use the secrets specs name (the simulation's ledger config): `api-token` every
# owner, `<owner>-token` its owner alone.
GRANTS = SecretGrants.from_document({"api-token": ["*"], **{f"{o}-token": [o] for o in OWNERS}})
MANAGERS = ("", "cronlog-apply", "team-b")

# Valid and invalid values a run-now or backfill may pass (the ledger dead-letters the
# invalid ones: an undeclared name, a value of another type).
GIVEN_VALUES: tuple[tuple[tuple[str, str], ...], ...] = (
    (),
    (("ratio", "0.5"),),
    (("day", '"2027-02-01"'), ("ratio", "2")),
    (("n", "7"), ("ratio", "1")),
    (("n", '"seven"'),),  # wrong type
    (("nope", "1"),),  # undeclared
)


def schedule(rng: random.Random, now: int) -> Schedule:
    """Mostly `every` (cheap), cron with seconds in a zone now and then, bounds around
    now sometimes, a one-off (maybe already past) rarely, and none at all rarely (a
    manual job, or a step if the job has upstreams: issue 55)."""
    if rng.random() < 0.1:
        return None
    roll = rng.random()
    start = end = None
    if rng.random() < 0.25:
        start = now + rng.randint(-5_000, 20_000)
    if rng.random() < 0.2:
        end = now + rng.randint(5_000, 120_000)
    if roll < 0.65:
        return EverySchedule(rng.choice([2, 3, 5]) * 1000, start, end)
    if roll < 0.9:
        expr = rng.choice(["*/2 * * * * *", "*/3 * * * * *", "1/5 * * * * *", "0,20,40 * * * * *"])
        return CronSchedule(expr, rng.choice(ZONES), start, end)
    return AtSchedule(now + rng.randint(-5_000, 8_000))


def _params(rng: random.Random) -> tuple[Param, ...]:
    chosen = [p for p in PARAMS if rng.random() < 0.5]
    if rng.random() < 0.7:  # mostly defaults only: a scheduled run can resolve them
        chosen = [p for p in chosen if p.default is not None]
    return tuple(chosen)


def _command(rng: random.Random, params: tuple[Param, ...]) -> tuple[str, ...]:
    if not params or rng.random() < 0.3:
        return rng.choice([("true",), ("sh", "-c", "exit 0")])
    names = [p.name for p in params] + ["ratio"]  # maybe one not declared (stays as is)
    return ("run", *(f"--{n}={{{n}}}" for n in rng.sample(names, k=min(2, len(names)))))


def exclusion(rng: random.Random) -> tuple[Exclusion, ...]:
    if rng.random() < 0.5:
        return ()
    first = rng.choice(DAYS)
    return (Exclusion(rng.choice(["holidays", "freeze"]), first, first),)


# One generator per field: the value a change of that field gives (given the rng, the
# spec, now, and the other job ids of the simulation).
Gen = Callable[[random.Random, JobSpec, int, list[str]], Any]
GENERATORS: dict[str, Gen] = {
    "schedule": lambda rng, spec, now, others: schedule(rng, now),
    "command": lambda rng, spec, now, others: _command(rng, spec.params),
    "env": lambda rng, spec, now, others: rng.choice([(), (("A", "1"),), (("A", "2"), ("B", "x"))]),
    "resources": lambda rng, spec, now, others: Resources(
        cpu=rng.choice([0.0, 0.5, 2.0]),
        memory_mb=rng.choice([0, 256]),
        gpu=1 if rng.random() < 0.15 else 0,  # no worker has one: the dispatch fails
        labels=rng.choice([(), (("zone", "a"),)]),
    ),
    "timeout_s": lambda rng, spec, now, others: rng.choice([1.0, 4.0, 10.0]),
    "retry": lambda rng, spec, now, others: RetryPolicy(
        max_attempts=rng.randint(1, 3), backoff_s=1, max_backoff_s=4
    ),
    "idempotent": lambda rng, spec, now, others: not spec.idempotent,
    "depends_on": lambda rng, spec, now, others: tuple(
        sorted(rng.sample(others, k=min(len(others), rng.choice([0, 1, 1, 2]))))
    ),
    "misfire": lambda rng, spec, now, others: rng.choice(["run_all", "run_once", "skip"]),
    "concurrency": lambda rng, spec, now, others: rng.choice(["allow", "forbid", "replace"]),
    "dst": lambda rng, spec, now, others: rng.choice(["auto", "run_once", "skip", "both"]),
    "jitter_s": lambda rng, spec, now, others: rng.choice([0.0, 0.5, 2.0]),
    "priority": lambda rng, spec, now, others: rng.randint(-2, 5),
    "notify": lambda rng, spec, now, others: rng.choice(
        [None, Notify("https://hooks.example/n", ("failed",)), Notify("https://h/x", ("late",))]
    ),
    "sla_s": lambda rng, spec, now, others: rng.choice([None, 1.0, 5.0]),
    "secret_env": lambda rng, spec, now, others: rng.choice(
        [(), (("TOKEN", "api-token"),), (("TOKEN", f"{spec.owner}-token"),)]
    ),
    "managed_by": lambda rng, spec, now, others: rng.choice(MANAGERS),
    "params": lambda rng, spec, now, others: _params(rng),
    "params_in_command": lambda rng, spec, now, others: not spec.params_in_command,
    "exclude": lambda rng, spec, now, others: exclusion(rng),
    "max_runs": lambda rng, spec, now, others: rng.choice([None, None, 1, 3, 8]),
}
# Fields no generator changes, and why (the coverage guard checks this list too).
# (`owner` has none: a change of it is sent on its own, and refused: `Sim.operate`.)
FIXED = {
    "job_id": "a job's key: another id is another job (the simulation registers several, "
    "deletes and re-creates them)",
}


def fresh(rng: random.Random, job_id: str, owner: str, now: int, others: list[str]) -> JobSpec:
    """A new job: every field drawn."""
    spec = JobSpec(job_id=job_id, owner=owner, schedule=None, command=("true",))
    for name in GENERATORS:
        if name in ("command", "params_in_command"):
            continue
        spec = replace(spec, **{name: GENERATORS[name](rng, spec, now, others)})
    if not spec.depends_on and spec.schedule is None and rng.random() < 0.5:
        spec = replace(spec, schedule=EverySchedule(2000))  # mostly scheduled; else manual
    return replace(
        spec,
        command=_command(rng, spec.params),
        params_in_command=rng.random() < 0.6,
    )


def mutate(
    rng: random.Random, spec: JobSpec, now: int, others: list[str], field: str | None = None
) -> tuple[JobSpec, str]:
    """The spec with one field changed (`field`, or one drawn), and that field's name."""
    name = field or rng.choice(list(GENERATORS))
    value = GENERATORS[name](rng, spec, now, others)
    changed = replace(spec, **{name: value})
    if name == "params" and rng.random() < 0.5:  # the command follows its parameters
        changed = replace(changed, command=_command(rng, changed.params))
    return changed, name


def differing(old: JobSpec | None, new: JobSpec) -> set[str]:
    """The fields of `new` that differ from `old` (all of them for a new job)."""
    return {
        f.name
        for f in dataclasses.fields(JobSpec)
        if old is None or getattr(old, f.name) != getattr(new, f.name)
    }


def schedule_kind(schedule: Schedule, depends_on: tuple[str, ...] = ()) -> str:
    """A schedule's kind and bounds, for the coverage guard ("manual": none and no
    upstreams, run only when asked; "none": a step)."""
    if schedule is None:
        return "none" if depends_on else "manual"
    kind = type(schedule).__name__
    if isinstance(schedule, CronSchedule | EverySchedule):
        bounds = ("start" if schedule.start_ms is not None else "") + (
            "end" if schedule.end_ms is not None else ""
        )
        return f"{kind}:{bounds or 'unbounded'}"
    return kind

"""The simulation covers the whole job spec and every ledger input (issue 52): over a
handful of seeds it must vary every field of `JobSpec` and deliver every member of the
`LedgerInput` union, so that the next field or input cannot land outside it. What it
cannot meaningfully play is listed below with its reason, and the list is checked to be
still accurate (each entry still exists, and is still never played)."""

from __future__ import annotations

import dataclasses
from typing import get_args

from schemas.records import LedgerInput
from schemas.spec import JobSpec
from tests.support import simspecs
from tests.unit.test_simulation import STEPS, simulate

SEEDS = range(6)
# Inputs the simulation does not send, each with why (none today: DispatchFailed is
# the dispatcher giving up on a job that needs a GPU no worker has).
EXEMPT_INPUTS: dict[str, str] = {}


def _played() -> tuple[set[str], set[str], set[str], set[str], set[str], int]:
    varied: set[str] = set()
    kinds: set[str] = set()
    resumes: set[str] = set()
    schedules: set[str] = set()
    jobs: set[str] = set()
    prunes = 0
    for seed in SEEDS:
        sim = simulate(seed, STEPS)
        varied |= sim.varied
        kinds |= sim.kinds
        resumes |= sim.resumes
        schedules |= sim.schedule_kinds
        jobs |= set(sim.specs)
        prunes += sim.prunes
    return varied, kinds, resumes, schedules, jobs, prunes


PLAYED = None


def played() -> tuple[set[str], set[str], set[str], set[str], set[str], int]:
    global PLAYED
    if PLAYED is None:
        PLAYED = _played()
    return PLAYED


def test_every_spec_field_is_varied() -> None:
    varied, _, _, schedules, jobs, _ = played()
    fields = {f.name for f in dataclasses.fields(JobSpec)}
    assert set(simspecs.FIXED) <= fields, "an exempt field no longer exists"
    assert set(simspecs.GENERATORS) <= fields, "a generator for a field that does not exist"
    missing = fields - varied - set(simspecs.FIXED)
    assert not missing, f"the simulation never changes {sorted(missing)}"
    # The fixed one is played as documented: several jobs.
    assert len(jobs) >= 2, jobs
    # Every schedule kind, with and without bounds.
    for kind in ("CronSchedule:", "EverySchedule:", "AtSchedule", "manual"):
        assert any(k.startswith(kind) for k in schedules), (kind, schedules)
    assert any(k.endswith(("start", "end", "startend")) for k in schedules), schedules


def test_every_input_kind_is_sent() -> None:
    _, kinds, resumes, _, _, prunes = played()
    members = {t.__name__ for t in get_args(LedgerInput)}
    assert set(EXEMPT_INPUTS) <= members, "an exempt input is no longer a LedgerInput"
    assert not set(EXEMPT_INPUTS) & kinds, "an exempt input is sent after all: unlist it"
    missing = members - kinds - set(EXEMPT_INPUTS)
    assert not missing, f"the simulation never sends {sorted(missing)}"
    assert resumes == {"skip", "last", "all"}, resumes
    assert prunes > 0


def test_a_secret_of_another_owner_is_refused() -> None:
    """The grants enter the simulation's decisions: some seed sends a spec naming the
    other owner's secret, and the ledger refuses it naming the secret (`Sim.operate`;
    `check` verifies no dispatch carries a secret its owner may not use)."""
    for seed in SEEDS:
        rejections = simulate(seed, STEPS).world.rejections
        if any("-token'" in r and "may not use" in r for r in rejections):
            return
    raise AssertionError("no seed named another owner's secret")

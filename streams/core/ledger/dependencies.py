"""Dependencies between jobs: links from dependents, upstream outcomes, the gate a run
waits at until its upstreams finished (or the wait expires), and the cycle probes.

A cycle among jobs' upstreams means none of them ever runs again. The API refuses a change
that would close one, from its projection of every job; the ledger refuses it too, for
what the API cannot see (a change written to `commands` directly, two changes at once
that each close half of it). A ledger knows one job, so the check travels: each link a
change adds (and each upstream of a refused job changed again) starts a probe at that
upstream, its first hop, which every job it reaches passes on to its own upstreams, the
jobs passed listed in its trail. A probe that comes back to the job that sent it, while
that job still depends on its first hop, found a cycle: that job's change is refused
(`JobState.cycle`; its upstreams are out of effect and its runs are skipped, naming the
cycle, until it is changed again), and a refused job passes no probe on.

A probe passes each job once (a diamond of jobs does not double it): each job remembers
the probes it passed on by origin, id and first hop. The id (the `at_ms` the probe
carries) is the change's stamp, unless the first hop already started a probe of that
origin with that id or a later one (quick changes of one job share a stamp: ingress
stamps a command with the max of its time and the job's previous stamp); then it is one
after the newest the first hop started. So two probes do not share a key, and a copy
that reaches a job first, by a path its origin has since dropped or for an earlier
change, never stands in for the copy that closes the cycle. (A first hop remembers its
ids among its 32 newest probes, deleted or not: a deleted job's stub keeps them, so one
deleted and re-created gives no id again; tests/unit/test_cycle_probes.py. One that
passed 32 others since may, if its origin's stamp stood still meanwhile.)

What holds once every probe has arrived: every cycle among jobs' upstreams has a member
refused. An upstream is a job of the dependent's own owner: another owner's job is no
upstream in effect (it refuses the link, or, a placeholder when named and registered
by another owner since, has its outcomes refused: the dependent's runs are skipped when
the wait runs out, cycle or not), and no probe crosses owners, so a cycle through one is
not refused, nor need it be (`in_effect` in tests/unit/test_cycle_probes.py). The change
that last sent a probe along an edge of the cycle (the one that added it, or that
changed the job again while it was refused) sent it when every other edge of the cycle
was in place, and every member passes it on, once, to all its upstreams: it comes back
to that change's job through a first hop the job still depends on, and the job is
refused, unless another member was refused meanwhile (it passes nothing on: the cycle
is out of effect through it). Of changes that close a cycle at once, that is not always
the one decided last: the first one's probe may come back first, and its refused
job stops the other's.
"""

from __future__ import annotations

from schemas.records import (
    DependencyLinked,
    JobState,
    RunState,
    UpstreamFinished,
    UpstreamOutcome,
)
from streams.core.ids import scheduled_run_id
from streams.core.ledger.decision import MAX_PROBE_TRAIL, MAX_PROBES_KEPT
from streams.core.ledger.kernel import Kernel, withdrawn


def _foreign(job: JobState, owner: str | None) -> bool:
    """A dependency record from another owner's job (None: written before the rule)."""
    return owner is not None and job.version > 0 and job.spec.owner != owner


def _probe_key(origin: str, probe_id: int, first_hop: str) -> str:
    """How a job remembers a probe it passed on (job ids have neither '@' nor '>')."""
    return f"{origin}@{probe_id}>{first_hop}"


def _fresh_probe_id(probes: tuple[str, ...], origin: str, first_hop: str, at: int) -> int:
    """The id of a probe `origin`'s change at `at` starts at `first_hop`, whose
    remembered probes are `probes`: `at`, or one after the newest id it started for
    `origin` if that is not older. Every probe it starts for `origin` gets a new id."""
    newest: int | None = None
    for key in probes:
        head, hop_sep, hop = key.rpartition(">")
        who, id_sep, probe_id = head.rpartition("@")
        if hop_sep and id_sep and who == origin and hop == first_hop:
            newest = int(probe_id) if newest is None else max(newest, int(probe_id))
    return at if newest is None or newest < at else newest + 1


def cycle_reason(cycle: tuple[str, ...]) -> str:
    return (
        f"depends_on closes the dependency cycle {' -> '.join(cycle)} (refused): "
        "change the job to break it"
    )


class Dependencies(Kernel):
    """What other jobs' logs tell this one."""

    def _evaluate(self, run: RunState) -> None:
        """Make a waiting run due when every upstream succeeded for its period; skip it
        when one finally did not (or the job's upstreams are refused); else leave it
        waiting."""
        if self.job.cycle:
            self._move(run, "skipped", cycle_reason(self.job.cycle))
            return
        start = run.period_start_ms if run.period_start_ms is not None else run.scheduled_ms - 1
        pending = []
        for upstream in self.job.spec.depends_on:
            outcome = self._outcome(upstream, start, run.scheduled_ms)
            later = (
                outcome is not None
                and outcome.next_ms is not None
                and (outcome.next_ms <= run.scheduled_ms)
            )
            if outcome is None or later:  # not finished, or a later run is in the period
                pending.append(upstream)
            elif not outcome.succeeded:
                self._move(run, "skipped", f"upstream {upstream} did not succeed")
                return
        if not pending:
            self._make_due(run, "upstreams succeeded")

    def _outcome(self, upstream: str, after: int, until: int) -> UpstreamOutcome | None:
        """The upstream's latest outcome scheduled in (after, until]."""
        best: UpstreamOutcome | None = None
        for o in self.job.upstream_outcomes:
            if (
                o.upstream == upstream
                and after < o.scheduled_ms <= until
                and (best is None or o.scheduled_ms > best.scheduled_ms)
            ):
                best = o
        return best

    def link(self, inp: DependencyLinked) -> None:
        job = self.job
        if inp.linked and _foreign(job, inp.owner):
            # Another owner's job may not hang on this one: it would learn its outcomes
            # (through its skip reasons) and grow its dependents without bound.
            return self.reject(
                f"{inp.dependent} (owner {inp.owner!r}) cannot depend on {job.spec.job_id} "
                f"of owner {job.spec.owner!r}"
            )
        if inp.trail:
            return self._probe(inp)
        dependents = tuple(d for d in self.job.dependents if d != inp.dependent)
        if inp.linked:
            dependents = (*dependents, inp.dependent)
            self._pass_probe(inp.dependent, (inp.dependent,), inp.at_ms, inp.owner)
        if dependents == self.job.dependents:
            return self.reject("link unchanged")
        self.set_job(dependents=dependents)

    def _probe(self, inp: DependencyLinked) -> None:
        """A probe sent by `inp.dependent`'s change reached this job: a cycle if this job
        sent it (and still depends on the job it sent it to), else passed on."""
        job = self.job
        me = job.spec.job_id
        if me != inp.dependent:
            return self._pass_probe(inp.dependent, inp.trail, inp.at_ms, inp.owner)
        if job.deleted or job.cycle or len(inp.trail) < 2:
            return self.reject("probe ignored: the job is deleted or refused already")
        if inp.trail[1] not in job.spec.depends_on:
            return self.reject("probe ignored: the job changed since it sent it")
        cycle = (*inp.trail, me)
        self.set_job(cycle=cycle)
        for run_id in job.live_runs:  # their upstreams are refused: skipped now
            run = self.run(run_id)
            if run is not None and run.state == "waiting":
                self._evaluate(run)

    def _pass_probe(self, origin: str, trail: tuple[str, ...], at: int, owner: str | None) -> None:
        """Send the probe on to this job's upstreams, unless it already passed here,
        went round a cycle that does not close at its origin (a member's own probe finds
        that one), or this job's upstreams are not in effect. A probe starts here when
        its trail is its origin alone: it is given its id (see the module's doc)."""
        job = self.job
        me = job.spec.job_id
        if (
            job.deleted
            or job.cycle
            or not job.spec.depends_on
            or me in trail
            or len(trail) >= MAX_PROBE_TRAIL
            or _foreign(job, owner)
        ):
            return
        if len(trail) == 1:
            at = _fresh_probe_id(job.probes, origin, me, at)
        key = _probe_key(origin, at, trail[1] if len(trail) > 1 else me)
        if key in job.probes:
            return
        self.set_job(probes=(*job.probes, key)[-MAX_PROBES_KEPT:])
        passed = (*trail, me)
        for upstream in job.spec.depends_on:
            self.notices.append(DependencyLinked(upstream, origin, True, at, owner, passed))

    def upstream_finished(self, inp: UpstreamFinished) -> None:
        job = self.job
        if job.deleted or inp.upstream not in job.spec.depends_on:
            return self.reject(f"{inp.upstream} is not an upstream of {job.spec.job_id}")
        if _foreign(job, inp.owner):
            # An upstream registered by another owner (the id was a placeholder when this
            # job named it): its outcomes are not this job's to see; the periods it
            # would have decided are skipped when the dependency wait runs out.
            return self.reject(f"{inp.upstream} belongs to owner {inp.owner!r}")
        outcome = UpstreamOutcome(
            inp.upstream, inp.scheduled_ms, inp.succeeded, inp.upstream_next_ms
        )
        kept = [
            o
            for o in job.upstream_outcomes
            if (o.upstream, o.scheduled_ms) != (inp.upstream, inp.scheduled_ms)
        ]
        kept.append(outcome)
        kept.sort(key=lambda o: o.scheduled_ms)
        self.set_job(upstream_outcomes=tuple(kept[-self.config.keep_upstream_outcomes :]))
        if job.spec.schedule is None:
            return self._dag_steps()
        for run_id in job.live_runs:
            run = self.run(run_id)
            if run is not None and run.state == "waiting":
                self._evaluate(run)

    def _dag_steps(self) -> None:
        """A job without a schedule runs once per period in which all its upstreams
        succeeded. Periods are decided in order, each by its own upstreams' outcomes
        whatever order their notices arrive in (they come from other partitions): the
        period ending at t is (fired, t], decided once every upstream has an outcome in
        it, run if all succeeded, recorded as skipped if one did not, or if some upstream
        has not finished within `dependency_wait_ms`. A time an upstream reports but
        another does not (an upstream on a slower schedule) joins the next period."""
        job = self.job
        if job.paused:
            return
        upstreams = job.spec.depends_on
        blocked = False  # an earlier period is still open: no failure may skip past it
        expiry: int | None = None  # when the first open period's wait runs out
        for t in sorted({o.scheduled_ms for o in job.upstream_outcomes}):
            after = self.job.fired_ms
            if t <= after:
                continue
            outcomes = {u: self._outcome(u, after, t) for u in upstreams}
            missing = [u for u, o in outcomes.items() if o is None]
            failed = [u for u, o in outcomes.items() if o is not None and not o.succeeded]
            failed_at_t = any(
                o is not None and not o.succeeded and o.scheduled_ms == t for o in outcomes.values()
            )
            if (
                missing
                and not (failed_at_t and not blocked)
                and self.at - t <= self.config.dependency_wait_ms
            ):
                if not blocked:
                    expiry = t + self.config.dependency_wait_ms + 1
                blocked = True
                continue
            self.set_job(fired_ms=t)
            run_id = scheduled_run_id(job.spec.job_id, t)
            existing = self.run(run_id)
            if existing is not None:
                # The job had a schedule of its own until a change (and its upstreams
                # report a time it fired): that run is the one run of t. Withdrawn by
                # the change, it runs after all if every upstream succeeded.
                if withdrawn(existing) and not missing and not failed:
                    self._revive(existing, after)
            elif missing and not failed:
                why = f"upstream {missing[0]} did not finish in time"
                self._skip(t, "dependency", why)
            elif failed:
                self._skip(t, "dependency", f"upstream {failed[0]} did not succeed")
            elif self.job.cycle:
                self._skip(t, "dependency", cycle_reason(self.job.cycle))
            else:
                self._create(t, "dependency", run_id)
        # The scheduler proposes the step at the expiry (see `Firing.fire`): an upstream
        # that stays silent (paused, deleted) must not hold the periods open for ever.
        if expiry != self.job.next_due_ms:
            self.set_job(next_due_ms=expiry)
        # Outcomes of decided periods are never read again.
        fired = self.job.fired_ms
        kept = tuple(o for o in self.job.upstream_outcomes if o.scheduled_ms > fired)
        if kept != self.job.upstream_outcomes:
            self.set_job(upstream_outcomes=kept)

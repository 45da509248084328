"""Attempts on workers: claims (with the placement seal), starts, finishes, releases, lost
workers, deadlines, dispatch failures and cancellation.
"""

from __future__ import annotations

from dataclasses import replace

from schemas.records import (
    CancelRequested,
    ClaimReply,
    ClaimRequested,
    DeadlineReached,
    DispatchFailed,
    RunFinished,
    RunReleased,
    RunStarted,
    RunState,
    WorkerLost,
)
from streams.core.ledger.decision import (
    MAY_HAVE_STARTED,
    STARTED,
)
from streams.core.ledger.kernel import Kernel
from streams.core.schedule import jitter_ms
from streams.core.seals import sealed


class Attempts(Kernel):
    """What the workers, the dispatcher and the deadlines tell the ledger."""

    def cancel(self, inp: CancelRequested) -> None:
        run = self.run(inp.run_id)
        if run is None or run.final:
            return self.reject("run is not live")
        self._cancel_run(run, "cancelled by request")

    def _current(self, run_id: str, attempt: int) -> RunState | None:
        run = self.run(run_id)
        if run is None or run.final:
            self.reject("run is not live")
            return None
        if attempt != run.attempt:
            self.reject(f"stale attempt {attempt} (current {run.attempt})")
            return None
        return run

    def _sealed(self, inp: ClaimRequested | RunStarted | RunFinished | RunReleased) -> bool:
        """Whether a worker's record carries the seal of its attempt's placement on the
        worker it names (always, without a key: the pure tests that play every part)."""
        key = self.config.placement_key
        return key is None or sealed(key, inp.placement, inp.run_id, inp.attempt, inp.worker_id)

    def _unsealed(self, inp: RunStarted | RunFinished | RunReleased, what: str) -> bool:
        """Refuse a report without its placement's seal: a worker id is forgeable, the
        seal reaches only the worker the attempt was placed on (through its own inbox),
        so another worker cannot report it started, done or released."""
        if self._sealed(inp):
            return False
        self.reject(f"{what} of {inp.run_id}#{inp.attempt} by {inp.worker_id} without its seal")
        return True

    def claim(self, inp: ClaimRequested) -> None:
        """First claim of the current attempt wins; every claimant gets an answer."""
        run = self._current(inp.run_id, inp.attempt)
        if run is not None and run.state == "due" and not self._sealed(inp):
            # Not placed there (or a forged claim): the attempt stays due for the worker
            # it was placed on, and its claim deadline re-dispatches it if none claims.
            self.reject(f"{inp.run_id}#{inp.attempt} was not placed on {inp.worker_id}")
            granted, reason = False, self.rejected
        elif run is not None and run.state == "due":
            # Counted from the start time: the timeout never strikes before the run could
            # start (a jitter may put that well after the scheduled time).
            start = self._not_before(run)
            backstop = self._timeout_backstop(
                max(self.at, run.scheduled_ms if start is None else start)
            )
            self._move(
                run, "dispatched", "", worker_id=inp.worker_id, deadline=(backstop, "timeout")
            )
            granted, reason = True, ""
        elif (
            run is not None
            and run.worker_id == inp.worker_id
            and run.state == "dispatched"
            and not self._sealed(inp)
        ):
            # Every claim path needs the seal: without it, anyone naming the holder could
            # settle a pending cancel on its behalf (below), though it may be starting.
            self.reject(f"claim of {inp.run_id}#{inp.attempt} by {inp.worker_id} without its seal")
            granted, reason = False, self.rejected
        elif (
            run is not None
            and run.worker_id == inp.worker_id
            and run.state == "dispatched"
            and run.cancelling
        ):
            # The holder asks again (a restarted worker re-asks the claims its journal
            # holds unanswered): it has not started the attempt, which answers the order.
            self._settle_cancel(run)
            granted, reason = False, "cancelled"
        elif run is not None and run.worker_id == inp.worker_id and run.state == "dispatched":
            granted, reason = True, "already granted"  # a repeated claim: answer again
        else:
            if run is not None:
                self.reject(f"already claimed by {run.worker_id or 'nobody'} ({run.state})")
            granted, reason = False, self.rejected
        # The reply carries the claim's own stamp, not the ledger's now: the worker
        # matches a reply to the claim it answers by it (a late reply to an earlier
        # claim of the same attempt must not pass for the answer to a later one).
        self.replies.append(
            ClaimReply(
                inp.worker_id, inp.run_id, inp.attempt, granted, reason, inp.at_ms, inp.placement
            )
        )

    def dispatch_failed(self, inp: DispatchFailed) -> None:
        run = self._current(inp.run_id, inp.attempt)
        if run is None:
            return None
        if run.state != "due":
            return self.reject(f"dispatch failure for a run that is {run.state}")
        self._move(run, "failed", inp.reason)
        return None

    def started(self, inp: RunStarted) -> None:
        run = self._current(inp.run_id, inp.attempt)
        if run is None:
            return None
        if self._unsealed(inp, "start"):
            return None
        self._start(run, inp.worker_id, inp.at_ms)
        return None

    def _start(self, run: RunState, worker_id: str, at_ms: int) -> RunState | None:
        """Record the holder's start of a claimed attempt; the run as it stands after,
        None if the start was refused or the run was cancelled at it."""
        if run.worker_id != worker_id or run.state != "dispatched":
            self.reject(f"start by {worker_id} while {run.state} on {run.worker_id}")
            return None
        pending = run.cancelling
        # Started no earlier than granted (`updated_ms` of the dispatched state, or a
        # later cancel) and than its start time; the timeout backstop counts from now.
        earliest = max(run.updated_ms, self._not_before(run) or run.updated_ms)
        running = self._move(
            run,
            "running",
            deadline=(self._timeout_backstop(self.at), "timeout"),
            reported_ms=self._vouched(at_ms, earliest),
        )
        if pending:
            # It started before the stop order reached it: recorded, then cancelled (the
            # order, already on its way, stops it; sent again for a restarted worker).
            self._stop_order(running, pending)
            self._move(running, "cancelled", f"{pending} ({STARTED})")
            return None
        return running

    def _timeout_backstop(self, start: int) -> int:
        return start + int(self.job.spec.timeout_s * 1000) + self.config.timeout_grace_ms

    def finished(self, inp: RunFinished) -> None:
        run = self._current(inp.run_id, inp.attempt)
        if run is None:
            return None
        if self._unsealed(inp, "report"):
            return None
        if inp.started_ms is not None and run.state == "dispatched":
            # One report for the start and the end (a short run): the start first, as
            # if reported on its own, then the end against the running run.
            started = self._start(run, inp.worker_id, inp.started_ms)
            if started is None:
                return None  # refused (rejected as a start), or cancelled at its start
            run = started
        if run.worker_id != inp.worker_id or run.state not in ("dispatched", "running"):
            return self.reject(f"report by {inp.worker_id} while {run.state} on {run.worker_id}")
        ended = self._vouched(inp.at_ms, run.started_ms or run.updated_ms)
        if inp.exit_code == 0:
            self._move(run, "succeeded", exit_code=0, reported_ms=ended)
            return None
        if run.cancelling:  # it ran, and was stopped by the order (or failed): no retry
            return self._settle_cancel(run, STARTED, exit_code=inp.exit_code, reported_ms=ended)
        reason = inp.error or (
            f"exit code {inp.exit_code}" if inp.exit_code is not None else "killed"
        )
        # An attempt whose effects are unknown: lost (the worker's executor died, it
        # restarted) or fenced (killed mid-run because the worker could not prove it was
        # alive). Like a WorkerLost verdict: only idempotent jobs run again.
        lost = inp.exit_code is None and inp.error.startswith(("lost", "fenced"))
        retry = not lost or self.job.spec.idempotent
        self._fail_attempt(
            run, reason, retry_allowed=retry, exit_code=inp.exit_code, reported_ms=ended
        )

    def lost(self, inp: WorkerLost) -> None:
        run = self._current(inp.run_id, inp.attempt)
        if run is None:
            return None
        if run.worker_id != inp.worker_id or run.state not in ("dispatched", "running"):
            return self.reject(f"worker {inp.worker_id} does not hold this attempt")
        # Should the worker come back, it must not keep running the attempt.
        self._stop_order(run, "declared lost")
        start = self._not_before(run)
        fenced_by = self.at if inp.lease_ended_ms is None else min(self.at, inp.lease_ended_ms)
        if run.state == "dispatched" and start is not None and start > fenced_by:
            # It cannot have started: a worker starts nothing before the attempt's start
            # time, nor after its lease ended (the verdict says when, by the broker's
            # time of its last beat; before this verdict in any case). So the attempt is
            # released, as by the worker itself: no retry is consumed.
            self._release(
                run, f"worker {inp.worker_id} lost before the run's start: dispatched again"
            )
            return None
        # Whether a lost attempt did its work is unknown: only idempotent jobs run again.
        self._fail_attempt(
            run, f"lost: worker {inp.worker_id}", retry_allowed=self.job.spec.idempotent
        )

    def released(self, inp: RunReleased) -> None:
        """The holder of an attempt it never started releases it: dispatch it again."""
        run = self._current(inp.run_id, inp.attempt)
        if run is None:
            return None
        if self._unsealed(inp, "release"):
            return None
        if run.worker_id != inp.worker_id or run.state != "dispatched":
            return self.reject(
                f"release by {inp.worker_id} while {run.state} on {run.worker_id or 'nobody'}"
            )
        why = f": {inp.reason}" if inp.reason else ": dispatched again"
        self._release(run, f"released by worker {inp.worker_id}{why}")
        return None

    def _release(self, run: RunState, reason: str) -> None:
        """A claimed attempt that never started goes back to `due`, the same attempt (no
        retry is consumed), unclaimed, with a fresh claim deadline and a new dispatch
        request that keeps its start time (as the claim deadline's re-dispatch does)."""
        if run.cancelling:
            return self._settle_cancel(run)
        start = self._not_before(run)
        not_before = self.at if start is None else max(start, self.at)
        self._due(run, run.attempt, not_before, reason)

    def deadline(self, inp: DeadlineReached) -> None:
        run = self._current(inp.run_id, inp.attempt)
        if run is None:
            return None
        if run.deadline_kind != inp.kind or run.deadline_ms is None:
            return self.reject(f"no {inp.kind} deadline pending ({run.state})")
        if self.at < run.deadline_ms:
            return self.reject("deadline not reached yet")
        if inp.kind == "claim":
            # Dispatch is at-least-once: nobody claimed in time, so place it again.
            deadline = self.at + self.config.claim_timeout_ms
            again = replace(run, deadline_ms=deadline, updated_ms=self.at)
            self.runs[run.run_id] = again
            self._dispatch(again, self.at)
        elif inp.kind == "retry":
            self._due(run, run.attempt + 1, self.at, f"retry {run.attempt + 1}")
        elif inp.kind == "dependency":
            self._move(run, "skipped", "upstreams did not all succeed in time")
        elif run.asked_ms is None:
            # The first notice asks, it does not judge: the holder's report may only be
            # late (a broker outage held it in the worker's queue while this notice's
            # time ran on). The stop order asks the holder to end the attempt; its answer
            # decides (a report, a release) or the dispatcher's verdict if it is dead, and
            # the attempt fails for silence only if the grace passes once more, counted
            # from this notice, written with the broker up.
            self._stop_order(run, "no report before the timeout backstop")
            self.runs[run.run_id] = replace(
                run,
                asked_ms=self.at,
                deadline_ms=self.at + self.config.timeout_grace_ms,
                updated_ms=self.at,
            )
        else:
            self._fail_attempt(
                run,
                "timeout: no report from the worker (asked to stop "
                f"{(self.at - run.asked_ms) / 1000:.0f} s before)",
                retry_allowed=self.job.spec.idempotent,
            )

    def _fail_attempt(
        self,
        run: RunState,
        reason: str,
        *,
        retry_allowed: bool,
        exit_code: int | None = None,
        reported_ms: int | None = None,
    ) -> None:
        if run.cancelling:
            return self._settle_cancel(
                run, MAY_HAVE_STARTED, exit_code=exit_code, reported_ms=reported_ms
            )
        retry = self.job.spec.retry
        if retry_allowed and run.attempt < retry.max_attempts:
            backoff_s = min(
                retry.backoff_s * retry.backoff_multiplier ** (run.attempt - 1),
                retry.max_backoff_s,
            )
            # Up to 10% jitter, stable per (run, attempt), so retries of many runs that
            # failed together do not return together.
            jitter = jitter_ms(f"{run.run_id}#{run.attempt}", run.scheduled_ms, backoff_s * 0.1)
            due = self.at + int(backoff_s * 1000) + jitter
            self._move(
                run,
                "retrying",
                reason,
                deadline=(due, "retry"),
                exit_code=exit_code,
                reported_ms=reported_ms,
            )
        else:
            self._move(run, "failed", reason, exit_code=exit_code, reported_ms=reported_ms)

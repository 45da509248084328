"""What the ledger decides with (its configuration) and what one decision is: the
changes and messages a single input produces. The words of the rules too (the reasons a
withdrawn run carries), shared by every part of the ledger.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from schemas.records import (
    BackfillRequested,
    CancelOrder,
    ClaimReply,
    DependencyLinked,
    DispatchRequest,
    JobEvent,
    JobState,
    RunEvent,
    RunState,
    UpstreamFinished,
)
from streams.core.commands import MAX_BACKFILL_RUNS
from streams.core.secret_grants import NO_GRANTS, SecretGrants
from streams.core.timing import TIMING


@dataclass(frozen=True, slots=True)
class LedgerConfig:
    # A due run not claimed by a worker within this is dispatched again.
    claim_timeout_ms: int = int(TIMING.claim_timeout_s * 1000)
    # The worker kills a run at its timeout; the ledger declares it lost this much later.
    timeout_grace_ms: int = 30_000
    # A fire proposal arriving later than this after its time is a misfire.
    misfire_grace_ms: int = 60_000
    # Misfired times older than this before the proposal are skipped whatever the policy.
    catchup_window_ms: int = 24 * 3600 * 1000
    # At most this many runs are created for one late proposal (run_all), or for one
    # backfill in one transaction (the rest of its range follows in later ones).
    max_catchup_runs: int = 1000
    # Runs one backfill request creates at most, over all its transactions.
    max_backfill_runs: int = MAX_BACKFILL_RUNS
    # Backfill pacing (owner fairness, issue 53 item 12): a job holds at most this many
    # live backfill runs; a backfill's further runs are created as earlier ones finish
    # (driven by the run-finished inputs on the job's own log), so one owner's backfill
    # never puts a large backlog before other owners' firings, in the ledger's input or
    # on the dispatch topic. The rest of its range waits in the job's state.
    backfill_live_runs: int = 10
    # Backfills one job holds accepted and not fully created at most; one more is
    # refused, dead-lettered naming this quota (the API's per-owner quota comes first).
    max_pending_backfills: int = 64
    # Run-now runs one job holds not finished at most; one more is refused, dead-lettered
    # naming this quota (the API's per-owner runs_in_flight quota comes first).
    max_live_manual_runs: int = 1000
    # Fire proposals may come this early (the lead, and the look-ahead of a burst, which
    # begins as early as the burst needs: streams/core/proposals.py, `Pacer`); earlier
    # ones are bogus.
    max_lead_ms: int = 660_000
    # Finished runs kept per job (for rerun and duplicate reports) before being forgotten.
    keep_final_runs: int = 20
    keep_request_ids: int = 256
    # Backfilled spans kept per job; beyond it the two closest merge (the gap between
    # them can then no longer be backfilled: refused with a reason, never run twice).
    keep_spans: int = 32
    # A run waiting on its upstreams is skipped if they have not all finished by then.
    dependency_wait_ms: int = 24 * 3600 * 1000
    keep_upstream_outcomes: int = 256
    # The nodes' key for placement seals (streams/core/seals.py): when set, a
    # claim is granted only with the dispatcher's seal of that attempt on the claiming
    # worker. The ledger of a node always has it (streams/placement_key.py); None, no check, is
    # for the pure tests and benchmarks that play both the dispatcher and the worker.
    placement_key: bytes | None = None
    # Which owners may use which secret (streams/core/secret_grants.py): a job spec
    # naming a secret its owner may not use is refused and dead-lettered. The default
    # grants nothing, as a node without CRONLOG_SECRETS_GRANTS: no secret may be named.
    secret_grants: SecretGrants = NO_GRANTS


@dataclass(frozen=True, slots=True)
class Decision:
    job: JobState | None = None  # the new job state, when it changed
    runs: tuple[RunState, ...] = ()  # changed runs
    forget: tuple[str, ...] = ()  # run ids to drop from the run table (tombstones)
    events: tuple[RunEvent | JobEvent, ...] = ()
    dispatch: tuple[DispatchRequest, ...] = ()
    # Inputs for other jobs' logs (dependency links and upstream notices) and for the
    # job's own (a backfill's continuation), written in the same transaction as the rest.
    notices: tuple[DependencyLinked | UpstreamFinished | BackfillRequested, ...] = ()
    # Messages to workers (worker-inbox): claim replies and orders to stop an attempt.
    replies: tuple[ClaimReply | CancelOrder, ...] = ()
    rejected: str = ""  # why the input changed nothing, for logs and metrics
    # A user's command refused here rather than by ingress (it needs the job's state):
    # the ledger sends its record to commands.dlq with `rejected` as the reason.
    dead_letter: bool = False

    @property
    def changed(self) -> bool:
        return self.job is not None or bool(
            self.runs or self.forget or self.notices or self.replies
        )


RunLookup = Callable[[str], RunState | None]


# Why a scheduled run created ahead of its time was cancelled before it could start: such
# a firing is revived, not re-created, if the job fires it after all.
# A cycle probe stops after passing this many jobs (a chain of dependencies longer than
# any real pipeline; a cycle longer than it is not refused), and each job remembers the
# newest probes it passed on so that one reaching it by two paths goes on once.
MAX_PROBE_TRAIL = 1_000
MAX_PROBES_KEPT = 32

WITHDRAWN_BY_PAUSE = "job paused before the run was due"
WITHDRAWN_BY_DELETE = "job deleted before the run was due"
WITHDRAWN_BY_CHANGE = "schedule changed before the run was due"
WITHDRAWN = frozenset({WITHDRAWN_BY_PAUSE, WITHDRAWN_BY_DELETE, WITHDRAWN_BY_CHANGE})
# Said of a run cancelled while claimed whose holder started it (or may have) before the
# stop order reached it: such a firing is never revived.
STARTED = "it had started"
MAY_HAVE_STARTED = "it may have started"

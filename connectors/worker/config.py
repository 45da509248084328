"""The worker's configuration and its record of one attempt: `WorkerConfig` (what
`cronlog worker` is told), `Attempt` (what the main loop, connectors/worker/worker.py,
knows of each attempt it holds) and the constants of its loop."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from connectors.worker.confine import Confinement
from connectors.worker.executor import Executor
from connectors.worker.housekeeping import DEFAULT_KEEP_S
from connectors.worker.outputcap import DEFAULT_OUTPUT_CAP_MB
from connectors.worker.runas import RunAs
from connectors.worker.runlogs import LogTail
from schemas.records import DispatchRequest
from streams.core.placement import Capacity
from streams.core.timing import TIMING
from streams.topics import HEARTBEAT_MAX_BYTES

ExecutorKind = Literal["process", "noop"]
Key = tuple[str, int]
HORIZON_MS = 60_000  # heartbeats advertise the busiest second of the coming minute
TAIL_EVERY_S = 1.0
CLAIM_REPLY_S = 60.0  # a claim unanswered this long is given up
# A start's report waits this long for its run's end, so that a short run (most are) is
# reported by one record, start and end (`RunFinished.started_ms`): a record fewer on
# worker-reports and job-log, and one input fewer for the gate and the ledger. Little
# needs the ledger's record of a start sooner (docs/architecture.md, "Dispatch and
# workers"): lateness is the start's own time, a lost worker's attempt is judged by its
# lease, and the timeout backstop (30 s of grace) moves by as much.
START_WAIT_S = 0.1
# The most attempts a worker holds (claimed ahead, or running): each heartbeat lists them
# all (~40 bytes each), within the heartbeats topic's record limit with room to spare.
MAX_HELD = HEARTBEAT_MAX_BYTES // 160

# The heartbeat thread's producer: unlingered, and allowed a beat as large as the
# heartbeats topic takes (`MAX_HELD` attempts listed).
# A beat counts only if acknowledged within the ack window: a request a broker does not
# answer (paused) is given up, and its connection dropped, after that long.
# Not idempotent: an idempotent producer sends nothing until a broker grants it a
# producer id, which a producer made fresh during a failover (the replacement in
# heartbeat.py) waits for while the ids' coordinator moves and loads, for longer than
# the lease. A beat repeated is harmless; one request in flight keeps beats in order.
HEARTBEAT_PRODUCER: dict[str, Any] = {
    "enable.idempotence": False,
    "max.in.flight.requests.per.connection": 1,
    "linger.ms": 0,
    "message.max.bytes": HEARTBEAT_MAX_BYTES,
    "socket.timeout.ms": int(TIMING.ack_window_s * 1000),
    "request.timeout.ms": int(TIMING.ack_window_s * 1000),
}


INBOX_ASK_S = 10.0  # one try at finding or making the private inbox (retried while down)
# Retry a broker that is down every second (librdkafka's default backs off up to 10 s):
# heartbeats, claims and reports resume within about a second of its return.
RECONNECT = {"reconnect.backoff.max.ms": 1000}
LOOP_STUCK_S = 20.0  # a main loop without a pass for this long stops the lease renewals


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    worker_id: str
    capacity: Capacity
    labels: tuple[tuple[str, str], ...] = ()
    executor: ExecutorKind = "process"
    state_dir: Path = Path(".state/workers")
    # The liveness chain (streams/core/timing.py has the inequalities): a beat every
    # heartbeat_s renews the lease if acknowledged within ack_window_s of its making;
    # runs are fenced when the lease ends, lease_s after the renewing beat was made,
    # which outlives a broker failover and ends, with fence_grace_s, before the
    # failure detector's verdict.
    heartbeat_s: float = TIMING.heartbeat_s
    ack_window_s: float = TIMING.ack_window_s
    lease_s: float = TIMING.lease_s
    # Each acknowledged beat arms the starts due this far ahead (at least a beat
    # interval and a margin more, so a start never waits for arming).
    arm_ahead_s: float = TIMING.arm_ahead_s
    fence_grace_s: float = TIMING.kill_grace_s  # SIGTERM -> SIGKILL when fenced or timed out
    # The executor fences everything when it was itself paused this long: the detector
    # may have declared the worker dead meanwhile.
    max_gap_s: float = TIMING.executor_gap_s
    # Finished attempts (report acknowledged) are forgotten, their run directories
    # removed, this long after (connectors/worker/housekeeping.py).
    keep_s: float = DEFAULT_KEEP_S
    secrets_dir: Path | None = None  # files named after secrets (connectors/worker/secrets.py)
    run_as: RunAs | None = None  # the user every job runs as (connectors/worker/runas.py)
    # The sandbox of its jobs (connectors/worker/confine.py): its files hidden, a PID
    # namespace and a /tmp of their own, their environment applied inside only.
    confinement: Confinement | None = None
    # No file a job writes grows past this, its output included (MiB, 0: no cap;
    # connectors/worker/outputcap.py).
    output_cap_mb: float = DEFAULT_OUTPUT_CAP_MB


@dataclass
class Attempt:
    dispatch: DispatchRequest
    phase: str  # claiming | granted | started | done
    executor: Executor | None = None
    run_dir: Path | None = None
    pid: int = 0
    started_ms: int | None = None
    tail: LogTail | None = None
    cancelled: bool = False
    stop_reason: str = ""  # the stop order's reason, said in the report of what it killed
    since: float = 0.0  # monotonic: when it entered its phase
    claimed_ms: int = 0  # the time of the latest claim: only its reply counts
    # When that claim was made, on CLOCK_MONOTONIC (the lease's clock): a lapse of the
    # lease after it voids the claim (connectors/worker/engine.py `Lease.voids`).
    claimed_mono: float | None = None

    @property
    def key(self) -> Key:
        return self.dispatch.run_id, self.dispatch.attempt

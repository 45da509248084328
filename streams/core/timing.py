"""The timing budget: every timeout that safety or liveness rests on, and the inequalities
between them that the guarantees need. Pure.

One record holds the defaults; the worker, the dispatcher, the Kafka clients and the
local cluster's broker settings take theirs from it (a unit test checks that each still
does), and `Timing.checks()` states each inequality with its margin, so a default that
breaks one fails a test instead of a failover. docs/architecture.md ("The timing
budget") has the table, the argument behind each line and the measured failovers.

The worker's liveness chain, in the letters the checks use:
H heartbeat interval, A how soon a beat must be acknowledged to renew the lease (from its
making), L the lease (from the beat's making), G the kill grace (SIGTERM to SIGKILL),
S suspicion (no beat received: no new placements, unclaimed placements taken back),
D the dead verdict (no beat received), F the longest broker failover tolerated (beats
unacknowledged while a dead broker's partitions move or it leaves the in-sync set).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Check:
    """One inequality of the budget: `left` must stay below `right` by `margin_s`."""

    name: str
    left_s: float
    right_s: float
    margin_s: float
    why: str

    @property
    def holds(self) -> bool:
        return self.right_s - self.left_s >= self.margin_s


@dataclass(frozen=True, slots=True)
class Timing:
    # The worker: a beat every second, so that a lease of 8 s outlives a broker
    # failover (L >= F + H + a margin); beats are small (capacity and held attempts).
    heartbeat_s: float = 1.0
    ack_window_s: float = 2.0
    lease_s: float = 8.0
    kill_grace_s: float = 1.0
    # The executor fences everything after a pause this long (it cannot vouch that the
    # lease held meanwhile): below D - L.
    executor_gap_s: float = 2.5
    # The dispatcher's failure detector, on its own monotonic clock.
    suspect_after_s: float = 4.0
    dead_after_s: float = 11.0
    # How far ahead of the broker's time a beat arms the worker's starts (Heartbeat
    # armed_ms): a run starts only once a beat arming its start time was acknowledged,
    # so of a dead worker's unstarted runs only those due within this of its last beat
    # can be lost; the rest are placed again without using an attempt.
    arm_ahead_s: float = 2.0
    # The unstarted runs of a dead worker: its lease ended this long after the broker
    # time of its last beat read, at most (clock rates and the executor's pass).
    lease_bound_margin_s: float = 1.0
    # The longest broker failover the lease must outlive (the local cluster's settings,
    # compose/kafka/server.properties.in): when the dead broker was also the active
    # controller, the other voters notice after the quorum's fetch timeout, elect a
    # controller within its election timeout, and the new one fences the dead broker
    # a broker session after taking over; then leaders move and clients refresh their
    # metadata (measured: docs/architecture.md, "The timing budget").
    broker_session_s: float = 3.0
    broker_heartbeat_s: float = 0.5
    quorum_fetch_timeout_s: float = 1.0
    quorum_election_timeout_s: float = 1.0
    metadata_refresh_s: float = 1.0
    # Every client gives up a request a broker does not answer after this long (and
    # drops the connection, then finds the new leaders); the worker's heartbeats after
    # the ack window.
    request_timeout_s: float = 6.0
    # Consumer groups (every loop) and transactions (the ledger).
    consumer_session_s: float = 6.0
    consumer_heartbeat_s: float = 1.5
    transaction_timeout_s: float = 7.0
    # The ledger re-dispatches an unclaimed attempt after this long.
    claim_timeout_s: float = 30.0
    # Nodes propose firings this early (`--lead-s`): runs are decided, placed
    # and claimed before their time.
    lead_s: float = 10.0

    @property
    def broker_failover_s(self) -> float:
        """F: how long a dead broker's partitions accept no acknowledged write, at
        worst (it was the active controller too)."""
        return (
            self.quorum_fetch_timeout_s
            + self.quorum_election_timeout_s
            + self.broker_session_s
            + self.metadata_refresh_s
        )

    def checks(self) -> tuple[Check, ...]:
        h, a, lease, g = self.heartbeat_s, self.ack_window_s, self.lease_s, self.kill_grace_s
        f = self.broker_failover_s
        return (
            Check(
                "lease outlives a broker failover",
                f + h,
                lease,
                1.0,
                "the last beat acknowledged before a broker dies renewed the lease to at "
                "least L - H after the death; a beat made within A of the failover's end "
                "is acknowledged in time and renews it (the margin: its delivery)",
            ),
            Check(
                "a run is armed before its start",
                h + 0.5,
                self.arm_ahead_s,
                0.0,
                "the next beat arms further before the horizon of the one before is "
                "reached, when acknowledged within the margin (a slower one delays starts, "
                "never makes one unsafe)",
            ),
            Check(
                "arming bounds fewer runs than the lease",
                self.arm_ahead_s,
                lease,
                1.0,
                "a dead worker's runs due after its last beat's horizon were never started",
            ),
            Check(
                "every moment is covered by a beat's window",
                h,
                a,
                0.0,
                "beats are made every max(H, A) (a beat waits A for its acknowledgement): "
                "some beat's window covers the moment a failover ends",
            ),
            Check(
                "the verdict follows the lease",
                lease + a,
                self.dead_after_s,
                0.0,
                "a beat that could extend the lease was made within L of the last one read "
                "and acknowledged within A: before the verdict's question, so it was read",
            ),
            Check(
                "jobs are dead before the verdict",
                lease + g,
                self.dead_after_s,
                1.0,
                "the executor kills at the lease's end plus the grace: before any other "
                "worker may start the attempt",
            ),
            Check(
                "an executor pause is noticed before the verdict",
                lease + self.executor_gap_s,
                self.dead_after_s,
                0.0,
                "an executor that did not run for executor_gap_s fences everything",
            ),
            Check(
                "suspicion comes before the verdict",
                self.suspect_after_s,
                self.dead_after_s,
                2.0,
                "unclaimed placements are taken back at suspicion, runs claimed at the verdict",
            ),
            Check(
                "a slow beat is not suspicion",
                2 * h + a,
                self.suspect_after_s,
                0.0,
                "two beats missed, the third still waiting for its acknowledgement",
            ),
            Check(
                "a live controller is not replaced",
                self.broker_heartbeat_s * 1.5,
                self.quorum_fetch_timeout_s,
                0.25,
                "a voter fetches from the controller far more often than its timeout",
            ),
            Check(
                "a live broker is not fenced",
                self.broker_heartbeat_s * 4,
                self.broker_session_s,
                0.5,
                "four broker heartbeats to the controller fit in its session",
            ),
            Check(
                "a slow broker is not dropped",
                self.broker_session_s,
                self.request_timeout_s,
                2.0,
                "a request outlives a broker failover's wait for the in-sync set to shrink",
            ),
            Check(
                "a consumer survives missed heartbeats",
                self.consumer_heartbeat_s * 3,
                self.consumer_session_s,
                1.5,
                "three missed 1.5 s heartbeats under a saturated CPU keep the member",
            ),
            Check(
                "a zombie's transaction ends with its session",
                self.consumer_session_s,
                self.transaction_timeout_s,
                0.5,
                "the broker aborts a dead ledger's open transaction as its partitions move",
            ),
            Check(
                "the lead covers a broker failover",
                f + a,
                self.lead_s,
                2.0,
                "runs due during a failover were claimed before it",
            ),
            Check(
                "the lead covers a dead verdict's placement",
                self.suspect_after_s + 1.0,
                self.lead_s,
                2.0,
                "placements taken back at suspicion are placed elsewhere before their time",
            ),
            Check(
                "a claim deadline is a last resort",
                self.dead_after_s + self.lead_s,
                self.claim_timeout_s,
                5.0,
                "suspicion and the verdict return a silent worker's runs long before it",
            ),
        )


TIMING = Timing()

"""The dispatcher's failure detector: the verdict that a worker is dead, and the
WorkerLost records it sends.

Failure detection (the judgement itself is pure: `streams/core/liveness.py`): one clock.
Liveness is judged only on this dispatcher's
`time.monotonic()`: each worker's last beat is remembered by the time it was *received*
(read from `heartbeats`), never by the time the worker stamped on it, so no worker's
clock, ahead or behind, moves a verdict. Which of two beats of one worker is newer is
told by their order in the log (one partition per worker id), or else by the worker's
own stamps (one clock). A worker is suspected when no beat was received for
`suspect_after_s` (4 s): no new placements, and what this dispatcher placed there that no
beat listed yet is placed again elsewhere. It is declared dead after `dead_after_s`
(11 s): each attempt it held gets a WorkerLost on its job's log, carrying the broker
time by which its lease had ended (the last beat read's append time plus the lease and
a margin), so the ledger releases the runs due after it (the ledger ignores a verdict
if the attempt moved on). The verdict is taken in two steps: when
a worker looks dead the dispatcher asks the broker where that worker's heartbeat
partition ends, and declares it dead only once it has read up to there and the worker
was still silent when it asked; so every beat the broker had acknowledged by then
cancels the verdict. And never before `dead_after` has passed on this clock since the
dispatcher started (or restarted, after a consumer error or a question the broker did
not answer) reading heartbeats: one that just started cannot tell a silent worker from
one whose beats it has not read.
Why it is safe (the letters and numbers of streams/core/timing.py): a worker's lease ends
L (8 s) after it *made* its last beat that renewed it, on its own clock, and it kills its
runs then; a beat renews the lease only if the broker acknowledged it within the ack
window A (2 s) of its making. The verdict comes D >= L + A (11 s) of the dispatcher's
clock after the *receipt* of the last beat it read, and a beat is received after it is
made: that beat's lease ended before the verdict, whatever the offset between the two
clocks (their rates agree to far better than a second in 11 s). A later beat that could
still have extended the lease was made within L of that one and acknowledged within A,
so before the verdict's question to the broker: it would have been read and cancelled
the verdict; a beat made after the lease lapsed finds the worker's runs already killed.
Comparing the dispatcher's wall clock with the worker's stamp instead would let a worker
clock behind the dispatcher's bring the verdict before the lease ends. How much history
to read at start (the last `history_s`, by `offsets_for_times` against the broker's
append times) does compare this machine's clock with the broker's: a skew only reads a
little more or less history, and no verdict depends on it.

A suspected worker's unclaimed placements are placed again by streams/dispatcher_placing.py
(`Placing._take_back`).
"""

from __future__ import annotations

import logging

from confluent_kafka import KafkaException, TopicPartition

from schemas.records import WorkerLost
from streams import metrics
from streams.core.ids import job_of
from streams.dispatcher_kernel import UNANSWERED_LOG_S, DispatcherKernel

log = logging.getLogger("cronlog.dispatcher")


class Verdicts(DispatcherKernel):
    """Declares dead the workers still silent once every beat the broker holds is read."""

    def _detect(self, now: int) -> None:
        """Two steps. When workers look dead, ask the broker where their heartbeat
        partitions end; once every beat up to there has been read, declare dead those of
        them still silent as of that question. Any beat the broker had acknowledged by
        then has been read first, so it cancels the verdict."""
        now_s = self.clock.monotonic()
        if self._check is None:
            silent = {
                info.worker_id
                for info in self.workers.values()
                if not info.dead and self.liveness.dead(info.received_s, self.reading_since, now_s)
            }
            if silent:
                ends = self._ends({self.workers[w].mark.partition for w in silent})
                if ends is not None:
                    self._check = (now_s, ends, silent)
                else:
                    # The broker does not answer this dispatcher: what it did not read
                    # meanwhile may hold beats, so nobody is judged until a full
                    # dead_after of reading after it answers again (the workers beat
                    # within a second of its return, and are not declared dead for an
                    # outage of the broker's).
                    self.reading_since = now_s
            return
        asked_s, ends, silent = self._check
        if not self._read_to(ends):
            if now_s - asked_s > self.liveness.dead_after_s:
                self._check = None  # not reached in all that time: ask again
            return  # read them first (the next pass)
        self._check = None
        for worker_id in sorted(silent):
            info = self.workers[worker_id]
            if info.dead or not self.liveness.dead(info.received_s, self.reading_since, asked_s):
                continue  # a beat came, or reading was interrupted: judged afresh later
            info.dead = True
            self.declared_dead += 1
            metrics.WORKER_VERDICTS.labels("lost").inc()
            held = self._held(info) | set(info.reserved) | set(info.maybe)
            log.warning(
                "worker %s: no beat received for %.1f s: declared dead, %d attempts lost",
                info.worker_id,
                now_s - info.received_s,
                len(held),
            )
            # No beat after the last one read was acknowledged (it would have been read
            # first), and the worker starts only what an acknowledged beat armed, inside
            # its lease: a run whose start time is later than the highest horizon read
            # (or, for a worker from before arming, the last beat's broker time plus the
            # lease) never started.
            lease_ended = info.start_bound_ms
            for run_id, attempt in sorted(held):
                job_id = job_of(run_id)
                self._send(
                    job_id, WorkerLost(job_id, run_id, attempt, info.worker_id, now, lease_ended)
                )
            for key in list(info.reserved):
                info.release(key)
            info.maybe.clear()

    def _ends(self, partitions: set[int]) -> dict[int, int] | None:
        """Where these heartbeat partitions end now, by the broker (None if it cannot
        tell: no verdict then)."""
        try:
            return {
                p: self.heartbeat_consumer.get_watermark_offsets(
                    TopicPartition(self.heartbeats_topic, p), 2, cached=False
                )[1]
                for p in partitions
            }
        except KafkaException as exc:
            if self.clock.monotonic() - self._unanswered_logged >= UNANSWERED_LOG_S:
                self._unanswered_logged = self.clock.monotonic()
                log.warning(
                    "cannot tell whether every heartbeat was read (%s): no verdict until "
                    "the broker answers and %.0f s of beats were read",
                    exc,
                    self.liveness.dead_after_s,
                )
            return None

    def _read_to(self, ends: dict[int, int]) -> bool:
        positions = self.heartbeat_consumer.position(
            [TopicPartition(self.heartbeats_topic, p) for p in ends]
        )
        return all(tp.offset >= ends[tp.partition] for tp in positions)

"""The dispatcher's reading of `heartbeats`: each worker's capacity, what it has free and
the attempts it holds, remembered by the time each beat was received (this dispatcher's
clock: streams/dispatcher_verdicts.py says why); the reservations a beat confirms or ends.
"""

from __future__ import annotations

import logging

from confluent_kafka import KafkaError, TopicPartition

from schemas.codec import HEARTBEAT, CodecError
from schemas.records import WorkerCapacity
from streams import metrics
from streams.core.clock import broker_stamp
from streams.core.liveness import BeatMark, newer
from streams.core.placement import Capacity
from streams.dispatcher_kernel import DispatcherKernel, WorkerInfo
from streams.kafka import until_done

log = logging.getLogger("cronlog.dispatcher")
# A placement not listed by a heartbeat fetched this long after it was refused or lost.
REFUSAL_MARGIN_S = 1.0
# A beat lists every attempt its worker holds. Holding a burst claimed ahead, that is tens
# of thousands, a beat a second from each worker: decoding those lists took 58 % of the
# dispatcher's time and placements fell behind by a minute (100,000 jobs over one
# minute, docs/performance.md, "Bursts with default options"). So a list this long is
# read at most every LIST_EVERY_S; the beats between are read without it (their
# capacity, free figure and liveness count at once). What the list decides waits that
# long: the reservations it confirms or ends hold a little longer. A verdict reads the
# newest beat's list whole.
LONG_LIST = 1000
LIST_EVERY_S = 5.0


class Heartbeats(DispatcherKernel):
    """Follows every worker's beats (the history of `history_s`, then as they come)."""

    def _follow_heartbeats(self) -> None:
        # The history to read is found by this machine's clock against the broker's
        # append times: a skew reads a little more or less of it, and no verdict depends
        # on how much was read (a worker is judged only on beats received from now on).
        since = int((self.clock.time() - self.config.history_s) * 1000)
        partitions = [
            TopicPartition(self.heartbeats_topic, p, since) for p in range(self.settings.partitions)
        ]
        offsets = until_done(
            lambda: self.heartbeat_consumer.offsets_for_times(partitions, timeout=10),
            "finding where to read heartbeats from",
            self._stop,
        )
        if offsets is None:  # stopped while the broker was down
            return
        self.reading_since = self.clock.monotonic()
        self.heartbeat_consumer.assign(offsets)

    def _read_heartbeats(self) -> None:
        started = self.clock.monotonic()
        # Every beat read in this pass reached the client after the previous pass began
        # (that pass read the client's queue empty).
        self._fetched_after_s = self._drained_s
        while True:
            batch = self.heartbeat_consumer.consume(1000, timeout=0.01)
            received_s = self.clock.monotonic()
            for msg in batch:
                error = msg.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        # Beats may have been missed: judge nobody until a full
                        # dead_after of uninterrupted reading has passed again.
                        log.warning("heartbeat consumer error: %s", error)
                        self.reading_since = received_s
                    continue
                if msg.value():
                    self._beat(
                        msg.value() or b"",
                        msg.partition() or 0,
                        msg.offset() or 0,
                        received_s,
                        broker_stamp(msg.timestamp()),
                        msg.key(),
                    )
            if len(batch) < 1000:
                break
        self._drained_s = started

    def _beat(
        self,
        raw: bytes,
        partition: int,
        offset: int,
        received_s: float,
        appended_ms: int | None = None,
        beat_key: bytes | None = None,
    ) -> None:
        known = self.workers.get(beat_key.decode(errors="replace")) if beat_key else None
        skim = known is not None and self._skims(known, received_s)
        try:
            beat = HEARTBEAT.decode_without(raw, "running") if skim else HEARTBEAT.decode(raw)
            if skim and self.workers.get(beat.worker_id) is not known:
                skim, beat = False, HEARTBEAT.decode(raw)  # keyed as another worker
        except CodecError as exc:
            log.error("undecodable heartbeat: %s", exc)
            return
        worker_id = beat.worker_id
        # The broker's append time orders beats across partitions (a forged stamp must
        # not); the beat's own stamp only where the topic is not broker-stamped.
        mark = BeatMark(partition, offset, beat.at_ms if appended_ms is None else appended_ms)
        info = self.workers.get(worker_id)
        if info is not None and not newer(info.mark, mark):
            return  # an older beat (replay, reordering)
        offer = self.settings.worker_limits.bound(
            _capacity(beat.capacity), _capacity(beat.free), beat.labels
        )
        if info is None:
            info = WorkerInfo(worker_id, offer.capacity, offer.free, offer.labels, mark, received_s)
            self.workers[worker_id] = info
        if offer.cut:
            metrics.WORKER_OFFERS_BOUNDED.inc()
            if offer.cut != info.cut:  # once per change, not once per beat
                log.warning(
                    "worker %s offers more than allowed: %s", worker_id, "; ".join(offer.cut)
                )
        info.cut = offer.cut
        if info.dead:
            log.warning("worker %s is back after being declared dead", worker_id)
            metrics.WORKER_VERDICTS.labels("back").inc()
        info.capacity, info.free, info.mark, info.received_s, info.dead = (
            offer.capacity,
            offer.free,
            mark,
            received_s,
            False,
        )
        info.labels = offer.labels
        info.beat_ms, info.taken_back = appended_ms, False
        info.start_bound_ms = start_bound(
            info.start_bound_ms, beat.armed_ms, appended_ms, self.config.lease_bound_ms
        )
        if skim:
            info.unlisted = raw
            return
        running = {(r.run_id, r.attempt) for r in beat.running}
        info.running, info.listed_s, info.unlisted = running, received_s, b""
        for key, (_, _, placed_s) in list(info.reserved.items()):
            if key in running:
                info.release(key)  # the worker's own free figure now includes it
            elif placed_s + REFUSAL_MARGIN_S < self._fetched_after_s:
                # Placed well before this beat reached us and not held: the worker handed
                # it back (no room) or lost it. Its free figure is the news now. The worker
                # may still have claimed it unseen (a view a moment old): should it die,
                # the verdict names this attempt too, until the reservation would have
                # ended.
                info.maybe[key] = info.reserved[key][1]
                info.release(key)

    @staticmethod
    def _skims(info: WorkerInfo, received_s: float) -> bool:
        """Whether to read this worker's next beat without its list (`LIST_EVERY_S`)."""
        return len(info.running) >= LONG_LIST and received_s - info.listed_s < LIST_EVERY_S


def _capacity(offered: WorkerCapacity) -> Capacity:
    return Capacity(offered.cpu, offered.memory_mb, offered.gpu)


def start_bound(
    known: int | None, armed_ms: int | None, appended_ms: int | None, lease_bound_ms: int
) -> int | None:
    """The latest start time a worker may have started a run at, after one more beat:
    the highest horizon so far, as an incarnation restarted within the arming margin
    arms from a clock that may read earlier than its predecessor's, and a beat without
    a horizon (a worker from before arming) is bounded by its lease only."""
    if armed_ms is not None:
        bound: int | None = armed_ms
    elif appended_ms is not None:
        bound = appended_ms + lease_bound_ms
    else:
        bound = None
    if bound is None or known is None:
        return known if bound is None else bound
    return max(known, bound)

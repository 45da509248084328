"""The dispatcher's placements: the `dispatch` records queued, each placed by best fit
against the workers' free resources minus this dispatcher's reservations, sealed and sent
to the worker's inbox; a run no worker could ever fit failed; reservations expired; and
what must be placed again at once (a worker's handback, a suspected worker's unclaimed
placements).
"""

from __future__ import annotations

import logging
from dataclasses import replace

from confluent_kafka import KafkaException

from schemas.codec import DISPATCH, JOB_LOG, WORKER_INBOX, CodecError
from schemas.records import DispatchFailed, DispatchRequest, RunReleased, WorkerAssignment
from streams import metrics
from streams.core.placement import Item, could_ever_fit, spread_fit
from streams.core.seals import seal
from streams.dispatcher_kernel import DispatcherKernel, WorkerInfo
from streams.placement_key import placement_key

log = logging.getLogger("cronlog.dispatcher")
_PLACED = metrics.PLACEMENTS.labels("placed")
_NEVER_FITS = metrics.PLACEMENTS.labels("never_fits")


class Placing(DispatcherKernel):
    """Places what waits, and places again what came back or may be lost."""

    def _read_releases(self) -> None:
        """Assignments a worker had no room for: placed again at once, elsewhere (the
        worker's booking of it stays until its next heartbeat). A release only names a
        run: it counts when this dispatcher placed that attempt on that worker, so a
        worker can make it place again only what it placed there. One not taken (another
        dispatcher's, or read after a restart) is left to the claim deadline; that is
        why these are read from the end, with no group and no commits."""
        for msg in self.release_consumer.consume(500, timeout=0):
            if msg.error() is not None or not msg.value():
                continue
            try:
                back = JOB_LOG.decode(msg.value() or b"")
            except CodecError as exc:
                log.warning("undecodable release skipped: %s", exc)
                continue
            if not isinstance(back, RunReleased):
                continue
            key = (back.run_id, back.attempt)
            placed = self.assigned.get(key)
            if placed is None or placed[1] != back.worker_id:
                continue
            del self.assigned[key]
            self._place_again(placed[0])

    def _place_again(self, request: DispatchRequest) -> None:
        pending = f"{request.run_id}#{request.attempt}"
        if pending not in self.pending:
            self.pending[pending] = request
            self.queue.push(Item(pending, request.resources, request.priority, request.owner))

    def _take_back(self, now_s: float) -> None:
        """A worker suspected (silent for `suspect_after_s`) claims nothing more in time
        if it is dead: what this dispatcher placed there and no beat listed yet is placed
        again elsewhere now, not at the claim deadline. Should the worker be alive after
        all, the ledger grants the first of the two claims (both placements are sealed)
        and refuses the other; its booking stays until a beat comes, so nothing goes
        there again meanwhile."""
        for info in self.workers.values():
            if info.dead or info.taken_back or not self.liveness.suspected(info.received_s, now_s):
                continue
            info.taken_back = True
            listed = self._held(info) if info.unlisted else set()  # a skimmed beat's list
            again = [
                key
                for key in info.reserved
                if key not in listed
                and (placed := self.assigned.get(key)) is not None
                and placed[1] == info.worker_id
            ]
            for key in again:
                self._place_again(self.assigned.pop(key)[0])
            if again:
                metrics.PLACEMENTS.labels("taken_back").inc(len(again))
                log.warning(
                    "worker %s: no beat received for %.1f s: suspected, %d unclaimed "
                    "placements placed again",
                    info.worker_id,
                    now_s - info.received_s,
                    len(again),
                )

    # -- queueing and placing ----------------------------------------------------------------
    def _queue(self, raw: bytes, where: tuple[int, int] | None = None) -> bool:
        """Queue a dispatch record for placement; False if there is nothing to place."""
        if not raw:
            return False
        try:
            request = DISPATCH.decode(raw)
        except CodecError as exc:
            log.error("undecodable dispatch record: %s", exc)
            return False
        key = f"{request.run_id}#{request.attempt}"
        if key in self.pending:
            self.queue.remove(key)
            replaced = self.origin.pop(key, None)
            if replaced is not None:
                self.progress.handled(*replaced)  # this newer record stands for it
        self.pending[key] = request
        if where is not None:
            self.origin[key] = where
        self.queue.push(Item(key, request.resources, request.priority, request.owner))
        return True

    def _alive(self, now_s: float) -> list[WorkerInfo]:
        return [
            w
            for w in self.workers.values()
            if not w.dead and not self.liveness.suspected(w.received_s, now_s)
        ]

    def _place(self, now: int) -> None:
        if not len(self.queue):
            return
        alive = self._alive(self.clock.monotonic())

        def fits(item: Item) -> bool:
            request = self.pending[item.key]
            start, key = request.not_before_ms, (request.run_id, request.attempt)
            # A worker that handed this run back (no room, by its own reckoning) still
            # holds the booking of that placement: not there again until its next
            # heartbeat says what it has free.
            candidates = [w.view(start) for w in alive if key not in w.reserved]
            second = start // 1000
            chosen = spread_fit(
                item.need,
                candidates,
                self.placed.get(second, {}),
                self.config.spread_starts_above,
            )
            if chosen is None:
                return False
            self._assign(
                self.pending.pop(item.key), chosen.worker_id, now, self.origin.pop(item.key, None)
            )
            return True

        self.queue.drain(fits)
        settled = self.clock.monotonic() - self.started > self.config.settle_s
        if settled and self.workers:
            everyone = [w.view(now) for w in self.workers.values() if not w.dead]
            for key, request in list(self.pending.items()):
                if everyone and not could_ever_fit(request.resources, everyone):
                    self.queue.remove(key)
                    del self.pending[key]
                    _NEVER_FITS.inc()
                    self._send(
                        request.job_id,
                        DispatchFailed(
                            request.job_id,
                            request.run_id,
                            request.attempt,
                            f"no worker could ever fit cpu={request.resources.cpu} "
                            f"memory_mb={request.resources.memory_mb} gpu={request.resources.gpu} "
                            f"labels={dict(request.resources.labels)}",
                            now,
                        ),
                        self.origin.pop(key, None),
                    )

    def _assign(
        self, request: DispatchRequest, worker_id: str, now: int, where: tuple[int, int] | None
    ) -> None:
        info = self.workers[worker_id]
        _PLACED.inc()
        key = (request.run_id, request.attempt)
        self.assigned.pop(key, None)  # kept in the order made: `_expire` reads the front
        self.assigned[key] = (request, worker_id, now)
        placed = self.placed.setdefault(request.not_before_ms // 1000, {})
        placed[worker_id] = placed.get(worker_id, 0) + 1
        info.reserve(
            (request.run_id, request.attempt),
            request.resources,
            request.not_before_ms,
            max(now, request.not_before_ms) + self.config.reservation_ms,
            self.clock.monotonic(),
        )
        delivered = self._handled_when_delivered(where, f"assignment of {request.run_id}")
        try:
            inbox = self.inboxes.topic(worker_id)
        except KafkaException as exc:  # unsent, as if undelivered: placed again
            delivered(exc.args[0], None)  # type: ignore[arg-type]
            return
        self._produce(
            inbox,
            worker_id,
            WORKER_INBOX.encode(WorkerAssignment(worker_id, now, self._sealed(request, worker_id))),
            delivered,
        )

    def _sealed(self, request: DispatchRequest, worker_id: str) -> DispatchRequest:
        """The copy of `request` assigned to `worker_id`: with the seal of that placement,
        without which the ledger grants the worker no claim (streams/core/seals.py)."""
        if self.key is None:
            self.key = placement_key(self.settings, self._stop, self.clients)
        mark = seal(self.key, request.run_id, request.attempt, worker_id)
        return replace(request, placement=mark)

    def _expire(self, now: int) -> None:
        for second in [s for s in self.placed if s < now // 1000 - 60]:
            del self.placed[second]
        # The oldest assignments first (`_assign`): stop at the first still kept, not
        # scan them all each pass (35 s of them at 1,000 runs/s is 35,000).
        forget = now - self.config.reservation_ms
        while self.assigned:
            key, (_, _, at) = next(iter(self.assigned.items()))
            if at >= forget:
                break
            del self.assigned[key]
        for info in self.workers.values():
            for key, (_, until, _) in list(info.reserved.items()):
                if until <= now:
                    info.release(key)
            for key, until in list(info.maybe.items()):
                if until <= now:
                    del info.maybe[key]

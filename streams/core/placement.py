"""Placement of runs on workers, and the fair wait queue. Pure.

docs/architecture.md, "Dispatch and workers", has the policy in prose.

Vocabulary:

- A worker has a total `capacity` and a `free` capacity (what placement currently believes
  is left after the reservations it made); a run needs `Resources` (cpu, memory_mb, gpu and
  required labels). A run fits a worker when every required label ``k=v`` is offered by the
  worker and cpu, memory and gpu all fit the free capacity (cpu with an epsilon of
  `CPU_EPSILON`, so that sums of fractions such as ``0.1 + 0.2`` do not spuriously fail).

- **Leftover score** (`leftover_score`, used by `best_fit`): what remains on the worker after
  the placement, as the tuple ``(leftover_gpu, leftover_cpu / capacity_cpu +
  leftover_memory_mb / capacity_memory_mb)``, compared lexicographically; a normalising term
  whose capacity is 0 counts 0, and the float is rounded to 9 decimals so that equivalent
  configurations tie exactly. Leftover gpu comes first: a run that needs no gpu stays off gpu
  workers while a worker without free gpus fits it, and a gpu run takes the worker whose gpus
  it uses up most tightly. Smaller is a better (tighter) fit; ties go to the smallest
  worker_id.

- **Spreading starts** (`spread_fit`, what the dispatcher uses): best fit packs runs onto
  the tightest worker, which is right for resources but not for a burst whose runs all fit
  one worker: that worker's one loop starts them one after another (some 750 process
  starts a second per executor) while the others idle. So a worker that already has
  `spread_above` runs placed to start in the run's second is passed over while a fitting
  worker has fewer; when every fitting worker has that many, the one with the fewest takes
  it (then the best fit): the burst is dealt out evenly.

- **Item size** (`item_size`, used to order batches): the dominant share
  ``max(cpu / scale.cpu, memory_mb / scale.memory_mb, gpu / scale.gpu)`` where `scale` is the
  componentwise maximum of the workers' total capacities (a term whose scale is 0 counts 0).
  Equal sizes are ordered by (cpu, memory_mb, gpu) descending, then by input position.

- **Fairness across owners**: within one priority, owners take turns (weighted round-robin;
  an owner of weight w gets w turns for every turn of an owner of weight 1). Priorities are
  strict: every item of a higher priority is considered before any of a lower one.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from schemas.spec import Resources

CPU_EPSILON = 1e-9
N = TypeVar("N", int, float)
Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Capacity:
    """Free or total resources of a worker."""

    cpu: float
    memory_mb: int
    gpu: int

    def fits(self, need: Resources) -> bool:
        """cpu, memory and gpu of `need` all within this capacity (labels are not checked)."""
        return (
            need.cpu <= self.cpu + CPU_EPSILON
            and need.memory_mb <= self.memory_mb
            and need.gpu <= self.gpu
        )

    def minus(self, need: Resources) -> Capacity:
        """Capacity left after reserving `need` (not clamped: check `fits` first)."""
        return Capacity(self.cpu - need.cpu, self.memory_mb - need.memory_mb, self.gpu - need.gpu)

    def plus(self, need: Resources) -> Capacity:
        """Capacity after releasing a reservation of `need`."""
        return Capacity(self.cpu + need.cpu, self.memory_mb + need.memory_mb, self.gpu + need.gpu)


@dataclass(frozen=True, slots=True)
class WorkerView:
    worker_id: str
    capacity: Capacity  # total
    free: Capacity  # as the placement currently believes (after reservations)
    labels: Labels

    def admits(self, need: Resources) -> bool:
        """`need` fits the free capacity now and the worker offers its labels."""
        return self.free.fits(need) and labels_match(need.labels, self.labels)


@dataclass(frozen=True, slots=True)
class Bounded:
    """A heartbeat's offer as placement may believe it, and what was cut from it."""

    capacity: Capacity
    free: Capacity
    labels: Labels
    cut: tuple[str, ...]  # one phrase per bound applied, empty when the offer was within


@dataclass(frozen=True, slots=True)
class WorkerLimits:
    """The most placement believes of any worker's heartbeat: operator configuration
    (CRONLOG_WORKER_MAX_CPU, _MAX_MEMORY_MB, _MAX_GPU, CRONLOG_WORKER_LABELS), not the
    worker's word. Without them a worker could advertise a huge capacity, or every label,
    and draw the runs of the whole installation to itself. None: unbounded.

    `labels` holds the allowed offers, each ``key=value`` or ``key=*`` (any value).
    """

    cpu: float | None = None
    memory_mb: int | None = None
    gpu: int | None = None
    labels: frozenset[str] | None = None

    def bound(self, capacity: Capacity, free: Capacity, labels: Labels) -> Bounded:
        """Total capacity cut to the limits; free is what is left of the bounded total
        after what the worker says it uses (total - free), within [0, total]; labels
        outside the allowed offers dropped."""
        cut: list[str] = []
        cpu = _limit(capacity.cpu, self.cpu, "cpu", cut)
        memory_mb = _limit(capacity.memory_mb, self.memory_mb, "memory_mb", cut)
        gpu = _limit(capacity.gpu, self.gpu, "gpu", cut)
        total = Capacity(float(cpu), memory_mb, gpu)
        left = Capacity(
            _left(cpu, capacity.cpu, free.cpu),
            _left(memory_mb, capacity.memory_mb, free.memory_mb),
            _left(gpu, capacity.gpu, free.gpu),
        )
        offered = labels
        if self.labels is not None:
            allowed = self.labels
            offered = tuple(
                (k, v) for k, v in labels if f"{k}={v}" in allowed or f"{k}=*" in allowed
            )
            dropped = [f"{k}={v}" for k, v in labels if (k, v) not in offered]
            if dropped:
                cut.append(f"labels {', '.join(dropped)} not allowed")
        return Bounded(total, left, offered, tuple(cut))


UNBOUNDED = WorkerLimits()


def _left(total: N, said: N, free: N) -> N:
    """Free of a bounded `total`: what the worker said is free when its total was not cut
    (no float round trip), else the bounded total less what it says it uses; in [0, total]."""
    left = free if total == said else total - (said - free)
    return min(max(left, type(total)(0)), total)


def _limit(value: N, limit: N | None, name: str, cut: list[str]) -> N:
    if limit is None or value <= limit:
        return value
    cut.append(f"{name} {value} above the limit {limit}")
    return limit


@dataclass(frozen=True, slots=True)
class Item:
    """Something to place: a run (key = run id) with its needs, priority and owner."""

    key: str
    need: Resources
    priority: int = 0
    owner: str = ""


def labels_match(required: Labels, offered: Labels) -> bool:
    """Every required ``(key, value)`` pair is among the offered ones."""
    if not required:
        return True
    have = set(offered)
    return all(pair in have for pair in required)


def leftover_score(need: Resources, worker: WorkerView) -> tuple[int, float]:
    """How much room `worker` has left after taking `need` (module docstring); lower is
    tighter. Meaningful only when the worker admits `need`."""
    cap, free = worker.capacity, worker.free
    cpu = (free.cpu - need.cpu) / cap.cpu if cap.cpu > 0 else 0.0
    mem = (free.memory_mb - need.memory_mb) / cap.memory_mb if cap.memory_mb > 0 else 0.0
    return (free.gpu - need.gpu, round(cpu + mem, 9))


def best_fit(need: Resources, workers: Iterable[WorkerView]) -> WorkerView | None:
    """The worker whose free slot is the smallest that fits `need` (labels honoured): the
    minimum `leftover_score`, ties broken by worker_id. None when no worker fits now."""
    best: WorkerView | None = None
    best_key: tuple[int, float, str] | None = None
    for worker in workers:
        if not worker.admits(need):
            continue
        key = (*leftover_score(need, worker), worker.worker_id)
        if best_key is None or key < best_key:
            best, best_key = worker, key
    return best


def spread_fit(
    need: Resources, workers: Iterable[WorkerView], starts: Mapping[str, int], spread_above: int
) -> WorkerView | None:
    """`best_fit` among the fitting workers with fewer than `spread_above` runs placed to
    start in the run's second (`starts`: worker_id -> that count); when none has fewer,
    the fitting worker with the fewest, ties by leftover score then worker_id (module
    docstring). None when no worker fits now."""
    fitting = [w for w in workers if w.admits(need)]
    under = [w for w in fitting if starts.get(w.worker_id, 0) < spread_above]
    if under:
        return best_fit(need, under)
    if not fitting:
        return None
    return min(
        fitting,
        key=lambda w: (starts.get(w.worker_id, 0), *leftover_score(need, w), w.worker_id),
    )


def could_ever_fit(need: Resources, workers: Iterable[WorkerView]) -> bool:
    """Some worker's TOTAL capacity fits `need` and it offers the labels: the run can be
    placed once enough capacity is free, as opposed to never with the current fleet."""
    return any(w.capacity.fits(need) and labels_match(need.labels, w.labels) for w in workers)


def size_scale(workers: Iterable[WorkerView]) -> Capacity:
    """Componentwise maximum of the workers' total capacities (the unit of `item_size`)."""
    cpu, mem, gpu = 0.0, 0, 0
    for w in workers:
        cpu = max(cpu, w.capacity.cpu)
        mem = max(mem, w.capacity.memory_mb)
        gpu = max(gpu, w.capacity.gpu)
    return Capacity(cpu, mem, gpu)


def item_size(need: Resources, scale: Capacity) -> float:
    """Dominant share of `need` relative to `scale` (module docstring)."""
    shares = (
        need.cpu / scale.cpu if scale.cpu > 0 else 0.0,
        need.memory_mb / scale.memory_mb if scale.memory_mb > 0 else 0.0,
        need.gpu / scale.gpu if scale.gpu > 0 else 0.0,
    )
    return max(shares)


def _size_key(need: Resources, scale: Capacity) -> tuple[float, float, int, int]:
    """Sort key for decreasing size."""
    return (-item_size(need, scale), -need.cpu, -need.memory_mb, -need.gpu)


def _check_unique(items: Sequence[Item], workers: Sequence[WorkerView]) -> None:
    if len({i.key for i in items}) != len(items):
        raise ValueError("duplicate item keys")
    if len({w.worker_id for w in workers}) != len(workers):
        raise ValueError("duplicate worker ids")


def ffd_order(items: Sequence[Item], workers: Sequence[WorkerView]) -> list[Item]:
    """The order in which `first_fit_decreasing` considers `items`: decreasing size."""
    scale = size_scale(workers)
    order = sorted(range(len(items)), key=lambda i: (_size_key(items[i].need, scale), i))
    return [items[i] for i in order]


def first_fit_decreasing(
    items: Sequence[Item], workers: Sequence[WorkerView]
) -> tuple[dict[str, str], list[Item]]:
    """Classic first-fit decreasing ("schedule jobs on a rack"): items by decreasing
    `item_size`, each into the FIRST worker (in the given order) that admits it, whose free
    capacity then shrinks by the item's need. Never over-commits a worker's `free`.

    Returns (item key -> worker_id, unplaced items in input order). Raises ValueError on
    duplicate item keys or worker ids."""
    _check_unique(items, workers)
    free = [w.free for w in workers]
    placed: dict[str, str] = {}
    for item in ffd_order(items, workers):
        for i, w in enumerate(workers):
            if free[i].fits(item.need) and labels_match(item.need.labels, w.labels):
                free[i] = free[i].minus(item.need)
                placed[item.key] = w.worker_id
                break
    return placed, [i for i in items if i.key not in placed]


def _weight(weights: Mapping[str, int] | None, owner: str) -> int:
    w = 1 if weights is None else weights.get(owner, 1)
    if w < 1:
        raise ValueError(f"weight of owner {owner!r} must be >= 1, got {w}")
    return w


def batch_order(
    items: Sequence[Item],
    workers: Sequence[WorkerView],
    weights: Mapping[str, int] | None = None,
) -> list[Item]:
    """The order in which `place_batch` considers `items`: priority (higher first); within a
    priority, weighted round-robin across owners, where each owner's items are taken in
    decreasing size and an owner of weight w contributes w items per round; within a round,
    decreasing size; then input position."""
    scale = size_scale(workers)
    by_owner: dict[tuple[int, str], list[int]] = {}
    for i, item in enumerate(items):
        by_owner.setdefault((item.priority, item.owner), []).append(i)
    round_of: dict[int, int] = {}
    for (_, owner), indices in by_owner.items():
        indices.sort(key=lambda i: (_size_key(items[i].need, scale), i))
        w = _weight(weights, owner)
        for rank, i in enumerate(indices):
            round_of[i] = rank // w
    order = sorted(
        range(len(items)),
        key=lambda i: (-items[i].priority, round_of[i], _size_key(items[i].need, scale), i),
    )
    return [items[i] for i in order]


def place_batch(
    items: Sequence[Item],
    workers: Sequence[WorkerView],
    weights: Mapping[str, int] | None = None,
) -> tuple[dict[str, str], list[Item]]:
    """What the dispatcher uses for a batch: items in `batch_order` (priority, fair share
    across owners, decreasing size), each placed by `best_fit` against the running free
    capacities. Never over-commits a worker's `free`.

    Returns (item key -> worker_id, unplaced items in input order). Raises ValueError on
    duplicate item keys or worker ids, or a weight below 1."""
    _check_unique(items, workers)
    current = {w.worker_id: w for w in workers}
    placed: dict[str, str] = {}
    for item in batch_order(items, workers, weights):
        chosen = best_fit(item.need, current.values())
        if chosen is None:
            continue
        current[chosen.worker_id] = replace(chosen, free=chosen.free.minus(item.need))
        placed[item.key] = chosen.worker_id
    return placed, [i for i in items if i.key not in placed]


class FairQueue:
    """Runs that fit nowhere now wait here.

    Order: priority (higher first, strictly); within a priority, weighted fair queueing
    across owners (`weights`, default 1 each): each active owner has a count of items drained
    since it became active, the owner with the least ``count / weight`` goes next (ties: the
    owner that became active first), and an owner's items go first in, first out. An owner
    that becomes active starts level with the least-served active owner (no credit for idle
    time, no debt from earlier bursts), so a newcomer waits at most one round. The counts
    span priorities: service at a high priority counts against an owner at a low one.
    """

    def __init__(self, weights: Mapping[str, int] | None = None) -> None:
        self._weights = dict(weights or {})
        for owner in self._weights:
            _weight(self._weights, owner)
        self._items: dict[str, Item] = {}
        # priority -> owner -> key -> item, each innermost dict in push (FIFO) order
        self._levels: dict[int, dict[str, dict[str, Item]]] = {}
        self._pending: dict[str, int] = {}  # active owner -> number of queued items
        self._served: dict[str, int] = {}  # active owner -> items drained since activation
        self._rank: dict[str, int] = {}  # active owner -> activation sequence (tie-break)
        self._seq = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[Item]:
        """The items in the order `drain` would offer them if every one fitted."""
        return iter(self._select(lambda _: True, {}))

    def get(self, key: str) -> Item | None:
        return self._items.get(key)

    def weight(self, owner: str) -> int:
        return _weight(self._weights, owner)

    def push(self, item: Item) -> None:
        """Queue `item` behind its owner's earlier items of the same priority. Raises
        ValueError if its key is already queued."""
        if item.key in self._items:
            raise ValueError(f"item {item.key!r} is already queued")
        if item.owner not in self._pending:
            self._activate(item.owner)
        self._items[item.key] = item
        self._levels.setdefault(item.priority, {}).setdefault(item.owner, {})[item.key] = item
        self._pending[item.owner] += 1

    def remove(self, key: str) -> Item | None:
        """Take the item out (a cancelled or otherwise placed run); None if not queued."""
        item = self._items.pop(key, None)
        if item is None:
            return None
        level = self._levels[item.priority]
        fifo = level[item.owner]
        del fifo[key]
        if not fifo:
            del level[item.owner]
            if not level:
                del self._levels[item.priority]
        self._pending[item.owner] -= 1
        if self._pending[item.owner] == 0:
            del self._pending[item.owner], self._served[item.owner], self._rank[item.owner]
        return item

    def drain(self, fits: Callable[[Item], bool]) -> list[Item]:
        """Remove and return, in fair order, the items for which `fits` returns True.

        `fits` is called in that same order, each item at most once (capacity only shrinks
        during a drain, so an item that did not fit is not offered again), and may reserve
        capacity as a side effect; it must not modify the queue. Lower priorities are still
        offered when a higher-priority item does not fit (backfilling). If `fits` raises,
        the queue is left unchanged."""
        served: dict[str, int] = {}
        taken = self._select(fits, served)
        self._served.update(served)
        for item in taken:
            self.remove(item.key)
        return taken

    def _activate(self, owner: str) -> None:
        w = self.weight(owner)
        start = 0
        if self._served:
            # the least service of an active owner, count / weight, as an exact fraction
            num, den = min(
                ((s, self.weight(o)) for o, s in self._served.items()),
                key=lambda p: p[0] / p[1],
            )
            start = -((-num * w) // den)  # ceil(num / den * w)
        self._pending[owner] = 0
        self._served[owner] = start
        self._rank[owner] = self._seq
        self._seq += 1

    def _select(self, fits: Callable[[Item], bool], served: dict[str, int]) -> list[Item]:
        """The fair walk behind `drain`: the accepted items in order; `served` receives the
        updated counts of the owners that had items accepted."""
        taken: list[Item] = []
        for priority in sorted(self._levels, reverse=True):
            level = self._levels[priority]
            queues = {owner: iter(list(fifo.values())) for owner, fifo in level.items()}
            heap = [(self._key(o, served), self._rank[o], o) for o in level]
            heapq.heapify(heap)
            while heap:
                _, rank, owner = heapq.heappop(heap)
                for item in queues[owner]:
                    if fits(item):
                        taken.append(item)
                        served[owner] = served.get(owner, self._served[owner]) + 1
                        heapq.heappush(heap, (self._key(owner, served), rank, owner))
                        break
        return taken

    def _key(self, owner: str, served: Mapping[str, int]) -> float:
        # float division of integers is correctly rounded: equal ratios give equal keys
        return served.get(owner, self._served[owner]) / self.weight(owner)

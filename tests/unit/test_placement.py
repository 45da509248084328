"""Placement (best fit, first-fit decreasing, batches) and the fair wait queue. Pure."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.spec import Resources
from streams.core.placement import (
    Capacity,
    FairQueue,
    Item,
    WorkerLimits,
    WorkerView,
    batch_order,
    best_fit,
    could_ever_fit,
    first_fit_decreasing,
    item_size,
    labels_match,
    leftover_score,
    place_batch,
    spread_fit,
)

Labels = tuple[tuple[str, str], ...]
EPS = 1e-6


def need(cpu: float = 0.0, mem: int = 0, gpu: int = 0, labels: Labels = ()) -> Resources:
    return Resources(cpu=cpu, memory_mb=mem, gpu=gpu, labels=labels)


def worker(
    wid: str,
    cpu: float,
    mem: int,
    gpu: int = 0,
    labels: Labels = (),
    free: tuple[float, int, int] | None = None,
) -> WorkerView:
    total = Capacity(cpu, mem, gpu)
    return WorkerView(wid, total, Capacity(*free) if free else total, labels)


def item(
    key: str, cpu: float = 0.0, mem: int = 0, gpu: int = 0, prio: int = 0, owner: str = ""
) -> Item:
    return Item(key, need(cpu, mem, gpu), prio, owner)


# -- Capacity, labels --------------------------------------------------------------------


def test_capacity_fits_each_resource_inclusively() -> None:
    cap = Capacity(2.0, 1024, 1)
    assert cap.fits(need(2.0, 1024, 1))
    assert not cap.fits(need(2.01, 0, 0))
    assert not cap.fits(need(0, 1025, 0))
    assert not cap.fits(need(0, 0, 2))
    assert cap.fits(need())


def test_capacity_cpu_uses_an_epsilon() -> None:
    free = Capacity(1.0, 0, 0).minus(need(0.7))  # 0.30000000000000004
    assert free.fits(need(0.3))
    assert Capacity(0.1 + 0.2, 0, 0).fits(need(0.3))
    assert not Capacity(0.3, 0, 0).fits(need(0.3001))


def test_capacity_minus_plus_round_trip() -> None:
    cap = Capacity(4.0, 4096, 2)
    n = need(1.5, 1000, 1, (("zone", "a"),))
    assert cap.minus(n) == Capacity(2.5, 3096, 1)
    assert cap.minus(n).plus(n) == cap


def test_labels_match() -> None:
    offered = (("disk", "ssd"), ("zone", "a"))
    assert labels_match((), offered)
    assert labels_match((), ())
    assert labels_match((("zone", "a"),), offered)
    assert labels_match(offered, offered)
    assert not labels_match((("zone", "b"),), offered)
    assert not labels_match((("rack", "1"),), offered)
    assert not labels_match((("zone", "a"),), ())


def test_worker_admits_needs_free_room_and_labels() -> None:
    w = worker("w", 4, 1024, labels=(("zone", "a"),), free=(1.0, 512, 0))
    assert w.admits(need(1, 512, 0, (("zone", "a"),)))
    assert not w.admits(need(2, 0))  # total has room, free has not
    assert not w.admits(need(0.5, 0, 0, (("zone", "b"),)))


# -- best_fit -------------------------------------------------------------------------------


def test_best_fit_takes_the_smallest_slot_that_fits() -> None:
    workers = [
        worker("big", 8, 8192),
        worker("small", 8, 8192, free=(1.0, 1024, 0)),
        worker("tiny", 8, 8192, free=(0.25, 4096, 0)),
    ]
    chosen = best_fit(need(0.5, 512), workers)
    assert chosen is not None
    assert chosen.worker_id == "small"


def test_best_fit_scores_leftover_relative_to_capacity() -> None:
    # 2 cpu left of 16 is a tighter fit than 1 cpu left of 2: leftover is relative
    a = worker("a", 2, 1000, free=(1.5, 500, 0))
    b = worker("b", 16, 1000, free=(2.5, 500, 0))
    assert leftover_score(need(0.5, 0), a) == (0, 1.0)  # 1/2 + 500/1000
    assert leftover_score(need(0.5, 0), b) == (0, 0.625)  # 2/16 + 500/1000
    chosen = best_fit(need(0.5, 0), [a, b])
    assert chosen is not None
    assert chosen.worker_id == "b"


def test_best_fit_honours_labels() -> None:
    workers = [
        worker("a", 1, 512, labels=(("zone", "a"),)),
        worker("b", 8, 8192, labels=(("zone", "b"),)),
    ]
    chosen = best_fit(need(0.5, 256, 0, (("zone", "b"),)), workers)
    assert chosen is not None
    assert chosen.worker_id == "b"
    assert best_fit(need(0.5, 256, 0, (("zone", "c"),)), workers) is None


def test_best_fit_keeps_gpu_workers_for_gpu_runs() -> None:
    cpu_box = worker("cpu", 16, 16384)
    gpu_box = worker("gpu", 2, 2048, gpu=1)  # a much tighter cpu/memory fit
    chosen = best_fit(need(1, 1024), [gpu_box, cpu_box])
    assert chosen is not None
    assert chosen.worker_id == "cpu"
    chosen = best_fit(need(1, 1024, 1), [gpu_box, cpu_box])
    assert chosen is not None
    assert chosen.worker_id == "gpu"


def test_best_fit_gpu_run_uses_up_gpus_tightly() -> None:
    four = worker("four", 8, 8192, gpu=4)
    one = worker("one", 32, 65536, gpu=1)
    chosen = best_fit(need(1, 1024, 1), [four, one])
    assert chosen is not None
    assert chosen.worker_id == "one"
    chosen = best_fit(need(1, 1024, 2), [four, one])
    assert chosen is not None
    assert chosen.worker_id == "four"


def test_best_fit_breaks_ties_by_worker_id_and_returns_none_when_nothing_fits() -> None:
    workers = [worker("w2", 4, 4096), worker("w1", 4, 4096), worker("w3", 4, 4096)]
    chosen = best_fit(need(1, 1024), workers)
    assert chosen is not None
    assert chosen.worker_id == "w1"
    assert best_fit(need(5, 0), workers) is None
    assert best_fit(need(0, 0, 1), workers) is None
    assert best_fit(need(), []) is None


# -- could_ever_fit -------------------------------------------------------------------------


def test_could_ever_fit_looks_at_total_capacity_and_labels() -> None:
    busy = worker("busy", 4, 4096, gpu=1, labels=(("zone", "a"),), free=(0.0, 0, 0))
    assert could_ever_fit(need(4, 4096, 1), [busy])
    assert could_ever_fit(need(1, 0, 0, (("zone", "a"),)), [busy])
    assert not could_ever_fit(need(1, 0, 0, (("zone", "b"),)), [busy])
    assert not could_ever_fit(need(5, 0), [busy])
    assert not could_ever_fit(need(0, 0, 2), [busy])
    assert not could_ever_fit(need(), [])


def test_item_size_is_the_dominant_share() -> None:
    scale = Capacity(8.0, 1000, 2)
    assert item_size(need(2, 100), scale) == 0.25
    assert item_size(need(1, 500), scale) == 0.5
    assert item_size(need(0, 0, 2), scale) == 1.0
    assert item_size(need(1, 0, 1), Capacity(4.0, 0, 0)) == 0.25  # zero scale counts 0


# -- first_fit_decreasing ---------------------------------------------------------------------


def test_ffd_places_largest_first_into_the_first_worker_that_fits() -> None:
    workers = [worker("w1", 4, 4096), worker("w2", 4, 4096)]
    items = [item("s1", 1), item("l", 3), item("s2", 1), item("m", 2), item("s3", 1)]
    placed, unplaced = first_fit_decreasing(items, workers)
    # order l(3) m(2) s1 s2 s3: l->w1, m->w2, s1->w1, s2->w2, s3->w2
    assert placed == {"l": "w1", "m": "w2", "s1": "w1", "s2": "w2", "s3": "w2"}
    assert unplaced == []


def test_ffd_beats_first_fit_in_input_order() -> None:
    # in input order, the small items would fragment both workers and strand the big one
    workers = [worker("w1", 4, 0), worker("w2", 4, 0)]
    items = [item("a", 1), item("b", 1), item("c", 1), item("d", 1), item("big", 4)]
    placed, unplaced = first_fit_decreasing(items, workers)
    assert placed["big"] == "w1"
    assert unplaced == []


def test_ffd_respects_labels_gpu_and_reports_unplaced_in_input_order() -> None:
    workers = [
        worker("plain", 8, 8192),
        worker("gpu", 8, 8192, gpu=1, labels=(("zone", "a"),)),
    ]
    items = [
        Item("z", need(1, 0, 0, (("zone", "a"),))),
        Item("g1", need(1, 0, 1)),
        Item("g2", need(1, 0, 1)),
        Item("x", need(1, 0, 0, (("zone", "b"),))),
        Item("p", need(1, 0)),
    ]
    placed, unplaced = first_fit_decreasing(items, workers)
    assert placed == {"z": "gpu", "g1": "gpu", "p": "plain"}
    assert [i.key for i in unplaced] == ["g2", "x"]


def test_ffd_starts_from_the_believed_free_capacity() -> None:
    workers = [worker("w1", 4, 4096, free=(0.5, 4096, 0)), worker("w2", 4, 4096)]
    placed, _ = first_fit_decreasing([item("a", 1)], workers)
    assert placed == {"a": "w2"}


def test_duplicate_keys_or_workers_are_rejected() -> None:
    w = worker("w", 1, 1)
    with pytest.raises(ValueError, match="item"):
        first_fit_decreasing([item("a"), item("a")], [w])
    with pytest.raises(ValueError, match="worker"):
        place_batch([item("a")], [w, w])


# -- place_batch ------------------------------------------------------------------------------


def test_place_batch_gives_scarce_capacity_to_higher_priority() -> None:
    workers = [worker("w", 2, 2048)]
    items = [item("low", 2, prio=0), item("high", 2, prio=5)]
    placed, unplaced = place_batch(items, workers)
    assert placed == {"high": "w"}
    assert [i.key for i in unplaced] == ["low"]


def test_place_batch_shares_scarce_capacity_across_owners() -> None:
    workers = [worker("w", 4, 4096)]
    items = [item(f"a{i}", 1, owner="a") for i in range(10)]
    items += [item(f"b{i}", 1, owner="b") for i in range(2)]
    placed, _ = place_batch(items, workers)
    assert Counter(k[0] for k in placed) == {"a": 2, "b": 2}


def test_place_batch_weights_owners() -> None:
    workers = [worker("w", 6, 4096)]
    items = [item(f"a{i}", 1, owner="a") for i in range(10)]
    items += [item(f"b{i}", 1, owner="b") for i in range(10)]
    placed, _ = place_batch(items, workers, weights={"a": 2})
    assert Counter(k[0] for k in placed) == {"a": 4, "b": 2}
    with pytest.raises(ValueError, match="weight"):
        place_batch(items, workers, weights={"a": 0})


def test_place_batch_orders_each_round_by_decreasing_size() -> None:
    workers = [worker("w", 8, 8192)]
    items = [
        item("a-small", 1, owner="a"),
        item("a-big", 4, owner="a"),
        item("b-mid", 2, owner="b"),
        item("b-tiny", 0.5, owner="b"),
        item("c-top", 1, prio=1, owner="c"),
    ]
    order = [i.key for i in batch_order(items, workers)]
    assert order == ["c-top", "a-big", "b-mid", "a-small", "b-tiny"]


def test_place_batch_uses_best_fit() -> None:
    workers = [worker("roomy", 8, 8192), worker("snug", 8, 8192, free=(1.0, 1024, 0))]
    placed, _ = place_batch([item("x", 1, 1024), item("y", 1, 1024)], workers)
    assert placed == {"x": "snug", "y": "roomy"}


# -- FairQueue --------------------------------------------------------------------------------


def keys(items: Sequence[Item]) -> list[str]:
    return [i.key for i in items]


def test_fair_queue_basics() -> None:
    q = FairQueue()
    assert len(q) == 0
    assert "a" not in q
    q.push(item("a", owner="x"))
    q.push(item("b", owner="x"))
    assert len(q) == 2
    assert "a" in q
    assert q.get("a") == item("a", owner="x")
    with pytest.raises(ValueError, match="already"):
        q.push(item("a", owner="y"))
    assert q.remove("a") == item("a", owner="x")
    assert q.remove("a") is None
    assert keys(q.drain(lambda _: True)) == ["b"]
    assert len(q) == 0
    assert list(q) == []


def test_fair_queue_priority_first_then_fifo_per_owner() -> None:
    q = FairQueue()
    for key, prio in [("l1", 0), ("h1", 2), ("m1", 1), ("l2", 0), ("h2", 2)]:
        q.push(item(key, prio=prio, owner="o"))
    assert keys(list(q)) == ["h1", "h2", "m1", "l1", "l2"]
    assert keys(q.drain(lambda _: True)) == ["h1", "h2", "m1", "l1", "l2"]


def test_fair_queue_heavy_owner_cannot_starve_a_light_one() -> None:
    q = FairQueue()
    for i in range(100):
        q.push(item(f"a{i}", owner="A"))
    for i in range(3):
        q.push(item(f"b{i}", owner="B"))
    drained = keys(q.drain(lambda _: True))
    assert set(drained[:6]) >= {"b0", "b1", "b2"}
    assert len(drained) == 103


def test_fair_queue_fairness_holds_across_drains() -> None:
    q = FairQueue()
    for i in range(100):
        q.push(item(f"a{i}", owner="A"))
    for i in range(3):
        q.push(item(f"b{i}", owner="B"))
    got: list[str] = []
    for _ in range(6):  # room for exactly one run per drain
        room = [1]

        def fits(_: Item, room: list[int] = room) -> bool:
            room[0] -= 1
            return room[0] >= 0

        got += keys(q.drain(fits))
    assert got == ["a0", "b0", "a1", "b1", "a2", "b2"]


def test_fair_queue_weights() -> None:
    q = FairQueue(weights={"A": 3})
    for i in range(30):
        q.push(item(f"a{i}", owner="A"))
        q.push(item(f"b{i}", owner="B"))
    first = q.drain(lambda _: True)[:20]
    counts = Counter(i.owner for i in first)
    assert counts["A"] == 15
    assert counts["B"] == 5
    with pytest.raises(ValueError, match="weight"):
        FairQueue(weights={"A": 0})


def test_fair_queue_newcomer_gets_no_credit_for_idle_time() -> None:
    q = FairQueue()
    for i in range(10):
        q.push(item(f"a{i}", owner="A"))
    assert keys(q.drain(lambda i: i.key in {"a0", "a1", "a2", "a3"})) == ["a0", "a1", "a2", "a3"]
    for i in range(10):
        q.push(item(f"b{i}", owner="B"))
    # B starts level with A rather than owed four turns; A (active first) breaks the tie
    assert keys(list(q))[:6] == ["a4", "b0", "a5", "b1", "a6", "b2"]


def test_fair_queue_drain_offers_each_item_once_in_fair_order_and_keeps_the_rest() -> None:
    q = FairQueue()
    for key, cpu, owner in [("a1", 3, "A"), ("a2", 1, "A"), ("b1", 1, "B"), ("b2", 2, "B")]:
        q.push(item(key, cpu, owner=owner))
    room = [3.0]
    offered: list[str] = []

    def fits(i: Item) -> bool:
        offered.append(i.key)
        if i.need.cpu <= room[0]:
            room[0] -= i.need.cpu
            return True
        return False

    assert keys(q.drain(fits)) == ["a1"]
    assert offered == ["a1", "b1", "b2", "a2"]
    assert keys(list(q)) == ["b1", "a2", "b2"]  # A has been served once, B not yet
    assert len(q) == 3
    assert "a1" not in q


def test_fair_queue_backfills_lower_priority_when_higher_does_not_fit() -> None:
    q = FairQueue()
    q.push(item("big", 4, prio=1, owner="A"))
    q.push(item("small", 1, prio=0, owner="B"))
    assert keys(q.drain(lambda i: i.need.cpu <= 2)) == ["small"]
    assert keys(list(q)) == ["big"]


def test_fair_queue_is_unchanged_when_fits_raises() -> None:
    q = FairQueue()
    q.push(item("a", owner="A"))
    q.push(item("b", owner="B"))

    def fits(i: Item) -> bool:
        if i.key == "b":
            raise RuntimeError("boom")
        return True

    with pytest.raises(RuntimeError):
        q.drain(fits)
    assert len(q) == 2
    assert keys(list(q)) == ["a", "b"]


# -- properties ---------------------------------------------------------------------------------

LABEL_POOL: list[tuple[str, str]] = [("disk", "ssd"), ("zone", "a"), ("zone", "b")]
label_sets = st.lists(st.sampled_from(LABEL_POOL), unique=True, max_size=2).map(
    lambda ls: tuple(sorted(ls))
)
cpus = st.integers(0, 80).map(lambda n: n / 10)  # tenths: exercises float sums


@st.composite
def workers_st(draw: st.DrawFn) -> list[WorkerView]:
    n = draw(st.integers(1, 5))
    out = []
    for i in range(n):
        cap = Capacity(draw(cpus), draw(st.integers(0, 8192)), draw(st.integers(0, 2)))
        free = Capacity(
            draw(st.integers(0, 10)) / 10 * cap.cpu,
            draw(st.integers(0, cap.memory_mb)),
            draw(st.integers(0, cap.gpu)),
        )
        out.append(WorkerView(f"w{i}", cap, free, draw(label_sets)))
    return out


resources_st = st.builds(
    Resources,
    cpu=st.integers(0, 40).map(lambda n: n / 10),
    memory_mb=st.integers(0, 4096),
    gpu=st.integers(0, 1) | st.just(0),
    labels=st.just(()) | label_sets,
)


@st.composite
def items_st(draw: st.DrawFn) -> list[Item]:
    needs = draw(st.lists(resources_st, max_size=25))
    return [
        Item(
            f"i{k}",
            n,
            draw(st.integers(0, 2)),
            draw(st.sampled_from(["a", "b", "c"])),
        )
        for k, n in enumerate(needs)
    ]


def remaining(
    placed: dict[str, str], items: Sequence[Item], workers: Sequence[WorkerView]
) -> dict[str, Capacity]:
    by_key = {i.key: i for i in items}
    free = {w.worker_id: w.free for w in workers}
    for key, wid in placed.items():
        free[wid] = free[wid].minus(by_key[key].need)
    return free


def check_sound(
    placed: dict[str, str],
    unplaced: list[Item],
    items: Sequence[Item],
    workers: Sequence[WorkerView],
) -> None:
    by_id = {w.worker_id: w for w in workers}
    by_key = {i.key: i for i in items}
    # every item exactly once: placed or unplaced (the latter in input order)
    assert set(placed) | {i.key for i in unplaced} == set(by_key)
    assert not set(placed) & {i.key for i in unplaced}
    assert unplaced == [i for i in items if i.key in {u.key for u in unplaced}]
    for key, wid in placed.items():
        assert labels_match(by_key[key].need.labels, by_id[wid].labels)
    free = remaining(placed, items, workers)
    for w in workers:
        used = [by_key[k].need for k, wid in placed.items() if wid == w.worker_id]
        assert sum(n.cpu for n in used) <= w.free.cpu + EPS
        assert sum(n.memory_mb for n in used) <= w.free.memory_mb
        assert sum(n.gpu for n in used) <= w.free.gpu
    # capacity only shrinks, so an item that did not fit when considered fits nowhere now
    for u in unplaced:
        for w in workers:
            assert not (free[w.worker_id].fits(u.need) and labels_match(u.need.labels, w.labels))


def reference_ffd(
    items: Sequence[Item], workers: Sequence[WorkerView]
) -> tuple[dict[str, str], list[Item]]:
    big_cpu = max(w.capacity.cpu for w in workers)
    big_mem = max(w.capacity.memory_mb for w in workers)
    big_gpu = max(w.capacity.gpu for w in workers)

    def share(x: float, scale: float) -> float:
        return x / scale if scale else 0.0

    def size(i: Item) -> float:
        n = i.need
        return max(share(n.cpu, big_cpu), share(n.memory_mb, big_mem), share(n.gpu, big_gpu))

    indexed = list(enumerate(items))
    indexed.sort(
        key=lambda p: (-size(p[1]), -p[1].need.cpu, -p[1].need.memory_mb, -p[1].need.gpu, p[0])
    )
    cpu = [w.free.cpu for w in workers]
    mem = [w.free.memory_mb for w in workers]
    gpu = [w.free.gpu for w in workers]
    placed: dict[str, str] = {}
    for _, it in indexed:
        n = it.need
        for k, w in enumerate(workers):
            if not all(lbl in w.labels for lbl in n.labels):
                continue
            if n.cpu <= cpu[k] + 1e-9 and n.memory_mb <= mem[k] and n.gpu <= gpu[k]:
                cpu[k] -= n.cpu
                mem[k] -= n.memory_mb
                gpu[k] -= n.gpu
                placed[it.key] = w.worker_id
                break
    return placed, [i for i in items if i.key not in placed]


@settings(max_examples=150, deadline=None)
@given(items_st(), workers_st())
def test_ffd_is_sound_and_matches_the_reference(
    items: list[Item], workers: list[WorkerView]
) -> None:
    placed, unplaced = first_fit_decreasing(items, workers)
    check_sound(placed, unplaced, items, workers)
    assert (placed, unplaced) == reference_ffd(items, workers)


@settings(max_examples=150, deadline=None)
@given(items_st(), workers_st())
def test_place_batch_is_sound(items: list[Item], workers: list[WorkerView]) -> None:
    placed, unplaced = place_batch(items, workers)
    check_sound(placed, unplaced, items, workers)


@settings(max_examples=100, deadline=None)
@given(items_st(), workers_st())
def test_place_batch_replays_as_best_fit_in_batch_order(
    items: list[Item], workers: list[WorkerView]
) -> None:
    order = batch_order(items, workers)
    assert sorted(keys(order)) == sorted(keys(items))
    # priorities never increase; within a priority, owners' turns differ by at most one
    assert [i.priority for i in order] == sorted((i.priority for i in order), reverse=True)
    for prio in {i.priority for i in items}:
        level = [i.owner for i in order if i.priority == prio]
        totals = Counter(level)
        seen: Counter[str] = Counter()
        for owner in level:
            seen[owner] += 1
            live = [o for o in totals if seen[o] < totals[o]]  # owners with items to come
            for o in live:
                assert seen[owner] <= seen[o] + 1
    # each item goes to a tightest worker that admits it at its turn, or fits none
    placed, _ = place_batch(items, workers)
    free = {w.worker_id: w.free for w in workers}
    for it in order:
        views = [WorkerView(w.worker_id, w.capacity, free[w.worker_id], w.labels) for w in workers]
        fitting = [v for v in views if v.admits(it.need)]
        if it.key not in placed:
            assert fitting == []
            continue
        best = min(leftover_score(it.need, v) for v in fitting)
        chosen = next(v for v in views if v.worker_id == placed[it.key])
        assert chosen in fitting
        assert leftover_score(it.need, chosen) == best
        free[chosen.worker_id] = free[chosen.worker_id].minus(it.need)


def reference_leftover(n: Resources, w: WorkerView) -> tuple[int, float]:
    cpu = (w.free.cpu - n.cpu) / w.capacity.cpu if w.capacity.cpu else 0.0
    mem = (w.free.memory_mb - n.memory_mb) / w.capacity.memory_mb if w.capacity.memory_mb else 0.0
    return (w.free.gpu - n.gpu, cpu + mem)


@settings(max_examples=150, deadline=None)
@given(resources_st, workers_st())
def test_best_fit_returns_a_worker_with_minimal_leftover(
    n: Resources, workers: list[WorkerView]
) -> None:
    chosen = best_fit(n, workers)
    fitting = [
        w
        for w in workers
        if labels_match(n.labels, w.labels)
        and n.cpu <= w.free.cpu + 1e-9
        and n.memory_mb <= w.free.memory_mb
        and n.gpu <= w.free.gpu
    ]
    if not fitting:
        assert chosen is None
        return
    assert chosen in fitting
    gpu, score = reference_leftover(n, chosen)
    for w in fitting:
        other_gpu, other_score = reference_leftover(n, w)
        assert (gpu, score) <= (other_gpu, other_score + 1e-6)
    # deterministic: the order of the workers does not matter
    assert best_fit(n, reversed(workers)) == chosen


@settings(max_examples=100, deadline=None)
@given(resources_st, workers_st())
def test_could_ever_fit_iff_best_fit_on_empty_workers(
    n: Resources, workers: list[WorkerView]
) -> None:
    empty = [WorkerView(w.worker_id, w.capacity, w.capacity, w.labels) for w in workers]
    assert could_ever_fit(n, workers) == (best_fit(n, empty) is not None)


queue_items = st.lists(
    st.tuples(st.integers(0, 2), st.sampled_from(["a", "b", "c"]), st.booleans()),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(queue_items)
def test_fair_queue_drain_properties(spec: list[tuple[int, str, bool]]) -> None:
    q = FairQueue()
    items = [Item(f"k{n}", need(), prio, owner) for n, (prio, owner, _) in enumerate(spec)]
    accept = {f"k{n}" for n, (_, _, ok) in enumerate(spec) if ok}
    for it in items:
        q.push(it)
    full_order = list(q)
    assert sorted(keys(full_order)) == sorted(keys(items))
    # priority order, and FIFO within (priority, owner)
    assert [i.priority for i in full_order] == sorted((i.priority for i in items), reverse=True)
    for prio in range(3):
        for owner in "abc":
            mine = [i.key for i in items if i.priority == prio and i.owner == owner]
            assert [i.key for i in full_order if i.priority == prio and i.owner == owner] == mine

    offered: list[str] = []

    def fits(i: Item) -> bool:
        offered.append(i.key)
        return i.key in accept

    drained = keys(q.drain(fits))
    assert sorted(offered) == sorted(keys(items))  # each item offered exactly once
    assert drained == [k for k in offered if k in accept]
    assert set(drained) == accept
    assert len(q) == len(items) - len(accept)
    assert all((k in q) == (k not in accept) for k in keys(items))
    assert [i.priority for i in q.drain(lambda _: True)] == sorted(
        (i.priority for i in items if i.key not in accept), reverse=True
    )
    assert len(q) == 0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=60))
def test_fair_queue_owners_take_turns_within_a_priority(owners: list[str]) -> None:
    q = FairQueue()
    for n, owner in enumerate(owners):
        q.push(Item(f"k{n}", need(), 0, owner))
    totals = Counter(owners)
    seen: Counter[str] = Counter()
    for it in q.drain(lambda _: True):
        seen[it.owner] += 1
        for o in totals:
            if seen[o] < totals[o]:  # o still has items: nobody got ahead of it by two
                assert seen[it.owner] <= seen[o] + 1


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4))
def test_fair_queue_weights_share_turns_proportionally(wa: int, wb: int) -> None:
    q = FairQueue(weights={"A": wa, "B": wb})
    for n in range(200):
        q.push(Item(f"a{n}", need(), 0, "A"))
        q.push(Item(f"b{n}", need(), 0, "B"))
    first = q.drain(lambda _: True)[: 10 * (wa + wb)]
    counts = Counter(i.owner for i in first)
    assert abs(counts["A"] - 10 * wa) <= 1
    assert abs(counts["B"] - 10 * wb) <= 1


# -- spreading a burst's starts ------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    resources_st,
    workers_st(),
    st.lists(st.integers(min_value=0, max_value=8), min_size=8, max_size=8),
    st.integers(min_value=0, max_value=6),
)
def test_spread_fit_is_best_fit_below_the_threshold_and_never_piles_on(
    n: Resources, workers: list[WorkerView], counts: list[int], spread_above: int
) -> None:
    starts = {w.worker_id: counts[i % len(counts)] for i, w in enumerate(workers)}
    chosen = spread_fit(n, workers, starts, spread_above)
    fitting = [w for w in workers if w.admits(n)]
    assert (chosen is None) == (best_fit(n, workers) is None)
    if chosen is None:
        return
    assert chosen.admits(n)
    under = [w for w in fitting if starts[w.worker_id] < spread_above]
    if under:
        assert chosen == best_fit(n, under)
    else:  # every fitting worker at the threshold: one of the least loaded
        assert starts[chosen.worker_id] == min(starts[w.worker_id] for w in fitting)
    if all(c < spread_above for c in starts.values()):
        assert chosen == best_fit(n, workers)


@given(st.integers(min_value=1, max_value=5), st.integers(min_value=1, max_value=400))
def test_a_burst_that_fits_one_worker_is_dealt_out_evenly(workers: int, runs: int) -> None:
    """Every run fits the first worker; past the threshold the others take their turns, and
    no worker ends more than one start above another's (beyond the threshold)."""
    fleet = [worker(f"w{i}", 1000, 10**6) for i in range(workers)]
    starts: dict[str, int] = {}
    for _ in range(runs):
        chosen = spread_fit(need(0.01, 1), fleet, starts, 10)
        assert chosen is not None
        starts[chosen.worker_id] = starts.get(chosen.worker_id, 0) + 1
    assert sum(starts.values()) == runs
    if runs > 10 * workers:
        assert max(starts.values()) - min(starts.values()) <= 1
    else:
        assert max(starts.values()) <= 10


# -- Worker limits: the most a heartbeat is believed ---------------------------------------

_caps = st.builds(
    Capacity,
    st.floats(0, 64, allow_nan=False),
    st.integers(0, 65_536),
    st.integers(0, 8),
)
_label_pairs = st.lists(
    st.tuples(st.sampled_from(["zone", "os", "gpu"]), st.sampled_from(["a", "b"])),
    max_size=4,
    unique_by=lambda kv: kv[0],
).map(lambda pairs: tuple(sorted(pairs)))
_limits = st.builds(
    WorkerLimits,
    st.none() | st.floats(0, 64, allow_nan=False),
    st.none() | st.integers(0, 65_536),
    st.none() | st.integers(0, 8),
    st.none() | st.frozensets(st.sampled_from(["zone=a", "zone=*", "os=b", "gpu=a"])),
)


@given(_limits, _caps, _caps, _label_pairs)
def test_a_bounded_offer_never_exceeds_the_limits_nor_what_the_worker_said(
    limits: WorkerLimits, capacity: Capacity, free: Capacity, labels: Labels
) -> None:
    offer = limits.bound(capacity, free, labels)
    total = offer.capacity
    for have, said, limit in (
        (total.cpu, capacity.cpu, limits.cpu),
        (total.memory_mb, capacity.memory_mb, limits.memory_mb),
        (total.gpu, capacity.gpu, limits.gpu),
    ):
        assert have <= said
        assert limit is None or have <= limit
        assert have == (said if limit is None else min(said, limit))
    for left, whole in ((offer.free.cpu, total.cpu), (offer.free.memory_mb, total.memory_mb)):
        assert 0 <= left <= whole
    assert 0 <= offer.free.gpu <= total.gpu
    assert set(offer.labels) <= set(labels)
    if limits.labels is not None:
        assert all(
            f"{k}={v}" in limits.labels or f"{k}=*" in limits.labels for k, v in offer.labels
        )
    # Something was cut exactly when the offer changed.
    assert bool(offer.cut) == ((total, offer.labels) != (capacity, labels))


@given(_caps, _caps, _label_pairs)
def test_without_limits_the_offer_is_believed_as_is(
    capacity: Capacity, free: Capacity, labels: Labels
) -> None:
    honest = Capacity(
        min(free.cpu, capacity.cpu),
        min(free.memory_mb, capacity.memory_mb),
        min(free.gpu, capacity.gpu),
    )
    offer = WorkerLimits().bound(capacity, honest, labels)
    assert (offer.capacity, offer.free, offer.labels, offer.cut) == (capacity, honest, labels, ())


def test_a_worker_over_its_limit_keeps_what_it_uses_counted() -> None:
    limits = WorkerLimits(cpu=4, memory_mb=1024, labels=frozenset({"zone=*"}))
    offer = limits.bound(
        Capacity(64, 1_000_000, 0), Capacity(60, 999_000, 0), (("zone", "a"), ("os", "x"))
    )
    # It says it uses 4 cpu and 1,000 MB of what it claims: of the 4 allowed, none is left.
    assert offer.capacity == Capacity(4.0, 1024, 0)
    assert offer.free == Capacity(0.0, 24, 0)
    assert offer.labels == (("zone", "a"),)
    assert offer.cut == (
        "cpu 64 above the limit 4",
        "memory_mb 1000000 above the limit 1024",
        "labels os=x not allowed",
    )

"""Which change closes a dependency cycle (streams/core/dag.py), against a plain search."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from streams.core.dag import cycle_through

names = st.sampled_from(["a", "b", "c", "d", "e", "f"])
graphs = st.dictionaries(names, st.lists(names, max_size=3).map(tuple), max_size=6)


def _reaches(graph: dict[str, tuple[str, ...]], start: tuple[str, ...], goal: str) -> bool:
    todo, seen = list(start), set()
    while todo:
        node = todo.pop()
        if node == goal:
            return True
        if node not in seen:
            seen.add(node)
            todo.extend(graph.get(node, ()))
    return False


def test_the_demo_chain_turned_back_on_itself() -> None:
    graph = {"demo-transform": ("demo-extract",), "demo-load": ("demo-transform",)}
    assert cycle_through("demo-extract", ("demo-load",), graph) == (
        "demo-extract",
        "demo-load",
        "demo-transform",
        "demo-extract",
    )
    assert cycle_through("demo-extract", (), graph) is None
    assert cycle_through("x", ("x",), {}) == ("x", "x")  # depending on itself
    assert cycle_through("demo-report", ("demo-load",), graph) is None


@given(graphs, names, st.lists(names, max_size=3).map(tuple))
def test_a_cycle_is_found_exactly_when_one_closes(
    graph: dict[str, tuple[str, ...]], job: str, upstreams: tuple[str, ...]
) -> None:
    edges = {**graph, job: upstreams}
    found = cycle_through(job, upstreams, graph)
    assert (found is not None) == _reaches(edges, upstreams, job)
    if found is not None:
        assert found[0] == job
        assert found[-1] == job
        assert all(b in edges.get(a, ()) for a, b in pairwise(found))

"""The dependency graph of jobs, pure: which change would close a cycle.

A job runs after its upstreams (`depends_on`); a cycle among them means no job of it
ever runs again. A change that would close one is refused where the graph is known.
"""

from __future__ import annotations

from collections.abc import Mapping


def cycle_through(
    job_id: str, upstreams: tuple[str, ...], graph: Mapping[str, tuple[str, ...]]
) -> tuple[str, ...] | None:
    """The cycle `job_id` would close by depending on `upstreams`, given every other
    job's upstreams (`graph`), as the path job_id -> ... -> job_id; None if none."""
    edges = {**graph, job_id: upstreams}
    path: list[str] = [job_id]
    seen: set[str] = set()

    def walk(node: str) -> bool:
        for upstream in edges.get(node, ()):
            if upstream == job_id:
                path.append(job_id)
                return True
            if upstream in seen:
                continue
            seen.add(upstream)
            path.append(upstream)
            if walk(upstream):
                return True
            path.pop()
        return False

    return tuple(path) if walk(job_id) else None

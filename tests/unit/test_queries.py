"""The read-side queries (projections/queries.py): every placeholder has its parameter,
whatever filters are given, and the owner scope is always applied when there is one.
Their results are checked against PostgreSQL by the API and dashboard tests."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from projections import queries

names = st.none() | st.text("abc-", min_size=1, max_size=5)
times = st.none() | st.datetimes(timezones=st.just(UTC))


def _balanced(query: queries.Query) -> None:
    sql, params = query
    assert sql.count("%s") == len(params), sql


@given(names, names, st.none() | st.booleans(), names, st.integers(1, 1000))
def test_a_jobs_page_binds_every_filter_and_asks_one_more(
    scope: str | None, owner: str | None, paused: bool | None, after: str | None, limit: int
) -> None:
    query = queries.jobs_page(scope, owner, paused, after, limit)
    _balanced(query)
    assert query[1][-1] == limit + 1
    assert "NOT deleted" in query[0]
    if scope is not None:
        assert query[1][0] == scope


@given(
    names,
    names,
    names,
    times,
    times,
    st.none() | st.tuples(st.just(datetime(2026, 1, 1, tzinfo=UTC).isoformat()), st.text()),
    st.integers(1, 1000),
)
def test_a_runs_page_binds_every_filter_and_the_cursor(
    scope: str | None,
    job_id: str | None,
    state: str | None,
    since: datetime | None,
    until: datetime | None,
    before: tuple[str, str] | None,
    limit: int,
) -> None:
    query = queries.runs_page(scope, job_id, state, since, until, before, limit)
    _balanced(query)
    assert ("j.owner = %s" in query[0]) == (scope is not None)
    if before is not None:
        assert query[1][-3:-1] == before


@given(names, st.lists(st.text(max_size=3), max_size=3), st.text(max_size=3))
def test_the_dependency_queries_are_scoped(
    scope: str | None, job_ids: list[str], job_id: str
) -> None:
    for query in (
        queries.dependents(scope, 10),
        queries.visible_among(scope, job_ids),
        queries.downstream(scope, job_id),
    ):
        _balanced(query)
        assert ("owner = %s" in query[0]) == (scope is not None)


def test_the_single_queries_are_balanced() -> None:
    for query in (
        queries.job("j"),
        queries.foreign_jobs(["a"], "o"),
        queries.owned_jobs(["a"], "o"),
        queries.run("r"),
        queries.transitions("r"),
        queries.log_tail("r", 20),
        queries.logs("r", None, "stdout", 10),
        queries.logs("r", 2, None, 10),
        queries.recent_states(["a"], 10),
        queries.lateness("j", 500),
        queries.workers(),
        queries.projector_alive(),
    ):
        _balanced(query)

"""The Python client of cronlog's REST API: `from connectors.client import Client`.

It needs only the API's URL and a token (an owner's, or an admin's), as a team member
has them; every call is one request on httpx, and every refusal is a typed exception
carrying the API's own message and field:

    with Client("https://cronlog.example", token) as api:
        api.put_job({"job_id": "nightly", "schedule": {"cron": "0 2 * * *"},
                     "command": ["etl", "--full"]})
        run = api.run_now("nightly", request_id="deploy-42")
        done = api.wait(run.run_id, timeout_s=600)
        print(done.state, api.logs(done.run_id))

Writes are commands: the API answers once the command is on the log, and says whether
the projection already showed its effect (`Accepted.applied`); `wait` and the reads see
the history as the projector wrote it (the API's own view).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import Any
from urllib.parse import quote

import httpx

from schemas.records import FINAL_STATES

__all__ = [
    "Accepted",
    "ApiError",
    "BadRequest",
    "Client",
    "Conflict",
    "Forbidden",
    "Invalid",
    "Job",
    "NotFound",
    "RateLimited",
    "Run",
    "ServerError",
    "Transition",
    "Unauthorized",
    "WaitTimeout",
]


class ApiError(Exception):
    """The API refused a request: `status`, and its `message` and `field` as it said."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(f"{status}: {message}" + (f" ({field})" if field else ""))
        self.status = status
        self.message = message
        self.field = field


class BadRequest(ApiError):
    """400: a malformed request (not JSON, a bad cursor)."""


class Unauthorized(ApiError):
    """401: no token, or one the API does not know."""


class Forbidden(ApiError):
    """403: the token may not do this (another owner's job, a worker token)."""


class NotFound(ApiError):
    """404: no such job or run (or one the token may not see)."""


class Conflict(ApiError):
    """409: the job exists (create), or belongs to another owner."""


class Invalid(ApiError):
    """422: the job or request is invalid; `field` names what."""


class RateLimited(ApiError):
    """429: too many requests from this token; retry later."""


class ServerError(ApiError):
    """5xx: the API or a service behind it (Kafka, PostgreSQL) is not available."""


class WaitTimeout(TimeoutError):
    """`Client.wait` gave up: the run was not final in time (`run`: how it was last)."""

    def __init__(self, run: Run, timeout_s: float) -> None:
        super().__init__(f"run {run.run_id} still {run.state} after {timeout_s:g} s")
        self.run = run


_ERRORS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    422: Invalid,
    429: RateLimited,
}


@dataclass(frozen=True, slots=True)
class Accepted:
    """A command the API put on the log. `applied`: its effect was already visible in the
    history when the API answered (else it is on its way)."""

    body: dict[str, Any]
    applied: bool
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Job:
    job_id: str
    owner: str
    spec: dict[str, Any]  # the job as registered (the fields of a job.upsert command)
    paused: bool
    next_due_at: str | None
    cycle: tuple[str, ...]  # the dependency cycle its last change closed (refused), if any
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> Job:
        return cls(
            job_id=row["job_id"],
            owner=row["owner"],
            spec=dict(row["spec"]),
            paused=bool(row["paused"]),
            next_due_at=row.get("next_due_at"),
            cycle=tuple(row.get("cycle") or ()),
            raw=dict(row),
        )


@dataclass(frozen=True, slots=True)
class Transition:
    """One event of a run's history, as `run-events` had it."""

    attempt: int
    state: str
    at: str
    worker_id: str | None
    detail: Any

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> Transition:
        return cls(row["attempt"], row["state"], row["at"], row.get("worker_id"), row.get("detail"))


@dataclass(frozen=True, slots=True)
class Run:
    run_id: str
    job_id: str
    state: str
    attempt: int
    trigger: str
    scheduled_at: str | None
    started_at: str | None
    finished_at: str | None
    exit_code: int | None
    error: str | None
    worker_id: str | None
    params: dict[str, Any] = field(default_factory=dict, compare=False)  # its values
    transitions: tuple[Transition, ...] = ()  # filled by `Client.run` (not by listings)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> Run:
        return cls(
            run_id=row["run_id"],
            job_id=row["job_id"],
            state=row["state"],
            attempt=row["attempt"],
            trigger=row["trigger"],
            scheduled_at=row.get("scheduled_at"),
            started_at=row.get("started_at"),
            finished_at=row.get("finished_at"),
            exit_code=row.get("exit_code"),
            error=row.get("error"),
            worker_id=row.get("worker_id"),
            params=dict(row.get("params") or {}),
            transitions=tuple(Transition.of(t) for t in row.get("transitions", ())),
            raw=dict(row),
        )


def _when(value: datetime | str) -> str:
    return value.isoformat() if isinstance(value, datetime) else value


def _keyed(request_id: str | None) -> dict[str, Any]:
    return {"request_id": request_id} if request_id else {}


class Client:
    """cronlog's REST API. `url` is the API's base URL, `token` a bearer token."""

    PAGE = 500  # rows a listing asks for per request

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(
            base_url=url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout_s,
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    # -- the wire ------------------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
    ) -> httpx.Response:
        """One request; a refusal raises the ApiError of its status."""
        query = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            answer = self._http.request(method, path, json=json, params=query)
        except httpx.TransportError as exc:
            where = self._http.base_url
            raise ServerError(503, f"the API at {where} cannot be reached: {exc}") from exc
        if answer.status_code >= 400:
            raise _error(answer)
        return answer

    def _accepted(self, answer: httpx.Response) -> Accepted:
        body = answer.json()
        warnings = tuple(body.get("warnings", ()))
        return Accepted(body, answer.status_code in (200, 201), warnings)

    # -- jobs ----------------------------------------------------------------------------
    def create_job(
        self, job: Mapping[str, Any], *, allow_missing_upstreams: bool = False
    ) -> Accepted:
        """Register a new job (Conflict if the id is taken). An upstream not registered
        is Invalid unless `allow_missing_upstreams` (the job then waits for it)."""
        return self._accepted(
            self.request(
                "POST", "/jobs", json=dict(job), params=_missing_ok(allow_missing_upstreams)
            )
        )

    def put_job(self, job: Mapping[str, Any], *, allow_missing_upstreams: bool = False) -> Accepted:
        """Register a job, or replace the caller's job of that id with this spec."""
        job_id = segment(str(job.get("job_id", "")))
        return self._accepted(
            self.request(
                "PUT",
                f"/jobs/{job_id}",
                json=dict(job),
                params=_missing_ok(allow_missing_upstreams),
            )
        )

    def patch_job(
        self, job_id: str, changes: Mapping[str, Any], *, allow_missing_upstreams: bool = False
    ) -> Accepted:
        """Change some fields of a job (null removes an optional one)."""
        return self._accepted(
            self.request(
                "PATCH",
                f"/jobs/{segment(job_id)}",
                json=dict(changes),
                params=_missing_ok(allow_missing_upstreams),
            )
        )

    def pause(self, job_id: str) -> Accepted:
        return self._accepted(self.request("POST", f"/jobs/{segment(job_id)}/pause"))

    def resume(self, job_id: str, *, missed: str = "skip") -> Accepted:
        """Resume; `missed` says what becomes of the firings the pause covered: "skip"
        them, run the "last", or run "all" (within the catch-up window)."""
        body = {"missed": missed} if missed != "skip" else None
        return self._accepted(self.request("POST", f"/jobs/{segment(job_id)}/resume", json=body))

    def delete(self, job_id: str) -> Accepted:
        return self._accepted(self.request("DELETE", f"/jobs/{segment(job_id)}"))

    def job(self, job_id: str) -> Job:
        return Job.of(self.request("GET", f"/jobs/{segment(job_id)}").json())

    def whoami(self) -> dict[str, str]:
        """Who the token makes the caller: {"kind": admin|owner|worker, "name": ...}."""
        found: dict[str, str] = self.request("GET", "/whoami").json()
        return found

    def jobs_page(
        self,
        *,
        owner: str | None = None,
        paused: bool | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """One page of jobs as the API answers it: {"items": [...], "next": cursor}."""
        params = {"owner": owner, "paused": paused, "limit": limit, "cursor": cursor}
        page: dict[str, Any] = self.request("GET", "/jobs", params=params).json()
        return page

    def jobs(self, *, owner: str | None = None, paused: bool | None = None) -> Iterator[Job]:
        """Every job the token may see, by id."""
        cursor: str | None = None
        while True:
            page = self.jobs_page(owner=owner, paused=paused, limit=self.PAGE, cursor=cursor)
            yield from (Job.of(row) for row in page["items"])
            cursor = page["next"]
            if not cursor:
                return

    def run_now(
        self,
        job_id: str,
        *,
        request_id: str | None = None,
        params: Mapping[str, str | int | float | bool] | None = None,
    ) -> Run:
        """Start a manual run, with values for the job's parameters; the same
        `request_id` starts one run however often it is sent. The run as far as the
        history shows it (state `requested` until then)."""
        body = {**_keyed(request_id), **({"params": dict(params)} if params else {})}
        answer = self._accepted(self.request("POST", f"/jobs/{segment(job_id)}/run-now", json=body))
        return self._requested(answer, job_id, "manual")

    def backfill(
        self,
        job_id: str,
        since: datetime | str,
        until: datetime | str,
        *,
        request_id: str | None = None,
        params: Mapping[str, str | int | float | bool] | None = None,
    ) -> Accepted:
        """Create the runs the schedule had in [since, until] before the job existed,
        each with `params` over the job's defaults; `body["runs_at_most"]` says how many."""
        body = {"from": _when(since), "to": _when(until), **_keyed(request_id)}
        if params:
            body["params"] = dict(params)
        return self._accepted(self.request("POST", f"/jobs/{segment(job_id)}/backfill", json=body))

    # -- runs ----------------------------------------------------------------------------
    def runs_page(
        self,
        *,
        job_id: str | None = None,
        state: str | None = None,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """One page of runs, newest scheduled first: {"items": [...], "next": cursor}."""
        params = {
            "job_id": job_id,
            "state": state,
            "from": None if since is None else _when(since),
            "to": None if until is None else _when(until),
            "limit": limit,
            "cursor": cursor,
        }
        page: dict[str, Any] = self.request("GET", "/runs", params=params).json()
        return page

    def runs(
        self,
        *,
        job_id: str | None = None,
        state: str | None = None,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
    ) -> Iterator[Run]:
        """Every run matching, newest scheduled first (`since` inclusive, `until` not)."""
        cursor: str | None = None
        while True:
            page = self.runs_page(
                job_id=job_id, state=state, since=since, until=until, limit=self.PAGE, cursor=cursor
            )
            yield from (Run.of(row) for row in page["items"])
            cursor = page["next"]
            if not cursor:
                return

    def run(self, run_id: str) -> Run:
        """A run with its transitions (its history of events, oldest first)."""
        return Run.of(self.request("GET", f"/runs/{segment(run_id)}").json())

    def events(self, run_id: str) -> Iterator[Transition]:
        """A run's events, oldest first."""
        yield from self.run(run_id).transitions

    def logs(self, run_id: str, *, attempt: int | None = None, stream: str | None = None) -> str:
        """A run's output (every attempt unless one is named; stdout and stderr unless
        one is named)."""
        params = {"attempt": attempt, "stream": stream}
        return self.request("GET", f"/runs/{segment(run_id)}/logs", params=params).text

    def cancel(self, run_id: str) -> Accepted:
        return self._accepted(self.request("POST", f"/runs/{segment(run_id)}/cancel"))

    def rerun(self, run_id: str, *, request_id: str | None = None) -> Accepted:
        path = f"/runs/{segment(run_id)}/rerun"
        return self._accepted(self.request("POST", path, json=_keyed(request_id)))

    def wait(self, run_id: str, *, timeout_s: float = 3600.0, poll_s: float = 0.5) -> Run:
        """The run once it is final (succeeded, failed, cancelled, skipped); WaitTimeout
        after `timeout_s`. A run not in the history yet (just requested) is waited for."""
        end = time.monotonic() + timeout_s
        last = Run(run_id, "", "requested", 0, "", None, None, None, None, None, None)
        while True:
            with contextlib.suppress(NotFound):  # not projected yet
                last = self.run(run_id)
            if last.final:
                return last
            if time.monotonic() >= end:
                raise WaitTimeout(last, timeout_s)
            time.sleep(min(poll_s, max(0.0, end - time.monotonic())))

    def _requested(self, answer: Accepted, job_id: str, trigger: str) -> Run:
        run_id = str(answer.body["run_id"])
        seen = answer.body.get("run")
        if isinstance(seen, dict) and "state" in seen:
            return Run.of(seen)
        return Run(run_id, job_id, "requested", 0, trigger, None, None, None, None, None, None)


def segment(value: str) -> str:
    """A job or run id as one path segment (ids may hold '/', '@', spaces)."""
    return quote(value, safe="")


def _error(answer: httpx.Response) -> ApiError:
    status = answer.status_code
    message, where = answer.reason_phrase or "error", None
    try:
        error = answer.json().get("error", {})
        message = str(error.get("message", message))
        where = error.get("field")
    except ValueError:
        message = answer.text[:500] or message
    kind = _ERRORS.get(status, ServerError if status >= 500 else ApiError)
    return kind(status, message, where)


def _missing_ok(allow: bool) -> dict[str, str] | None:
    """The query of a job write that accepts upstreams not registered yet."""
    return {"allow_missing_upstreams": "true"} if allow else None

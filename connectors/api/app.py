"""The REST API (`cronlog api`): FastAPI routes over connectors.api.service.

Every error is JSON: ``{"error": {"status": 422, "message": "...", "field": "schedule"}}``.
Writes answer 201/200 when the projection already shows the change, 202 with a Location
when the command is accepted but not yet applied (the ledger and the projector are
asynchronous; a GET on the Location shows it shortly).
"""

# No `from __future__ import annotations`: FastAPI reads these annotations at runtime,
# and some name aliases local to create_app.

import math
import time
from datetime import datetime
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from connectors.api import ui
from connectors.api.auth import Tokens
from connectors.api.limits import RateLimiter, caller_key, read_body
from connectors.api.service import (
    MAX_PAGE,
    Accepted,
    Principal,
    Service,
    ServiceError,
    parse_body,
)
from connectors.api.worker_gateway import WorkerGateway
from streams import metrics
from streams.core.commands import MAX_COMMAND_BYTES

JOB_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "description": "A job.upsert command without its type",
                    "properties": {
                        "job_id": {"type": "string"},
                        "owner": {"type": "string"},
                        "schedule": {"type": "object"},
                        "command": {"type": "array", "items": {"type": "string"}},
                    },
                }
            }
        },
    }
}
OBJECT_BODY = {
    "requestBody": {
        "required": False,
        "content": {"application/json": {"schema": {"type": "object"}}},
    }
}


CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'"
)


def _error(status: int, message: str, field: str | None = None) -> JSONResponse:
    body = {"error": {"status": status, "message": message, "field": field}}
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    if status == 503:
        headers = {"Retry-After": "5"}  # a backing service (Kafka, PostgreSQL) is down
    return JSONResponse(body, status_code=status, headers=headers)


def _answer(accepted: Accepted, location: str, created: bool = False) -> JSONResponse:
    if accepted.applied:
        return JSONResponse(accepted.body, status_code=201 if created else 200)
    return JSONResponse(accepted.body, status_code=202, headers={"Location": location})


async def _body(request: Request) -> dict[str, Any]:
    return parse_body(await read_body(request, MAX_COMMAND_BYTES))


def _params(body: dict[str, Any]) -> dict[str, Any]:
    """A run-now's or backfill's parameter values, when the body gives any."""
    return {"params": body["params"]} if body.get("params") is not None else {}


def _request_id(request: Request, body: dict[str, Any]) -> dict[str, Any]:
    """The idempotency key of a run-now, rerun or backfill: the body's request_id, else the
    Idempotency-Key header, else none (the service makes one up: not idempotent)."""
    key = body.get("request_id", request.headers.get("idempotency-key"))
    return {"request_id": key} if key else {}


def create_app(
    service: Service,
    tokens: Tokens,
    gateway: WorkerGateway | None = None,
    limiter: RateLimiter | None = None,
) -> FastAPI:
    app = FastAPI(
        title="cronlog",
        version="0.1.0",
        description="A distributed job scheduler: jobs, runs and their history.",
    )

    @app.exception_handler(ServiceError)
    async def service_error(_request: Request, exc: ServiceError) -> JSONResponse:
        return _error(exc.status, exc.message, exc.field)

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, exc: HTTPException) -> JSONResponse:
        return _error(exc.status_code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return _error(422, f"{where or 'request'}: {first.get('msg', 'invalid')}", where)

    def caller(request: Request) -> Principal:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ServiceError(401, "missing bearer token (Authorization: Bearer <token>)")
        who = tokens.principal(token.strip())
        if who is None:
            raise ServiceError(401, "unknown bearer token")
        return who

    def user(who: Annotated[Principal, Depends(caller)]) -> Principal:
        if who.kind == "worker":
            raise ServiceError(403, "worker tokens may only use the worker endpoints")
        return who

    User = Annotated[Principal, Depends(user)]
    Limit = Annotated[int, Query(ge=1, le=MAX_PAGE)]

    # -- rate limits (connectors/api/limits.py) ----------------------------------------------
    limiter = limiter or RateLimiter.from_env()
    unlimited = ("/metrics", "/healthz", "/readyz", "/ui/static/")

    @app.middleware("http")
    async def limit(request: Request, call_next: Any) -> Response:
        if request.url.path.startswith(unlimited):
            response: Response = await call_next(request)
            return response
        wait = limiter.wait_s(caller_key(request, ui.COOKIE, tokens.principal))
        if wait > 0:
            message = (
                f"rate limit: at most {limiter.rate:g} requests/s per token (bursts of "
                f"{limiter.burst:g}); retry in {wait:.1f} s"
            )
            body = {"error": {"status": 429, "message": message, "field": None}}
            return JSONResponse(body, 429, headers={"Retry-After": str(math.ceil(wait))})
        answer: Response = await call_next(request)
        return answer

    # -- what a browser may do with an answer ----------------------------------------------
    @app.middleware("http")
    async def confine(request: Request, call_next: Any) -> Response:
        """Every answer: no framing (clickjacking), scripts, styles and forms from this
        origin only, no type sniffing, no referrer to other sites. /docs (Swagger UI)
        loads its assets from a CDN, so it keeps the framing rules only."""
        answer: Response = await call_next(request)
        answer.headers.setdefault("X-Frame-Options", "DENY")
        answer.headers.setdefault("X-Content-Type-Options", "nosniff")
        answer.headers.setdefault("Referrer-Policy", "same-origin")
        if request.url.path.startswith(("/docs", "/redoc")):
            answer.headers.setdefault("Content-Security-Policy", "frame-ancestors 'none'")
        else:
            answer.headers.setdefault("Content-Security-Policy", CSP)
        return answer

    # -- metrics ----------------------------------------------------------------------------
    @app.middleware("http")
    async def measure(request: Request, call_next: Any) -> Response:
        started = time.monotonic()
        response: Response = await call_next(request)
        route = request.scope.get("route")
        template = getattr(route, "path", "unmatched")  # bounded: a template, not the path
        metrics.API_REQUESTS.labels(template, request.method, str(response.status_code)).inc()
        metrics.API_SECONDS.labels(template).observe(time.monotonic() - started)
        return response

    @app.get("/metrics", include_in_schema=False)
    def prometheus() -> Response:
        return Response(metrics.exposition([metrics.API]), media_type=CONTENT_TYPE_LATEST)

    # -- the web dashboard (connectors/api/ui.py) ------------------------------------------
    app.mount("/ui/static", StaticFiles(directory=ui.STATIC_DIR), name="ui-static")
    app.include_router(ui.create_router(service, tokens))

    @app.get("/", include_in_schema=False)
    def home() -> Response:
        return RedirectResponse("/ui", status_code=307)

    # -- health ---------------------------------------------------------------------------
    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    def readyz() -> JSONResponse:
        checks = service.ready()
        ok = all(v == "ok" for v in checks.values())
        return JSONResponse({"ready": ok, **checks}, status_code=200 if ok else 503)

    # -- jobs -----------------------------------------------------------------------------
    @app.post("/jobs", tags=["jobs"], status_code=201, openapi_extra=JOB_BODY)
    async def create_job(request: Request, who: User) -> JSONResponse:
        body = await _body(request)
        accepted = await run_in_threadpool(service.create_job, who, body)
        job_id = accepted.body["job_id"]
        return _answer(accepted, f"/jobs/{job_id}", created=True)

    @app.get("/jobs", tags=["jobs"])
    def list_jobs(
        who: User,
        owner: str | None = None,
        paused: bool | None = None,
        limit: Limit = 100,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        return service.jobs(who, owner=owner, paused=paused, limit=limit, cursor=cursor)

    @app.get("/jobs/{job_id}", tags=["jobs"])
    def get_job(job_id: str, who: User) -> dict[str, Any]:
        return service.job(who, job_id)

    @app.put("/jobs/{job_id}", tags=["jobs"], openapi_extra=JOB_BODY)
    async def put_job(job_id: str, request: Request, who: User) -> JSONResponse:
        """Register the job, or replace the caller's job of that id with this spec
        (what `cronlog jobs add` and `cronlog apply` do)."""
        body = await _body(request)
        if body.get("job_id", job_id) != job_id:
            raise ServiceError(422, "job_id differs from the path's", "job_id")
        accepted = await run_in_threadpool(service.put_job, who, {**body, "job_id": job_id})
        return _answer(accepted, f"/jobs/{job_id}")

    @app.patch("/jobs/{job_id}", tags=["jobs"], openapi_extra=OBJECT_BODY)
    async def patch_job(job_id: str, request: Request, who: User) -> JSONResponse:
        body = await _body(request)
        accepted = await run_in_threadpool(service.patch_job, who, job_id, body)
        return _answer(accepted, f"/jobs/{job_id}")

    @app.delete("/jobs/{job_id}", tags=["jobs"])
    def delete_job(job_id: str, who: User) -> JSONResponse:
        return _answer(service.job_command(who, job_id, "delete"), f"/jobs/{job_id}")

    @app.post("/jobs/{job_id}/pause", tags=["jobs"])
    def pause_job(job_id: str, who: User) -> JSONResponse:
        return _answer(service.job_command(who, job_id, "pause"), f"/jobs/{job_id}")

    @app.post("/jobs/{job_id}/resume", tags=["jobs"], openapi_extra=OBJECT_BODY)
    async def resume_job(job_id: str, request: Request, who: User) -> JSONResponse:
        """Resume; `{"missed": "last"}` (or "all") runs the firings the pause covered."""
        body = await _body(request)
        fields = {"missed": body["missed"]} if body.get("missed") is not None else {}
        accepted = await run_in_threadpool(service.job_command, who, job_id, "resume", **fields)
        return _answer(accepted, f"/jobs/{job_id}")

    @app.post("/jobs/{job_id}/run-now", tags=["jobs"], openapi_extra=OBJECT_BODY)
    async def run_now(job_id: str, request: Request, who: User) -> JSONResponse:
        body = await _body(request)
        fields = {**_request_id(request, body), **_params(body)}
        accepted = await run_in_threadpool(service.job_command, who, job_id, "run_now", **fields)
        return _answer(accepted, f"/runs/{accepted.body['run_id']}")

    @app.post("/jobs/{job_id}/backfill", tags=["jobs"], openapi_extra=OBJECT_BODY)
    async def backfill(job_id: str, request: Request, who: User) -> JSONResponse:
        body = await _body(request)
        fields = {
            "from": body.get("from"),
            "to": body.get("to"),
            **_request_id(request, body),
            **_params(body),
        }
        accepted = await run_in_threadpool(service.job_command, who, job_id, "backfill", **fields)
        return _answer(accepted, f"/jobs/{job_id}/runs")

    def run_filters(
        state: str | None = None,
        since: Annotated[datetime | None, Query(alias="from")] = None,
        until: Annotated[datetime | None, Query(alias="to")] = None,
        limit: Limit = 100,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """The query parameters every run listing takes."""
        return {"state": state, "since": since, "until": until, "limit": limit, "cursor": cursor}

    Filters = Annotated[dict[str, Any], Depends(run_filters)]

    @app.get("/jobs/{job_id}/runs", tags=["runs"])
    def job_runs(job_id: str, who: User, filters: Filters) -> dict[str, Any]:
        return service.runs(who, job_id=job_id, **filters)

    # -- runs -----------------------------------------------------------------------------
    @app.get("/runs", tags=["runs"])
    def list_runs(who: User, filters: Filters, job_id: str | None = None) -> dict[str, Any]:
        return service.runs(who, job_id=job_id, **filters)

    @app.get("/runs/{run_id}", tags=["runs"])
    def get_run(run_id: str, who: User) -> dict[str, Any]:
        return service.run(who, run_id)

    @app.get("/runs/{run_id}/logs", tags=["runs"], response_class=PlainTextResponse)
    def run_logs(
        run_id: str,
        who: User,
        attempt: Annotated[int | None, Query(ge=1)] = None,
        stream: Annotated[str | None, Query(pattern="^(stdout|stderr)$")] = None,
        limit: Annotated[int, Query(ge=1, le=Service.MAX_LOG_CHUNKS)] = Service.MAX_LOG_CHUNKS,
    ) -> str:
        """The log's first `limit` chunks (at most 10,000; a chunk is at most 16 KiB)."""
        return "".join(c["data"] for c in service.logs(who, run_id, attempt, stream, limit))

    @app.post("/runs/{run_id}/cancel", tags=["runs"])
    def cancel_run(run_id: str, who: User) -> JSONResponse:
        return _answer(service.run_command(who, run_id, "cancel"), f"/runs/{run_id}")

    @app.post("/runs/{run_id}/rerun", tags=["runs"], openapi_extra=OBJECT_BODY)
    async def rerun(run_id: str, request: Request, who: User) -> JSONResponse:
        fields = _request_id(request, await _body(request))
        accepted = await run_in_threadpool(service.run_command, who, run_id, "rerun", **fields)
        return _answer(accepted, f"/runs/{run_id}")

    # -- workers (connectors/api/worker_gateway.py) ------------------------------------------------
    if gateway is None:
        return app
    Caller = Annotated[Principal, Depends(caller)]
    capacity = {
        "type": "object",
        "properties": {
            "cpu": {"type": "number", "minimum": 0},
            "memory_mb": {"type": "integer", "minimum": 0},
            "gpu": {"type": "integer", "minimum": 0},
        },
    }
    string = {"type": "string"}
    heartbeat_body = {
        "requestBody": {
            "required": False,
            "content": {
                "application/json": {
                    "schema": {
                        "type": "object",
                        "properties": {
                            "capacity": capacity,
                            "free": capacity,
                            "labels": {"type": "object", "additionalProperties": string},
                            "running": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "properties": {
                                        "run_id": {"type": "string"},
                                        "attempt": {"type": "integer", "minimum": 1},
                                    },
                                },
                            },
                            "ack": {
                                "type": "integer",
                                "minimum": 0,
                                "description": "The `seq` of the last answer handled (0 at "
                                "first): its messages are removed, later ones are sent again "
                                "until acknowledged. Without it, an answer's messages are "
                                "removed as soon as they are sent (older protocol).",
                            },
                        },
                    }
                }
            },
        }
    }

    @app.post("/workers/{worker_id}/heartbeat", tags=["workers"], openapi_extra=heartbeat_body)
    async def heartbeat(worker_id: str, request: Request, who: Caller) -> dict[str, Any]:
        """Say the worker is alive (every second, at least every 2 s) and collect its messages.

        The answer has `assignments` (claim them with `/runs/{id}/ack`, sending back
        the assignment's `attempt` and `placement`; send `placement` with the started,
        finished and released reports too, or the API adds the one it delivered),
        `grants` (start only after a granted reply) and `kills` (stop that attempt now),
        each item with its `seq`, and, when the heartbeat carried an `ack` (send `ack: 0`
        first), a top-level `seq`. Handle the items in `seq` order across the three lists, then send
        `ack: <seq>` with the next heartbeat: only then are they removed, so an answer lost
        on the way comes again, the same messages in the same order. Handle a repeated
        message harmlessly. A seq is the message's position in worker-inbox: it stays
        valid across API restarts and instances (a heartbeat with an ack to an API that
        holds no mailbox for the worker rebuilds it from there, up to 5 minutes back). At
        most 1,000 messages per answer; at most 10,000 wait unacked (the oldest are
        dropped). Without `ack` (the older protocol) an answer's messages are removed as
        soon as they are sent, and a lost answer loses them."""
        gateway.check(who, worker_id)
        body = await _body(request)
        return await run_in_threadpool(gateway.heartbeat, worker_id, body)

    async def report(run_id: str, kind: str, request: Request, who: Principal) -> JSONResponse:
        body = await _body(request)
        worker_id = body.get("worker_id", who.name if who.kind == "worker" else None)
        if not isinstance(worker_id, str) or worker_id in ("", "*"):
            raise ServiceError(422, "worker_id is required with this token", "worker_id")
        gateway.check(who, worker_id)
        await run_in_threadpool(gateway.report, worker_id, run_id, kind, body)
        return JSONResponse({"run_id": run_id, "accepted": kind}, status_code=202)

    @app.post("/runs/{run_id}/ack", tags=["workers"], openapi_extra=OBJECT_BODY)
    async def ack(run_id: str, request: Request, who: Caller) -> JSONResponse:
        return await report(run_id, "ack", request, who)

    @app.post("/runs/{run_id}/started", tags=["workers"], openapi_extra=OBJECT_BODY)
    async def started(run_id: str, request: Request, who: Caller) -> JSONResponse:
        return await report(run_id, "started", request, who)

    @app.post("/runs/{run_id}/finished", tags=["workers"], openapi_extra=OBJECT_BODY)
    async def finished(run_id: str, request: Request, who: Caller) -> JSONResponse:
        return await report(run_id, "finished", request, who)

    @app.post("/runs/{run_id}/released", tags=["workers"], openapi_extra=OBJECT_BODY)
    async def released(run_id: str, request: Request, who: Caller) -> JSONResponse:
        """Give back a granted attempt that was never started and never will be: the
        ledger dispatches the same attempt again."""
        return await report(run_id, "released", request, who)

    return app

"""The REST API (`cronlog api`): FastAPI routes over connectors.api.service.

Every error is JSON: ``{"error": {"status": 422, "message": "...", "field": "schedule"}}``.
Writes answer 201/200 when the projection already shows the change, 202 with a Location
when the command is accepted but not yet applied (the ledger and the projector are
asynchronous; a GET on the Location shows it shortly).

This module is the app's frame: the error handlers, the middleware and the routers
(connectors/api/routes/, one a resource) put together by `create_app`. The routers find
the Service, the tokens and the worker gateway on app.state.
"""

import math
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException

from connectors.api import ui
from connectors.api.auth import Principals
from connectors.api.limits import RateLimiter, caller_key
from connectors.api.routes import account, health, jobs, runs, secrets, workers
from connectors.api.service import Service, ServiceError
from connectors.api.worker_gateway import WorkerGateway
from streams import metrics

CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'"
)
UNLIMITED = ("/metrics", "/healthz", "/readyz", "/ui/static/")


def _error(
    status: int, message: str, field: str | None = None, retry_after_s: int | None = None
) -> JSONResponse:
    body = {"error": {"status": status, "message": message, "field": field}}
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    if status == 503:
        headers = {"Retry-After": "5"}  # a backing service (Kafka, PostgreSQL) is down
    if retry_after_s is not None:  # a quota (connectors/api/quotas.py)
        headers = {"Retry-After": str(retry_after_s)}
    return JSONResponse(body, status_code=status, headers=headers)


# -- errors ---------------------------------------------------------------------------------
async def service_error(_request: Request, exc: ServiceError) -> JSONResponse:
    return _error(exc.status, exc.message, exc.field, exc.retry_after_s)


async def http_error(_request: Request, exc: HTTPException) -> JSONResponse:
    return _error(exc.status_code, str(exc.detail))


async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {}
    where = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
    return _error(422, f"{where or 'request'}: {first.get('msg', 'invalid')}", where)


# -- rate limits (connectors/api/limits.py) -------------------------------------------------
async def limit(request: Request, call_next: Any) -> Response:
    if request.url.path.startswith(UNLIMITED):
        response: Response = await call_next(request)
        return response
    limiter: RateLimiter = request.app.state.limiter
    tokens: Principals = request.app.state.tokens
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


# -- what a browser may do with an answer ---------------------------------------------------
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


# -- metrics --------------------------------------------------------------------------------
async def measure(request: Request, call_next: Any) -> Response:
    started = time.monotonic()
    response: Response = await call_next(request)
    route = request.scope.get("route")
    template = getattr(route, "path", "unmatched")  # bounded: a template, not the path
    metrics.API_REQUESTS.labels(template, request.method, str(response.status_code)).inc()
    metrics.API_SECONDS.labels(template).observe(time.monotonic() - started)
    return response


def home() -> Response:
    return RedirectResponse("/ui", status_code=307)


def create_app(
    service: Service,
    tokens: Principals,
    gateway: WorkerGateway | None = None,
    limiter: RateLimiter | None = None,
) -> FastAPI:
    app = FastAPI(
        title="cronlog",
        version="0.1.0",
        description="A distributed job scheduler: jobs, runs and their history.",
    )
    app.state.service = service
    app.state.tokens = tokens
    app.state.gateway = gateway
    # The configured limits come from `cronlog api` (CRONLOG_API_RATE/_BURST); else the
    # documented defaults.
    app.state.limiter = limiter or RateLimiter()

    app.exception_handler(ServiceError)(service_error)
    app.exception_handler(HTTPException)(http_error)
    app.exception_handler(RequestValidationError)(invalid)

    # Each one added wraps the ones before: measure is outermost, the rate limit innermost.
    app.middleware("http")(limit)
    app.middleware("http")(confine)
    app.middleware("http")(measure)

    app.include_router(health.router)
    # -- the web dashboard (connectors/api/ui.py) ------------------------------------------
    app.mount("/ui/static", StaticFiles(directory=ui.STATIC_DIR), name="ui-static")
    app.include_router(ui.create_router(service, tokens))
    app.add_api_route("/", home, methods=["GET"], include_in_schema=False)

    app.include_router(account.router)
    app.include_router(jobs.router)
    app.include_router(runs.router)
    app.include_router(secrets.router)
    if gateway is not None:
        app.include_router(workers.router)
    return app

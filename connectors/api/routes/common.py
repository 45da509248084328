"""What the API's routers share: the objects create_app keeps on app.state, the caller a
bearer token names, request bodies, and the answer to a write (201/200 when the
projection already shows it, 202 with a Location when it is on its way)."""

from typing import Annotated, Any

from fastapi import Depends, Query, Request
from fastapi.responses import JSONResponse

from connectors.api.auth import Principals
from connectors.api.limits import read_body
from connectors.api.service import (
    MAX_PAGE,
    Accepted,
    Principal,
    Service,
    ServiceError,
    parse_body,
)
from connectors.api.worker_gateway import WorkerGateway
from streams.core.commands import MAX_COMMAND_BYTES

OBJECT_BODY = {
    "requestBody": {
        "required": False,
        "content": {"application/json": {"schema": {"type": "object"}}},
    }
}


# Async: a lookup on app.state needs no thread of the pool.
async def the_service(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


async def the_gateway(request: Request) -> WorkerGateway:
    gateway: WorkerGateway = request.app.state.gateway
    return gateway


def caller(request: Request) -> Principal:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ServiceError(401, "missing bearer token (Authorization: Bearer <token>)")
    tokens: Principals = request.app.state.tokens
    who = tokens.principal(token.strip())
    if who is None:
        raise ServiceError(401, "unknown bearer token")
    return who


def user(who: Annotated[Principal, Depends(caller)]) -> Principal:
    if who.kind == "worker":
        raise ServiceError(403, "worker tokens may only use the worker endpoints")
    return who


ServiceDep = Annotated[Service, Depends(the_service)]
GatewayDep = Annotated[WorkerGateway, Depends(the_gateway)]
Caller = Annotated[Principal, Depends(caller)]
User = Annotated[Principal, Depends(user)]
Limit = Annotated[int, Query(ge=1, le=MAX_PAGE)]


def answer(accepted: Accepted, location: str, created: bool = False) -> JSONResponse:
    if accepted.applied:
        return JSONResponse(accepted.body, status_code=201 if created else 200)
    return JSONResponse(accepted.body, status_code=202, headers={"Location": location})


async def body_of(request: Request) -> dict[str, Any]:
    return parse_body(await read_body(request, MAX_COMMAND_BYTES))


def params(body: dict[str, Any]) -> dict[str, Any]:
    """A run-now's or backfill's parameter values, when the body gives any."""
    return {"params": body["params"]} if body.get("params") is not None else {}


def request_id(request: Request, body: dict[str, Any]) -> dict[str, Any]:
    """The idempotency key of a run-now, rerun or backfill: the body's request_id, else the
    Idempotency-Key header, else none (the service makes one up: not idempotent)."""
    key = body.get("request_id", request.headers.get("idempotency-key"))
    return {"request_id": key} if key else {}

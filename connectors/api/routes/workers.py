"""Workers over HTTP (connectors/api/worker_gateway.py): a worker's heartbeat, which
collects its messages, and its reports on a run (ack, started, finished, released).
Mounted only when create_app is given a gateway."""

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from connectors.api.routes.common import OBJECT_BODY, Caller, GatewayDep, body_of
from connectors.api.service import Principal, ServiceError
from connectors.api.worker_gateway import WorkerGateway

CAPACITY = {
    "type": "object",
    "properties": {
        "cpu": {"type": "number", "minimum": 0},
        "memory_mb": {"type": "integer", "minimum": 0},
        "gpu": {"type": "integer", "minimum": 0},
    },
}
HEARTBEAT_BODY = {
    "requestBody": {
        "required": False,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "capacity": CAPACITY,
                        "free": CAPACITY,
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
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

router = APIRouter(tags=["workers"])


@router.post("/workers/{worker_id}/heartbeat", openapi_extra=HEARTBEAT_BODY)
async def heartbeat(
    worker_id: str, request: Request, who: Caller, gateway: GatewayDep
) -> dict[str, Any]:
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
    holds no inbox for the worker rebuilds it from there, up to 5 minutes back). At
    most 1,000 messages per answer; at most 10,000 wait unacked (the oldest are
    dropped). Without `ack` (the older protocol) an answer's messages are removed as
    soon as they are sent, and a lost answer loses them."""
    gateway.check(who, worker_id)
    body = await body_of(request)
    return await run_in_threadpool(gateway.heartbeat, worker_id, body)


async def report(
    run_id: str, kind: str, request: Request, who: Principal, gateway: WorkerGateway
) -> JSONResponse:
    body = await body_of(request)
    worker_id = body.get("worker_id", who.name if who.kind == "worker" else None)
    if not isinstance(worker_id, str) or worker_id in ("", "*"):
        raise ServiceError(422, "worker_id is required with this token", "worker_id")
    gateway.check(who, worker_id)
    await run_in_threadpool(gateway.report, worker_id, run_id, kind, body)
    return JSONResponse({"run_id": run_id, "accepted": kind}, status_code=202)


@router.post("/runs/{run_id}/ack", openapi_extra=OBJECT_BODY)
async def ack(run_id: str, request: Request, who: Caller, gateway: GatewayDep) -> JSONResponse:
    return await report(run_id, "ack", request, who, gateway)


@router.post("/runs/{run_id}/started", openapi_extra=OBJECT_BODY)
async def started(run_id: str, request: Request, who: Caller, gateway: GatewayDep) -> JSONResponse:
    return await report(run_id, "started", request, who, gateway)


@router.post("/runs/{run_id}/finished", openapi_extra=OBJECT_BODY)
async def finished(run_id: str, request: Request, who: Caller, gateway: GatewayDep) -> JSONResponse:
    return await report(run_id, "finished", request, who, gateway)


@router.post("/runs/{run_id}/released", openapi_extra=OBJECT_BODY)
async def released(run_id: str, request: Request, who: Caller, gateway: GatewayDep) -> JSONResponse:
    """Release a granted attempt that was never started and never will be: the
    ledger dispatches the same attempt again."""
    return await report(run_id, "released", request, who, gateway)

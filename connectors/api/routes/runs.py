"""Runs: a job's runs and all of them (filtered), one run, its log; cancel and rerun. (A
worker's reports on a run are in connectors/api/routes/workers.py.)"""

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.concurrency import run_in_threadpool

from connectors.api.routes.common import (
    OBJECT_BODY,
    Limit,
    ServiceDep,
    User,
    answer,
    body_of,
    request_id,
)
from connectors.api.service import Service

router = APIRouter(tags=["runs"])


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


@router.get("/jobs/{job_id}/runs")
def job_runs(job_id: str, who: User, filters: Filters, service: ServiceDep) -> dict[str, Any]:
    return service.runs(who, job_id=job_id, **filters)


@router.get("/runs")
def list_runs(
    who: User, filters: Filters, service: ServiceDep, job_id: str | None = None
) -> dict[str, Any]:
    return service.runs(who, job_id=job_id, **filters)


@router.get("/runs/{run_id}")
def get_run(run_id: str, who: User, service: ServiceDep) -> dict[str, Any]:
    return service.run(who, run_id)


@router.get("/runs/{run_id}/logs", response_class=PlainTextResponse)
def run_logs(
    run_id: str,
    who: User,
    service: ServiceDep,
    attempt: Annotated[int | None, Query(ge=1)] = None,
    stream: Annotated[str | None, Query(pattern="^(stdout|stderr)$")] = None,
    limit: Annotated[int, Query(ge=1, le=Service.MAX_LOG_CHUNKS)] = Service.MAX_LOG_CHUNKS,
) -> str:
    """The log's first `limit` chunks (at most 10,000; a chunk is at most 16 KiB)."""
    return "".join(c["data"] for c in service.logs(who, run_id, attempt, stream, limit))


@router.post("/runs/{run_id}/cancel")
def cancel_run(run_id: str, who: User, service: ServiceDep) -> JSONResponse:
    return answer(service.run_command(who, run_id, "cancel"), f"/runs/{run_id}")


@router.post("/runs/{run_id}/rerun", openapi_extra=OBJECT_BODY)
async def rerun(run_id: str, request: Request, who: User, service: ServiceDep) -> JSONResponse:
    fields = request_id(request, await body_of(request))
    accepted = await run_in_threadpool(service.run_command, who, run_id, "rerun", **fields)
    return answer(accepted, f"/runs/{run_id}")

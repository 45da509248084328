"""/jobs: register, list, read, replace, patch and delete jobs; pause, resume, run now and
backfill them (their runs are in connectors/api/routes/runs.py)."""

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from connectors.api.routes.common import (
    OBJECT_BODY,
    Limit,
    ServiceDep,
    User,
    answer,
    body_of,
    params,
    request_id,
)
from connectors.api.service import ServiceError
from streams.core.job_schema import job_file_schema, job_schema


def _body(schema: dict[str, Any], required: bool) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": required,
            "content": {"application/json": {"schema": schema}},
        }
    }


def _api_job(*, put: bool = False, patch: bool = False) -> dict[str, Any]:
    """The job reference (streams/core/job_schema.py) as the API takes it: `owner` may be
    left out (the token's owner), and for a PUT `job_id` (the path's). A PATCH names only
    the fields it changes, each may be null (removed: its default again), and no field
    has a default (a client filling one in would reset it)."""
    schema = job_schema()
    left = {"owner"} | ({"job_id"} if put else set())
    schema["required"] = [] if patch else [f for f in schema["required"] if f not in left]
    if patch:
        schema["description"] = "The fields to change; the others keep their values."
        schema["properties"] = {
            name: {
                "description": field["description"],
                "anyOf": [{k: v for k, v in field.items() if k != "default"}, {"type": "null"}],
            }
            for name, field in schema["properties"].items()
        }
    return schema


JOB_BODY = _body(_api_job(), required=True)
JOB_PUT_BODY = _body(_api_job(put=True), required=True)
JOB_PATCH_BODY = _body(_api_job(patch=True), required=True)

# An upstream not registered is refused (422) unless this says it will be.
MissingOk = Annotated[
    bool,
    Query(
        description="Accept upstreams (depends_on) not registered yet: the job waits for "
        "them. Without it they are refused, since a typo would wait for ever."
    ),
]

router = APIRouter(tags=["jobs"])


@router.get("/schemas/job.json", tags=["reference"])
def job_file_json_schema() -> JSONResponse:
    """The JSON Schema of a job file, for editors (no token needed): point
    `# yaml-language-server: $schema=<api>/schemas/job.json` at it."""
    return JSONResponse(job_file_schema())


@router.post("/jobs", status_code=201, openapi_extra=JOB_BODY)
async def create_job(
    request: Request, who: User, service: ServiceDep, allow_missing_upstreams: MissingOk = False
) -> JSONResponse:
    body = await body_of(request)
    accepted = await run_in_threadpool(service.create_job, who, body, allow_missing_upstreams)
    job_id = accepted.body["job_id"]
    return answer(accepted, f"/jobs/{job_id}", created=True)


@router.get("/jobs")
def list_jobs(
    who: User,
    service: ServiceDep,
    owner: str | None = None,
    paused: bool | None = None,
    limit: Limit = 100,
    cursor: str | None = None,
) -> dict[str, Any]:
    return service.jobs(who, owner=owner, paused=paused, limit=limit, cursor=cursor)


@router.get("/jobs/{job_id}")
def get_job(job_id: str, who: User, service: ServiceDep) -> dict[str, Any]:
    return service.job(who, job_id)


@router.put("/jobs/{job_id}", openapi_extra=JOB_PUT_BODY)
async def put_job(
    job_id: str,
    request: Request,
    who: User,
    service: ServiceDep,
    allow_missing_upstreams: MissingOk = False,
) -> JSONResponse:
    """Register the job, or replace the caller's job of that id with this spec
    (what `cronlog jobs add` and `cronlog apply` do)."""
    body = await body_of(request)
    if body.get("job_id", job_id) != job_id:
        raise ServiceError(422, "job_id differs from the path's", "job_id")
    accepted = await run_in_threadpool(
        service.put_job, who, {**body, "job_id": job_id}, allow_missing_upstreams
    )
    return answer(accepted, f"/jobs/{job_id}")


@router.patch("/jobs/{job_id}", openapi_extra=JOB_PATCH_BODY)
async def patch_job(
    job_id: str,
    request: Request,
    who: User,
    service: ServiceDep,
    allow_missing_upstreams: MissingOk = False,
) -> JSONResponse:
    body = await body_of(request)
    accepted = await run_in_threadpool(
        service.patch_job, who, job_id, body, allow_missing_upstreams
    )
    return answer(accepted, f"/jobs/{job_id}")


@router.delete("/jobs/{job_id}")
def delete_job(job_id: str, who: User, service: ServiceDep) -> JSONResponse:
    return answer(service.job_command(who, job_id, "delete"), f"/jobs/{job_id}")


@router.post("/jobs/{job_id}/pause")
def pause_job(job_id: str, who: User, service: ServiceDep) -> JSONResponse:
    return answer(service.job_command(who, job_id, "pause"), f"/jobs/{job_id}")


@router.post("/jobs/{job_id}/resume", openapi_extra=OBJECT_BODY)
async def resume_job(job_id: str, request: Request, who: User, service: ServiceDep) -> JSONResponse:
    """Resume; `{"missed": "last"}` (or "all") runs the firings the pause covered."""
    body = await body_of(request)
    fields = {"missed": body["missed"]} if body.get("missed") is not None else {}
    accepted = await run_in_threadpool(service.job_command, who, job_id, "resume", **fields)
    return answer(accepted, f"/jobs/{job_id}")


@router.post("/jobs/{job_id}/run-now", openapi_extra=OBJECT_BODY)
async def run_now(job_id: str, request: Request, who: User, service: ServiceDep) -> JSONResponse:
    body = await body_of(request)
    fields = {**request_id(request, body), **params(body)}
    accepted = await run_in_threadpool(service.job_command, who, job_id, "run_now", **fields)
    return answer(accepted, f"/runs/{accepted.body['run_id']}")


@router.post("/jobs/{job_id}/backfill", openapi_extra=OBJECT_BODY)
async def backfill(job_id: str, request: Request, who: User, service: ServiceDep) -> JSONResponse:
    body = await body_of(request)
    fields = {
        "from": body.get("from"),
        "to": body.get("to"),
        **request_id(request, body),
        **params(body),
    }
    accepted = await run_in_threadpool(service.job_command, who, job_id, "backfill", **fields)
    return answer(accepted, f"/jobs/{job_id}/runs")

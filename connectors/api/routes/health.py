"""What probes and Prometheus ask, without a token: /healthz, /readyz and /metrics."""

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from connectors.api.routes.common import ServiceDep
from streams import metrics

router = APIRouter()


@router.get("/metrics", include_in_schema=False)
def prometheus() -> Response:
    return Response(metrics.exposition([metrics.API]), media_type=CONTENT_TYPE_LATEST)


@router.get("/healthz", tags=["health"])
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", tags=["health"])
def readyz(service: ServiceDep) -> JSONResponse:
    checks = service.ready()
    ok = all(v == "ok" for v in checks.values())
    return JSONResponse({"ready": ok, **checks}, status_code=200 if ok else 503)

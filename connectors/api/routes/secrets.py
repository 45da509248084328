"""Secrets, by name only: the ones the caller may name in a job's env (an owner's), or
every granted one with the owners that may use it (an admin). The values are on the
workers alone (connectors/worker/secrets.py); the grants are CRONLOG_SECRETS_GRANTS."""

from typing import Any

from fastapi import APIRouter

from connectors.api.routes.common import ServiceDep, User

router = APIRouter(tags=["secrets"])


@router.get("/secrets")
async def list_secrets(who: User, service: ServiceDep) -> dict[str, Any]:
    return service.secrets(who)  # from the grants in memory: no I/O

"""/whoami: who the caller's token makes it (`cronlog whoami`, `cronlog login`)."""

from fastapi import APIRouter

from connectors.api.routes.common import Caller

router = APIRouter(tags=["account"])


@router.get("/whoami")
def whoami(who: Caller) -> dict[str, str]:
    """The caller: `kind` (admin, owner or worker) and `name` (the owner, the worker id)."""
    return {"kind": who.kind, "name": who.name}

"""The CLI's API mode: where `cronlog jobs ...` and `cronlog runs ...` find the REST API
and a token, and the Service calls those commands make, answered over the API.

A team member given a token needs nothing else: no Kafka or database credentials. The
API is found, first match wins, from `--api URL` / `--token T` on `cronlog jobs` or
`cronlog runs`, the environment (`CRONLOG_API_URL`, `CRONLOG_TOKEN`, read by the CLI,
connectors/cli/access.py, and passed in with the options), or the profile
`cronlog login` wrote (`$XDG_CONFIG_HOME/cronlog/profile.json`, else
`~/.config/cronlog/profile.json`, mode 600). Without any, the commands work directly on
Kafka and PostgreSQL as admin (the operators' mode, `--direct` forces it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from connectors.api.service import Accepted, Principal, ServiceError
from connectors.client import ApiError, Client, segment

PROFILE_NAME = "profile.json"


@dataclass(frozen=True, slots=True)
class Remote:
    """Where the API is, and the token to show it."""

    url: str
    token: str
    source: str  # where they came from (said in errors)


def profile_path() -> Path:
    # Not a cronlog setting: where the platform keeps a user's configuration files (the
    # XDG base directory convention, looked up like Path.home()'s HOME beside it).
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "cronlog" / PROFILE_NAME


def save_profile(url: str, token: str, path: Path | None = None) -> Path:
    """Write the profile readable by its owner only (it holds a token): created with mode
    600, and any older file replaced, not rewritten in place."""
    path = path or profile_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fresh = path.with_suffix(".tmp")
    fresh.unlink(missing_ok=True)
    fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(orjson.dumps({"api": url, "token": token}))
    fresh.replace(path)
    return path


def load_profile(path: Path | None = None) -> Remote | None:
    path = path or profile_path()
    try:
        doc = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ServiceError(400, f"the profile {path} cannot be read: {exc}") from exc
    if not isinstance(doc, dict) or not doc.get("api") or not doc.get("token"):
        raise ServiceError(400, f"the profile {path} has no api and token: run `cronlog login`")
    return Remote(str(doc["api"]), str(doc["token"]), str(path))


def find_remote(url: str | None, token: str | None, direct: bool) -> Remote | None:
    """The API to use, or None for the direct mode. `url` and `token`: the options, else
    CRONLOG_API_URL and CRONLOG_TOKEN (the CLI chooses, connectors/cli/access.py)."""
    if direct:
        return None
    url = url or None
    token = token or None
    if url or token:
        if not (url and token):
            missing = (
                "a token (--token or CRONLOG_TOKEN)" if url else "a URL (--api or CRONLOG_API_URL)"
            )
            raise ServiceError(400, f"the API mode needs {missing}")
        return Remote(url, token, "options or environment")
    return load_profile()


def _refused(exc: ApiError) -> ServiceError:
    return ServiceError(exc.status, exc.message, exc.field)


class RemoteService:
    """The Service calls the CLI makes, over the REST API. `who` is ignored: the API
    knows the caller by the token (an owner sees and changes only its own jobs)."""

    def __init__(self, remote: Remote) -> None:
        self.remote = remote
        self.client = Client(remote.url, remote.token)

    def open(self) -> None:
        pass

    def close(self) -> None:
        self.client.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            return self.client.request(method, path, **kwargs)
        except ApiError as exc:
            raise _refused(exc) from exc

    def _accepted(self, method: str, path: str, **kwargs: Any) -> Accepted:
        answer = self._call(method, path, **kwargs)
        return Accepted(answer.json(), answer.status_code in (200, 201))

    def put_job(
        self, who: Principal, body: dict[str, Any], allow_missing_upstreams: bool = False
    ) -> Accepted:
        path = f"/jobs/{segment(str(body.get('job_id', '')))}"
        query = {"allow_missing_upstreams": "true"} if allow_missing_upstreams else None
        return self._accepted("PUT", path, json=body, params=query)

    def job(self, who: Principal, job_id: str) -> dict[str, Any]:
        row: dict[str, Any] = self._call("GET", f"/jobs/{segment(job_id)}").json()
        return row

    def jobs(
        self,
        who: Principal,
        *,
        owner: str | None = None,
        paused: bool | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        try:
            return self.client.jobs_page(owner=owner, paused=paused, limit=limit, cursor=cursor)
        except ApiError as exc:
            raise _refused(exc) from exc

    def job_command(self, who: Principal, job_id: str, kind: str, **fields: Any) -> Accepted:
        path = f"/jobs/{segment(job_id)}"
        if kind == "delete":
            return self._accepted("DELETE", path)
        action = {"run_now": "run-now"}.get(kind, kind)
        body = fields or None
        return self._accepted("POST", f"{path}/{action}", json=body)

    def runs(
        self,
        who: Principal,
        *,
        job_id: str | None = None,
        state: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        try:
            return self.client.runs_page(job_id=job_id, state=state, limit=limit, cursor=cursor)
        except ApiError as exc:
            raise _refused(exc) from exc

    def run(self, who: Principal, run_id: str) -> dict[str, Any]:
        row: dict[str, Any] = self._call("GET", f"/runs/{segment(run_id)}").json()
        return row

    def run_command(self, who: Principal, run_id: str, kind: str, **fields: Any) -> Accepted:
        return self._accepted("POST", f"/runs/{segment(run_id)}/{kind}", json=fields or None)

    def secrets(self, who: Principal) -> dict[str, Any]:
        listed: dict[str, Any] = self._call("GET", "/secrets").json()
        return listed

    def logs(
        self,
        who: Principal,
        run_id: str,
        attempt: int | None = None,
        stream: str | None = None,
    ) -> list[dict[str, Any]]:
        params = {"attempt": attempt, "stream": stream}
        text = self._call("GET", f"/runs/{segment(run_id)}/logs", params=params).text
        return [{"data": text}]

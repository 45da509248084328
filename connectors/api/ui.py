"""The web dashboard at /ui: server-rendered pages over the same Service as the REST API.

Same tokens, same owner scoping: a browser signs in once with its API token, kept in an
HttpOnly, SameSite=Strict cookie; every page then asks the Service as that principal, so
an owner sees only its jobs, runs and dead letters (another owner's job is "not found",
as in the API). Buttons are plain HTML forms (pause, resume, run now) carrying a token
derived from the caller's own API token (HMAC), which a page of another site cannot know,
so no cross-site form can act for a signed-in user. No JavaScript and no build step: the
charts are SVG drawn by the templates from connectors/api/views.py.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import shlex
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from starlette.concurrency import run_in_threadpool

from connectors.api import views
from connectors.api.auth import Principals
from connectors.api.limits import read_body
from connectors.api.service import Principal, Service, ServiceError
from streams.core.ids import iso_utc

COOKIE = "cronlog_token"
# The sign-in form's own token (double submit): set with the form, SameSite=strict, and
# required back with it, so another site cannot sign a browser in under its own token.
LOGIN_COOKIE = "cronlog_login"
TEMPLATES = Jinja2Templates(directory=str(Path(__file__).with_name("templates")))
TEMPLATES.env.filters["isotime"] = iso_utc  # epoch ms as ISO-8601 UTC
STATIC_DIR = Path(__file__).with_name("static")
# What a sign-in form may carry: a token is short; anything longer is not one.
MAX_FORM_BYTES = 4096
ACTIONS = {"pause": "pause", "resume": "resume", "run-now": "run_now"}
RUN_PAGE_LOG_CHUNKS = 256  # a run page shows at most this much output (16 KiB a chunk)


def csrf_token(api_token: str) -> str:
    """The form token of a signed-in browser: only a holder of the API token can make it."""
    return hmac.new(api_token.encode(), b"cronlog-ui-form", hashlib.sha256).hexdigest()


def _set_cookie(answer: Response, request: Request, name: str, value: str, path: str) -> None:
    """A cookie only this dashboard's own pages send back (HttpOnly, SameSite=strict),
    Secure when served over https (a trusted TLS proxy's X-Forwarded-Proto included)."""
    answer.set_cookie(
        name,
        value,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path=path,
    )


def _check_form(form: dict[str, str], token: str) -> None:
    """A signed-in form must carry the page's CSRF token (another site cannot make it)."""
    if not hmac.compare_digest(form.get("csrf", ""), csrf_token(token)):
        raise ServiceError(403, "the form is stale or not from this dashboard; reload it")


class _SignIn(Exception):
    """No valid token: the page sends the browser to the sign-in form."""


async def _form(request: Request) -> dict[str, str]:
    raw = await read_body(request, MAX_FORM_BYTES)
    return {k: v[0] for k, v in parse_qs(raw.decode("utf-8", "replace")).items()}


def create_router(service: Service, tokens: Principals) -> APIRouter:
    router = APIRouter(prefix="/ui", include_in_schema=False)

    def principal(request: Request) -> tuple[Principal, str]:
        token = request.cookies.get(COOKIE, "")
        who = tokens.principal(token) if token else None
        if who is None:
            raise _SignIn
        if who.kind == "worker":
            raise ServiceError(403, "worker tokens cannot use the dashboard")
        return who, token

    def page(request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        return TEMPLATES.TemplateResponse(request, name, context, status_code=status)

    async def render(request: Request, name: str, build: Any, *args: Any) -> Response:
        """Render a page whose context `build(who, *args)` computes in a thread (the
        Service blocks on PostgreSQL and Kafka); a refusal is an HTML error page."""
        try:
            who, token = principal(request)
            context = await run_in_threadpool(build, who, *args)
        except _SignIn:
            return RedirectResponse(f"/ui/login?next={quote(request.url.path)}", status_code=303)
        except ServiceError as exc:
            return page(request, "error.html", exc.status, code=exc.status, message=exc.message)
        return page(request, name, who=who, csrf=csrf_token(token), **context)

    # -- signing in ---------------------------------------------------------------------
    def login_page(request: Request, target: str, status: int, error: str | None) -> Response:
        """The sign-in form, with a fresh form token in it and in a cookie."""
        login = secrets.token_urlsafe(24)
        answer = page(request, "login.html", status, next=target, error=error, login=login)
        _set_cookie(answer, request, LOGIN_COOKIE, login, "/ui/login")
        return answer

    @router.get("/login")
    def login_form(request: Request, next: str = "/ui") -> Response:
        return login_page(request, _local(next), 200, None)

    @router.post("/login")
    async def login(request: Request) -> Response:
        try:
            form = await _form(request)
        except ServiceError as exc:
            return page(request, "error.html", exc.status, code=exc.status, message=exc.message)
        token, target = form.get("token", "").strip(), _local(form.get("next", "/ui"))
        expected = request.cookies.get(LOGIN_COOKIE, "")
        if not expected or not hmac.compare_digest(form.get("login", ""), expected):
            reason = "the sign-in form is stale or not from this dashboard; sign in again"
            return login_page(request, target, 403, reason)
        who = tokens.principal(token) if token else None
        if who is None or who.kind == "worker":
            reason = "unknown token" if who is None else "worker tokens cannot sign in"
            return login_page(request, target, 401, reason)
        answer = RedirectResponse(target, status_code=303)
        answer.delete_cookie(LOGIN_COOKIE, path="/ui/login")
        _set_cookie(answer, request, COOKIE, token, "/ui")
        return answer

    @router.post("/logout")
    async def logout(request: Request) -> Response:
        try:
            form = await _form(request)
            _, token = principal(request)
            _check_form(form, token)
        except _SignIn:
            return RedirectResponse("/ui/login", status_code=303)
        except ServiceError as exc:
            return page(request, "error.html", exc.status, code=exc.status, message=exc.message)
        answer = RedirectResponse("/ui/login", status_code=303)
        answer.delete_cookie(COOKIE, path="/ui")
        return answer

    # -- pages --------------------------------------------------------------------------
    def jobs_page(who: Principal, cursor: str | None) -> dict[str, Any]:
        listing = service.jobs(who, limit=100, cursor=cursor)
        recent = service.recent_states([j["job_id"] for j in listing["items"]])
        rows = [
            {**j, "schedule": views.schedule_text(j["spec"].get("schedule"))}
            for j in listing["items"]
        ]
        for row in rows:
            row["recent"] = recent[row["job_id"]]
        return {"jobs": rows, "next": listing["next"]}

    @router.get("")
    async def jobs(request: Request, cursor: str | None = None) -> Response:
        return await render(request, "jobs.html", jobs_page, cursor)

    def job_page(who: Principal, job_id: str) -> dict[str, Any]:
        job = service.job(who, job_id)
        runs = service.runs(who, job_id=job_id, limit=100)["items"]
        lateness = service.lateness(who, job_id)
        downstream = service.downstream(who, job_id)
        now = datetime.now(UTC)
        for r in runs:
            r["duration"] = views.duration_text(r.get("started_at"), r.get("finished_at"))
            r["ahead"] = views.ahead(r, now)
        return {
            "job": job,
            "schedule": views.schedule_text(job["spec"].get("schedule")),
            "command": shlex.join(job["spec"]["command"]),
            "runs": list(reversed(runs)),  # the grid reads oldest to newest
            "bins": views.lateness_bins(lateness),
            "started": len(lateness),
            "upstream": job["spec"].get("depends_on") or [],
            "downstream": downstream,
        }

    @router.get("/jobs/{job_id}")
    async def job(request: Request, job_id: str) -> Response:
        return await render(request, "job.html", job_page, job_id)

    def appeared(who: Principal, run_id: str, wait_s: float = 5.0) -> bool:
        """Whether a run just requested shows in the history within `wait_s`."""
        end = time.monotonic() + wait_s
        while True:
            try:
                service.run(who, run_id, log_chunks=0)
                return True
            except ServiceError as exc:
                if exc.status != 404 or time.monotonic() > end:
                    return False
            time.sleep(0.2)

    @router.post("/jobs/{job_id}/{action}")
    async def act(request: Request, job_id: str, action: str) -> Response:
        try:
            form = await _form(request)
            who, token = principal(request)
            _check_form(form, token)
            if action not in ACTIONS:
                raise ServiceError(404, f"no action {action!r}")
            accepted = await run_in_threadpool(service.job_command, who, job_id, ACTIONS[action])
        except _SignIn:
            return RedirectResponse("/ui/login", status_code=303)
        except ServiceError as exc:
            return page(request, "error.html", exc.status, code=exc.status, message=exc.message)
        done = "done" if accepted.applied else "accepted"
        if action == "run-now":  # to the run it started, once the history has it
            run_id = accepted.body["run_id"]
            if await run_in_threadpool(appeared, who, run_id):
                return RedirectResponse(f"/ui/runs/{quote(run_id, safe='')}?accepted=run-now", 303)
        back = _local(form.get("back", f"/ui/jobs/{quote(job_id)}"))
        sep = "&" if "?" in back else "?"
        return RedirectResponse(f"{back}{sep}{done}={quote(action)}", status_code=303)

    def run_page(who: Principal, run_id: str) -> dict[str, Any]:
        run = service.run(who, run_id, log_chunks=0)
        for t in run["transitions"]:
            t["words"] = views.detail_text(t.get("detail"))
        chunks = service.logs(who, run_id, limit=RUN_PAGE_LOG_CHUNKS)
        return {"run": run, "logs": views.logs_by_attempt(chunks)}

    @router.post("/runs/{run_id}/{action}")
    async def act_on_run(request: Request, run_id: str, action: str) -> Response:
        """Cancel or rerun a run from its page, then back to it."""
        try:
            form = await _form(request)
            who, token = principal(request)
            _check_form(form, token)
            if action not in ("cancel", "rerun"):
                raise ServiceError(404, f"no action {action!r}")
            await run_in_threadpool(service.run_command, who, run_id, action)
        except _SignIn:
            return RedirectResponse("/ui/login", status_code=303)
        except ServiceError as exc:
            return page(request, "error.html", exc.status, code=exc.status, message=exc.message)
        return RedirectResponse(f"/ui/runs/{quote(run_id, safe='')}?accepted={action}", 303)

    @router.get("/runs/{run_id}")
    async def run(request: Request, run_id: str) -> Response:
        return await render(request, "run.html", run_page, run_id)

    def workers_page(_who: Principal) -> dict[str, Any]:
        return {"workers": service.workers()}

    @router.get("/workers")
    async def workers(request: Request) -> Response:
        return await render(request, "workers.html", workers_page)

    def dead_letters_page(who: Principal) -> dict[str, Any]:
        return {"letters": service.dead_letters(who, limit=50)}

    @router.get("/dead-letters")
    async def dead_letters(request: Request) -> Response:
        return await render(request, "dead_letters.html", dead_letters_page)

    def dag_page(who: Principal) -> dict[str, Any]:
        # Only jobs in a dependency (the rest would be a column of lone boxes); an
        # upstream that is not a visible job is drawn dashed.
        return {"layout": views.dependency_layout(service.dependencies(who))}

    @router.get("/dag")
    async def dag(request: Request) -> Response:
        return await render(request, "dag.html", dag_page)

    return router


def _local(target: str) -> str:
    """Redirect only within the dashboard (no open redirect through ?next=)."""
    return target if target.startswith("/ui") and not target.startswith("//") else "/ui"

"""`cronlog jobs ...`: register jobs, change them, pause, resume and delete them, start
runs now or backfill them, print the job reference (`jobs schema`) (`jobs export` is with
jobs as code, connectors/cli/jobs_as_code.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer

from connectors.api.service import ADMIN, Service, ServiceError
from connectors.apply import JobFileError, read_jobs
from connectors.cli.access import open_service, use_mode
from connectors.cli.common import fail
from connectors.cli.jobs_as_code import MissingOkOpt, jobs_export
from connectors.cli.output import JsonOpt, console, print_accepted, print_json, print_table
from connectors.remote import RemoteService
from streams.core.job_schema import job_file_schema, job_schema, reference_markdown

jobs_app = typer.Typer(help="Register and manage jobs.", no_args_is_help=True)
jobs_app.callback()(use_mode)


def _schedule(spec: dict[str, Any]) -> str:
    schedule = spec.get("schedule") or {}
    if "cron" in schedule:
        return f"cron {schedule['cron']} {schedule.get('timezone', 'UTC')}"
    if "every_ms" in schedule:
        return f"every {schedule['every_ms'] / 1000:g}s"
    if "at_ms" in schedule:
        return "once"
    return "after " + ",".join(spec.get("depends_on") or [])


def _documents(file: Path) -> list[dict[str, Any]]:
    """The jobs of a file or stdin ('-'): one job, a list, or {jobs: [...], owner: ...}."""
    try:
        text = sys.stdin.read() if str(file) == "-" else file.read_text()
        found = read_jobs(text, str(file))
    except OSError as exc:
        raise fail(f"cannot read {file}: {exc}", 2) from exc
    except JobFileError as exc:
        raise fail(str(exc), 2) from exc
    for value, line in found:
        if not isinstance(value, dict):
            raise fail(
                f"{file}:{line}: expected a job object, a list of them, or {{jobs: [...]}}", 2
            )
    return [value for value, _ in found]


@jobs_app.command("add")
def jobs_add(
    job: Annotated[
        str | None, typer.Argument(help="A job as JSON (the fields of a job.upsert command).")
    ] = None,
    file: Annotated[
        Path | None, typer.Option("-f", "--file", help="A YAML/JSON file of jobs ('-': stdin).")
    ] = None,
    owner: Annotated[
        str | None,
        typer.Option(
            help="Owner of jobs that name none (default: the token's owner over the API, "
            "'default' directly)."
        ),
    ] = None,
    as_json: JsonOpt = False,
    allow_missing_upstreams: MissingOkOpt = False,
) -> None:
    """Register jobs, or change them (an existing job is replaced by the new spec). An
    upstream (depends_on) neither registered nor among the jobs given is refused unless
    --allow-missing-upstreams."""
    if (job is None) == (file is None):
        typer.secho("error: give a job as JSON or -f FILE", fg=typer.colors.RED, err=True)
        raise typer.Exit(2)
    if file is not None:
        docs = _documents(file)
    else:
        try:
            parsed = orjson.loads(job or "")
        except orjson.JSONDecodeError as exc:
            typer.secho(f"error: not valid JSON: {exc}", fg=typer.colors.RED, err=True)
            raise typer.Exit(2) from exc
        docs = [parsed] if isinstance(parsed, dict) else parsed
    failed = 0
    batch = {str(d.get("job_id")) for d in docs if isinstance(d, dict)}
    with open_service() as service:
        for doc in docs:
            given = {"owner": owner} if owner else {}
            if not given and isinstance(service, Service):
                given = {"owner": "default"}
            doc = {**given, **{k: v for k, v in doc.items() if k != "type"}}
            # Jobs given together may name each other in any order: their upstreams
            # among them are not missing (the API would see them missing until each
            # is registered); any other is the API's to refuse or allow.
            upstreams = doc.get("depends_on")
            within = isinstance(upstreams, list) and all(
                u in batch or _registered_job(service, u) for u in upstreams
            )
            try:
                accepted = service.put_job(
                    ADMIN, doc, allow_missing_upstreams=allow_missing_upstreams or within
                )
            except ServiceError as exc:
                if exc.status >= 500:
                    raise
                where = f" ({exc.field})" if exc.field else ""
                typer.secho(
                    f"{doc.get('job_id', '?')}: rejected{where}: {exc.message}",
                    fg=typer.colors.RED,
                    err=True,
                )
                failed += 1
                continue
            print_accepted(accepted, as_json, f"{doc['job_id']}: registered")
    if failed:
        raise typer.Exit(1)


def _registered_job(service: Service | RemoteService, job_id: object) -> bool:
    try:
        service.job(ADMIN, str(job_id))
    except ServiceError as exc:
        if exc.status >= 500:
            raise
        return False
    return True


@jobs_app.command("list")
def jobs_list(
    owner: Annotated[str | None, typer.Option(help="Only this owner's jobs.")] = None,
    paused: Annotated[bool | None, typer.Option("--paused/--active", help="Filter.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 100,
    as_json: JsonOpt = False,
) -> None:
    """Jobs, by id."""
    with open_service() as service:
        page = service.jobs(ADMIN, owner=owner, paused=paused, limit=limit)
    if as_json:
        print_json(page["items"])
        return
    rows = [
        {**j, "schedule": _schedule(j["spec"]), "next_due": j["next_due_at"] or "-"}
        for j in page["items"]
    ]
    print_table(rows, ["job_id", "owner", "schedule", "paused", "next_due"])


@jobs_app.command("show")
def jobs_show(job_id: str, as_json: JsonOpt = False) -> None:
    """One job: its spec and recent runs."""
    with open_service() as service:
        job = service.job(ADMIN, job_id)
        runs = service.runs(ADMIN, job_id=job_id, limit=10)["items"]
    if as_json:
        print_json({**job, "recent_runs": runs})
        return
    console.print(f"[bold]{job_id}[/bold]  owner {job['owner']}  {_schedule(job['spec'])}")
    console.print(f"paused {job['paused']}  next due {job['next_due_at'] or '-'}")
    if job.get("cycle"):
        cycle = " -> ".join(job["cycle"])
        console.print(f"[red]refused: depends_on closes the dependency cycle {cycle}[/red]")
    console.print("command: " + " ".join(job["spec"]["command"]))
    for e in job["spec"].get("exclude") or []:
        days = e["first"] if e["first"] == e["last"] else f"{e['first']}..{e['last']}"
        console.print(f"not on {days} (calendar {e['name']})")
    if job["spec"].get("max_runs"):
        console.print(f"at most {job['spec']['max_runs']} runs")
    for p in job["spec"].get("params") or []:
        default = "required" if p["default"] is None else f"default {p['default']}"
        console.print(f"param {p['name']}: {p['type']}, {default}")
    print_table(runs, ["run_id", "state", "attempt", "worker_id", "started_at", "exit_code"])


def _job_action(kind: str, done: str) -> Any:
    def action(job_id: str, as_json: JsonOpt = False) -> None:
        with open_service() as service:
            print_accepted(service.job_command(ADMIN, job_id, kind), as_json, f"{job_id}: {done}")

    action.__doc__ = f"{done.capitalize()} a job."
    return action


jobs_app.command("pause")(_job_action("pause", "paused"))


@jobs_app.command("resume")
def jobs_resume(
    job_id: str,
    missed: Annotated[
        str,
        typer.Option(help="The firings the pause covered: skip, last (run it) or all."),
    ] = "skip",
    as_json: JsonOpt = False,
) -> None:
    """Resume a job."""
    fields = {"missed": missed} if missed != "skip" else {}
    with open_service() as service:
        accepted = service.job_command(ADMIN, job_id, "resume", **fields)
    print_accepted(accepted, as_json, f"{job_id}: resumed")


jobs_app.command("delete")(_job_action("delete", "deleted"))


ParamOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--param",
        "-p",
        help="NAME=VALUE for one of the job's parameters (VALUE read as JSON when it is: "
        '5, true, "text"; else as text). Repeatable.',
    ),
]


def _param_values(given: list[str] | None) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for item in given or []:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise fail(f"--param {item!r}: expected NAME=VALUE", 2)
        try:
            values[name] = orjson.loads(text)
        except orjson.JSONDecodeError:
            values[name] = text
    return values


@jobs_app.command("run-now")
def jobs_run_now(
    job_id: str,
    request_id: Annotated[
        str | None, typer.Option(help="Idempotency key: the same key starts one run.")
    ] = None,
    param: ParamOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Start a manual run now (with values for the job's parameters)."""
    fields: dict[str, Any] = {"request_id": request_id} if request_id else {}
    if param:
        fields["params"] = _param_values(param)
    with open_service() as service:
        accepted = service.job_command(ADMIN, job_id, "run_now", **fields)
    print_accepted(accepted, as_json, f"run {accepted.body['run_id']} requested")


@jobs_app.command("backfill")
def jobs_backfill(
    job_id: str,
    since: Annotated[str, typer.Option("--from", help="ISO-8601 UTC, inclusive.")],
    until: Annotated[str, typer.Option("--to", help="ISO-8601 UTC, inclusive.")],
    request_id: Annotated[
        str | None,
        typer.Option(help="Idempotency key: the same request sent again creates nothing."),
    ] = None,
    param: ParamOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create the runs a job's schedule had between two times before it was registered
    (times an earlier backfill decided are never created twice)."""
    fields: dict[str, Any] = {"from": since, "to": until}
    if request_id:
        fields["request_id"] = request_id
    if param:
        fields["params"] = _param_values(param)
    with open_service() as service:
        accepted = service.job_command(ADMIN, job_id, "backfill", **fields)
    print_accepted(accepted, as_json, f"{job_id}: backfill {since} .. {until} requested")


jobs_app.command("export")(jobs_export)


@jobs_app.command("schema")
def jobs_schema(
    markdown: Annotated[
        bool, typer.Option("--markdown", help="The reference as Markdown (docs/jobs.md).")
    ] = False,
    file: Annotated[
        bool,
        typer.Option(
            "--file", help="The JSON Schema of a job file for editors (docs/job.schema.json)."
        ),
    ] = False,
) -> None:
    """Every field of a job: type, bounds, default and meaning, as a JSON Schema (the
    API's request body), or as the Markdown reference."""
    if markdown:
        typer.echo(reference_markdown(), nl=False)
        return
    schema = job_file_schema() if file else job_schema()
    typer.echo(json.dumps(schema, indent=2, ensure_ascii=False))

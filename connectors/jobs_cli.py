"""`cronlog jobs ...` and `cronlog runs ...`: the CLI for humans.

Two modes, the same commands and output (aligned tables by default, JSON with --json):
over the REST API with a token (a team member's; connectors/remote.py says where the
URL and token come from), or directly on Kafka and PostgreSQL as admin (an operator's),
through the same Service the REST API uses, so the rules are the same. A refusal is
printed as the API words it; the exit code is 1 for a refusal, 2 when cronlog cannot be
reached.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn

import orjson
import psycopg
import typer
import yaml
from rich.console import Console
from rich.table import Table

from connectors.api.service import ADMIN, Accepted, Service, ServiceError
from connectors.apply import (
    MANAGED_BY,
    Desired,
    JobFileError,
    describe,
    export_documents,
    load,
    plan,
    read_jobs,
    summary,
)
from connectors.remote import RemoteService, find_remote
from projections.migrate import MigrationError, migrate_for
from streams.settings import Settings, SettingsError

jobs_app = typer.Typer(help="Register and manage jobs.", no_args_is_help=True)
runs_app = typer.Typer(help="Inspect and steer runs.", no_args_is_help=True)
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
# Piped output (grep, awk, tests) is never cut to a terminal's width.
console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 400)


@dataclass
class _Mode:
    """How this invocation reaches cronlog (connectors/remote.py): the options given to
    `cronlog jobs` / `cronlog runs`."""

    api: str | None = None
    token: str | None = None
    direct: bool = False


MODE = _Mode()
ApiOpt = Annotated[
    str | None,
    typer.Option("--api", help="The REST API's URL (else CRONLOG_API_URL, else the profile)."),
]
TokenOpt = Annotated[
    str | None,
    typer.Option("--token", help="An API token (else CRONLOG_TOKEN, else the profile)."),
]
DirectOpt = Annotated[
    bool,
    typer.Option("--direct", help="Work on Kafka and PostgreSQL directly, as admin."),
]


def _mode(api: ApiOpt = None, token: TokenOpt = None, direct: DirectOpt = False) -> None:
    """Over the REST API when given a URL and a token, else directly (operators)."""
    MODE.api, MODE.token, MODE.direct = api, token, direct


jobs_app.callback()(_mode)
runs_app.callback()(_mode)


def _fail(message: str, code: int) -> NoReturn:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


@contextmanager
def _service(wait_s: float = 5.0) -> Iterator[Service | RemoteService]:
    try:
        remote = find_remote(MODE.api, MODE.token, MODE.direct)
    except ServiceError as exc:
        _fail(exc.message, 2)
    service: Service | RemoteService
    if remote is not None:
        service = RemoteService(remote)
    else:
        try:
            settings = Settings.from_env()
        except SettingsError as exc:
            _fail(str(exc), 2)
        try:
            migrate_for(settings)  # the tables it reads, at this version's schema
        except (MigrationError, psycopg.Error) as exc:
            _fail(f"the database: {exc}", 2)
        service = Service(settings, wait_s=wait_s)
    service.open()
    try:
        yield service
    except ServiceError as exc:
        where = f" ({exc.field})" if exc.field else ""
        typer.secho(f"error{where}: {exc.message}", fg=typer.colors.RED, err=True)
        raise typer.Exit(1 if exc.status < 500 else 2) from exc
    finally:
        service.close()


def _json(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")


def _table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in columns:
        table.add_column(column.upper(), no_wrap=True)
    for row in rows:
        table.add_row(*("" if row.get(c) is None else str(row.get(c)) for c in columns))
    console.print(table)


def _done(accepted: Accepted, as_json: bool, what: str) -> None:
    if as_json:
        _json(accepted.body)
    else:
        typer.echo(what + ("" if accepted.applied else " (accepted; applying)"))


def _schedule(spec: dict[str, Any]) -> str:
    schedule = spec.get("schedule") or {}
    if "cron" in schedule:
        return f"cron {schedule['cron']} {schedule.get('timezone', 'UTC')}"
    if "every_ms" in schedule:
        return f"every {schedule['every_ms'] / 1000:g}s"
    if "at_ms" in schedule:
        return "once"
    return "after " + ",".join(spec.get("depends_on") or [])


# -- jobs ----------------------------------------------------------------------------------
def _documents(file: Path) -> list[dict[str, Any]]:
    """The jobs of a file or stdin ('-'): one job, a list, or {jobs: [...], owner: ...}."""
    try:
        text = sys.stdin.read() if str(file) == "-" else file.read_text()
        found = read_jobs(text, str(file))
    except OSError as exc:
        _fail(f"cannot read {file}: {exc}", 2)
    except JobFileError as exc:
        _fail(str(exc), 2)
    for value, line in found:
        if not isinstance(value, dict):
            _fail(f"{file}:{line}: expected a job object, a list of them, or {{jobs: [...]}}", 2)
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
) -> None:
    """Register jobs, or change them (an existing job is replaced by the new spec)."""
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
    with _service() as service:
        for doc in docs:
            given = {"owner": owner} if owner else {}
            if not given and isinstance(service, Service):
                given = {"owner": "default"}
            doc = {**given, **{k: v for k, v in doc.items() if k != "type"}}
            try:
                accepted = service.put_job(ADMIN, doc)
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
            _done(accepted, as_json, f"{doc['job_id']}: registered")
    if failed:
        raise typer.Exit(1)


@jobs_app.command("list")
def jobs_list(
    owner: Annotated[str | None, typer.Option(help="Only this owner's jobs.")] = None,
    paused: Annotated[bool | None, typer.Option("--paused/--active", help="Filter.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 100,
    as_json: JsonOpt = False,
) -> None:
    """Jobs, by id."""
    with _service() as service:
        page = service.jobs(ADMIN, owner=owner, paused=paused, limit=limit)
    if as_json:
        _json(page["items"])
        return
    rows = [
        {**j, "schedule": _schedule(j["spec"]), "next_due": j["next_due_at"] or "-"}
        for j in page["items"]
    ]
    _table(rows, ["job_id", "owner", "schedule", "paused", "next_due"])


@jobs_app.command("show")
def jobs_show(job_id: str, as_json: JsonOpt = False) -> None:
    """One job: its spec and recent runs."""
    with _service() as service:
        job = service.job(ADMIN, job_id)
        runs = service.runs(ADMIN, job_id=job_id, limit=10)["items"]
    if as_json:
        _json({**job, "recent_runs": runs})
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
    _table(runs, ["run_id", "state", "attempt", "worker_id", "started_at", "exit_code"])


def _job_action(kind: str, done: str) -> Any:
    def action(job_id: str, as_json: JsonOpt = False) -> None:
        with _service() as service:
            _done(service.job_command(ADMIN, job_id, kind), as_json, f"{job_id}: {done}")

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
    with _service() as service:
        accepted = service.job_command(ADMIN, job_id, "resume", **fields)
    _done(accepted, as_json, f"{job_id}: resumed")


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
            _fail(f"--param {item!r}: expected NAME=VALUE", 2)
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
    with _service() as service:
        accepted = service.job_command(ADMIN, job_id, "run_now", **fields)
    _done(accepted, as_json, f"run {accepted.body['run_id']} requested")


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
    with _service() as service:
        accepted = service.job_command(ADMIN, job_id, "backfill", **fields)
    _done(accepted, as_json, f"{job_id}: backfill {since} .. {until} requested")


# -- runs ----------------------------------------------------------------------------------
@runs_app.command("list")
def runs_list(
    job: Annotated[str | None, typer.Option(help="Only this job's runs.")] = None,
    state: Annotated[str | None, typer.Option(help="Only runs in this state.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 20,
    as_json: JsonOpt = False,
) -> None:
    """Runs, newest scheduled first."""
    with _service() as service:
        items = service.runs(ADMIN, job_id=job, state=state, limit=limit)["items"]
    if as_json:
        _json(items)
        return
    _table(
        items,
        ["run_id", "state", "attempt", "worker_id", "scheduled_at", "started_at", "exit_code"],
    )


@runs_app.command("show")
def runs_show(run_id: str, as_json: JsonOpt = False) -> None:
    """One run: its transitions and the tail of its log."""
    with _service() as service:
        run = service.run(ADMIN, run_id)
    if as_json:
        _json(run)
        return
    console.print(f"[bold]{run_id}[/bold]  {run['state']}  attempt {run['attempt']}")
    if run["error"]:
        console.print(f"error: {run['error']}")
    if run.get("params"):
        console.print("params: " + orjson.dumps(run["params"]).decode())
    _table(run["transitions"], ["attempt", "state", "at", "worker_id"])
    if run["log_tail"]:
        console.print("[bold]log tail[/bold]")
        sys.stdout.write(run["log_tail"])


@runs_app.command("cancel")
def runs_cancel(run_id: str, as_json: JsonOpt = False) -> None:
    """Cancel a run (its process is killed if it runs)."""
    with _service() as service:
        _done(service.run_command(ADMIN, run_id, "cancel"), as_json, f"{run_id}: cancel requested")


@runs_app.command("logs")
def runs_logs(
    run_id: str,
    attempt: Annotated[int | None, typer.Option(min=1)] = None,
    stream: Annotated[str | None, typer.Option(help="stdout or stderr.")] = None,
) -> None:
    """A run's whole output."""
    with _service() as service:
        chunks = service.logs(ADMIN, run_id, attempt, stream)
    for chunk in chunks:
        sys.stdout.write(chunk["data"])


# -- jobs as code (connectors/apply.py) ---------------------------------------------------
FilesOpt = Annotated[
    list[Path],
    typer.Option("-f", "--file", help="A YAML/JSON file of jobs, or a directory of them."),
]
ManagedOpt = Annotated[
    str, typer.Option("--managed-by", help="The name apply marks its jobs with, and prunes by.")
]
PruneOpt = Annotated[
    bool, typer.Option("--prune", help="Delete the jobs of that name the files no longer list.")
]


def _registered(service: Service | RemoteService) -> list[dict[str, Any]]:
    """Every job the caller may see (all of them for an admin)."""
    rows: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        page = service.jobs(ADMIN, limit=1000, cursor=cursor)
        rows.extend(page["items"])
        cursor = page["next"]
        if not cursor:
            return rows


def _default_owner(service: Service | RemoteService) -> str | None:
    """Over the API a job naming no owner is the token's; directly, 'default'."""
    return "default" if isinstance(service, Service) else None


def _load(files: list[Path], managed_by: str, owner: str | None) -> list[Desired]:
    try:
        return load(files, managed_by, owner)
    except JobFileError as exc:
        _fail(str(exc), 1)
    except OSError as exc:
        _fail(f"cannot read the job files: {exc}", 2)


def apply_files(
    files: FilesOpt,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the changes only.")] = False,
    prune: PruneOpt = False,
    managed_by: ManagedOpt = MANAGED_BY,
    owner: Annotated[str | None, typer.Option(help="Owner of jobs that name none.")] = None,
    api: ApiOpt = None,
    token: TokenOpt = None,
    direct: DirectOpt = False,
) -> None:
    """Make the registered jobs what the files say: print the difference (created,
    changed field by field, unchanged, deleted with --prune), then apply it."""
    _mode(api, token, direct)
    with _service() as service:
        desired = _load(files, managed_by, owner or _default_owner(service))
        changes = plan(desired, _registered(service), managed_by, prune)
        for change in changes:
            for line in describe(change):
                typer.echo(line)
        typer.echo(summary(changes) + (" (dry run: nothing applied)" if dry_run else ""))
        failed = 0
        if dry_run:
            return
        for change in changes:
            try:
                if change.doc is not None:
                    service.put_job(ADMIN, change.doc)
                elif change.kind == "delete":
                    service.job_command(ADMIN, change.job_id, "delete")
            except ServiceError as exc:
                if exc.status >= 500:
                    raise
                where = f" ({exc.field})" if exc.field else ""
                typer.secho(
                    f"{change.job_id}: refused{where}: {exc.message}", fg=typer.colors.RED, err=True
                )
                failed += 1
    if failed:
        raise typer.Exit(1)


def diff_files(
    files: FilesOpt,
    prune: PruneOpt = False,
    managed_by: ManagedOpt = MANAGED_BY,
    owner: Annotated[str | None, typer.Option(help="Owner of jobs that name none.")] = None,
    api: ApiOpt = None,
    token: TokenOpt = None,
    direct: DirectOpt = False,
) -> None:
    """Print how the registered jobs differ from the files; exit 1 when they do (drift),
    0 when they do not, 2 when cronlog cannot be reached."""
    _mode(api, token, direct)
    with _service() as service:
        desired = _load(files, managed_by, owner or _default_owner(service))
        changes = plan(desired, _registered(service), managed_by, prune)
    drift = [c for c in changes if c.kind != "same"]
    for change in drift:
        for line in describe(change):
            typer.echo(line)
    typer.echo(summary(changes))
    if drift:
        raise typer.Exit(1)


@jobs_app.command("export")
def jobs_export(
    owner: Annotated[str | None, typer.Option(help="Only this owner's jobs.")] = None,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="Write to this file (default: stdout).")
    ] = None,
) -> None:
    """The registered jobs as a YAML file that `cronlog apply` reads back unchanged."""
    with _service() as service:
        rows = [r for r in _registered(service) if owner is None or r["owner"] == owner]
    text = yaml.safe_dump(export_documents(rows), sort_keys=False, allow_unicode=True)
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text)
        typer.echo(f"{len(rows)} jobs written to {output}")

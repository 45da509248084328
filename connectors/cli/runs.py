"""`cronlog runs ...`: list runs, show one with its log's tail, cancel one, print its
output."""

from __future__ import annotations

import sys
from typing import Annotated

import orjson
import typer

from connectors.api.service import ADMIN
from connectors.cli.access import open_service, use_mode
from connectors.cli.output import JsonOpt, console, print_accepted, print_json, print_table

runs_app = typer.Typer(help="Inspect and steer runs.", no_args_is_help=True)
runs_app.callback()(use_mode)


@runs_app.command("list")
def runs_list(
    job: Annotated[str | None, typer.Option(help="Only this job's runs.")] = None,
    state: Annotated[str | None, typer.Option(help="Only runs in this state.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 20,
    as_json: JsonOpt = False,
) -> None:
    """Runs, newest scheduled first."""
    with open_service() as service:
        items = service.runs(ADMIN, job_id=job, state=state, limit=limit)["items"]
    if as_json:
        print_json(items)
        return
    print_table(
        items,
        ["run_id", "state", "attempt", "worker_id", "scheduled_at", "started_at", "exit_code"],
    )


@runs_app.command("show")
def runs_show(run_id: str, as_json: JsonOpt = False) -> None:
    """One run: its transitions and the tail of its log."""
    with open_service() as service:
        run = service.run(ADMIN, run_id)
    if as_json:
        print_json(run)
        return
    console.print(f"[bold]{run_id}[/bold]  {run['state']}  attempt {run['attempt']}")
    if run["error"]:
        console.print(f"error: {run['error'].removeprefix('error: ')}")
    if run.get("params"):
        console.print("params: " + orjson.dumps(run["params"]).decode())
    print_table(run["transitions"], ["attempt", "state", "at", "worker_id"])
    if run["log_tail"]:
        console.print("[bold]log tail[/bold]")
        sys.stdout.write(run["log_tail"])


@runs_app.command("cancel")
def runs_cancel(run_id: str, as_json: JsonOpt = False) -> None:
    """Cancel a run (its process is killed if it runs)."""
    with open_service() as service:
        print_accepted(
            service.run_command(ADMIN, run_id, "cancel"), as_json, f"{run_id}: cancel requested"
        )


@runs_app.command("logs")
def runs_logs(
    run_id: str,
    attempt: Annotated[int | None, typer.Option(min=1)] = None,
    stream: Annotated[str | None, typer.Option(help="stdout or stderr.")] = None,
) -> None:
    """A run's whole output."""
    with open_service() as service:
        chunks = service.logs(ADMIN, run_id, attempt, stream)
    for chunk in chunks:
        sys.stdout.write(chunk["data"])

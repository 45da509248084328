"""The ``cronlog`` command line. Thin: parses arguments, builds Settings once from the
environment, and calls into the packages that do the work. This module puts the commands
together, in the order `cronlog --help` lists them; each module of the package holds the
commands of one concern:

- ``stack``: setting a deployment up (`stack`, `topics create`, `db migrate`);
- ``admin``: an operator's commands on the topics and projections (`db prune`, `audit`,
  `events`, `submit`);
- ``processes``: the long-running components (`scheduler`, `worker`, `projector`,
  `notifier`, `api`);
- ``jobs``, ``runs``, ``secrets``, ``jobs_as_code``: the CLI for humans (`jobs`, `runs`,
  `secrets list`, `apply`, `diff`), which reaches cronlog as ``access`` says (`login`,
  `logout`) and prints as ``output`` says;
- ``run``: everything on one machine (`run`) under the ``supervisor``;
- ``common``: what they share (errors, settings, logging, options).
"""

from __future__ import annotations

import re
from importlib import metadata, resources

import typer

from connectors.cli.access import login, logout, whoami
from connectors.cli.admin import audit, db_prune, events, submit
from connectors.cli.jobs import jobs_app
from connectors.cli.jobs_as_code import apply_files, diff_files
from connectors.cli.processes import api, notifier, projector, scheduler, worker
from connectors.cli.run import run_all
from connectors.cli.runs import runs_app
from connectors.cli.secrets import secrets_app
from connectors.cli.stack import db_migrate, stack_app, topics_app
from connectors.cli.tokens import tokens_app
from streams.core.zones import use_tzdata_only

ENV_HELP = (
    "Environment: CRONLOG_KAFKA (bootstrap servers), CRONLOG_DATABASE_URL, "
    "CRONLOG_TOPIC_PREFIX, CRONLOG_PARTITIONS, CRONLOG_LEDGER_STORE (cronlog scheduler); "
    "for the local stack CRONLOG_STATE_DIR and "
    "CRONLOG_STACK_KAFKA_PORT / _CONTROLLER_PORT / _POSTGRES_PORT / CRONLOG_STACK_BROKERS."
)

app = typer.Typer(
    name="cronlog",
    help=f"cronlog: a distributed job scheduler on Kafka. {ENV_HELP}",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def record_versions() -> dict[str, int]:
    """The newest version of each record this installation writes, from the schema
    history it carries (what an operator compares between releases: CHANGELOG.md)."""
    newest: dict[str, int] = {}
    for entry in resources.files("schemas").joinpath("avro", "history").iterdir():
        found = re.fullmatch(r"(\w+)\.v(\d+)\.avsc", entry.name)
        if found:
            name, version = found[1], int(found[2])
            newest[name] = max(version, newest.get(name, 0))
    return dict(sorted(newest.items()))


def _print_version(value: bool) -> None:
    if not value:
        return
    records = ", ".join(f"{name} v{n}" for name, n in record_versions().items())
    typer.echo(f"cronlog {metadata.version('cronlog')} (records: {records})")
    raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_print_version, help="Print the version."
    ),
) -> None:
    """cronlog: a distributed job scheduler on Kafka."""


app.add_typer(stack_app, name="stack")
app.add_typer(topics_app, name="topics")
# `db` gathers the schema's setup (stack) and the history's retention (admin).
db_app = typer.Typer(help="The PostgreSQL projections' schema.", no_args_is_help=True)
db_app.command("migrate")(db_migrate)
db_app.command("prune")(db_prune)
app.add_typer(db_app, name="db")
app.add_typer(jobs_app, name="jobs")
app.add_typer(runs_app, name="runs")
app.add_typer(secrets_app, name="secrets")
app.add_typer(tokens_app, name="tokens")
app.command("apply")(apply_files)
app.command("diff")(diff_files)
app.command("scheduler")(scheduler)
app.command("login")(login)
app.command("logout")(logout)
app.command("whoami")(whoami)
app.command("submit")(submit)
app.command("events")(events)
app.command("worker")(worker)
app.command("projector")(projector)
app.command("notifier")(notifier)
app.command("api")(api)
app.command("audit")(audit)
app.command("run")(run_all)


def main() -> None:
    # Every node computes fire times from the same time zone database: the tzdata
    # package pinned with cronlog, not whatever the host has in /usr/share/zoneinfo.
    # Schedule maths load zones from the package themselves (streams.core.zones), in
    # every process, spawned children included; this covers any other ZoneInfo use.
    use_tzdata_only()
    app()

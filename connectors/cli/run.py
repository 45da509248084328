"""`cronlog run`: everything on one machine (for `make run`). The supervisor it starts
the components under is connectors/cli/supervisor.py, imported when the command runs."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Annotated

import psycopg
import typer

from connectors.cli.common import (
    LogFormatOption,
    chosen_metrics_port,
    fail,
    load_settings,
    log_format_setting,
    say,
    stop_bound_s,
    stop_watchdog,
)
from connectors.cli.stack import local_stack
from connectors.stack import StackError, StackPaths
from connectors.stack.paths import DEMO
from projections.migrate import MigrationError, migrate_for
from streams.core.timing import TIMING
from streams.logs import LogFormatError
from streams.logs import log_format as chosen_log_format
from streams.settings import SettingsError, read_secret_grants
from streams.topics import TopicError, ensure_topics


def run_all(
    lead_s: Annotated[
        float, typer.Option(help="Propose runs this early (pre-dispatch).")
    ] = TIMING.lead_s,
    loglevel: Annotated[str, typer.Option(help="Log level of the components.")] = "info",
    api_port: Annotated[int, typer.Option(help="Port of the REST API.")] = 8080,
    demo: Annotated[
        Path | None, typer.Option(help="Jobs to register at start (YAML); default: the demo.")
    ] = DEMO,
    no_demo: Annotated[bool, typer.Option("--no-demo", help="Register no demo jobs.")] = False,
    no_stack: Annotated[
        bool,
        typer.Option("--no-stack", help="Use CRONLOG_KAFKA/CRONLOG_DATABASE_URL as they are."),
    ] = False,
    log_format: LogFormatOption = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            help="Metrics of the components from this port on (CRONLOG_METRICS_PORT): the "
            "node P, its ledger P+1, the workers P+10 and P+11, the projector P+20, the "
            "notifier P+21.",
        ),
    ] = None,
) -> None:
    """Everything on one machine (for `make run`): the local stack, the topics, a
    node, two workers, the projector, the notifier and the API under one
    supervisor, and
    the demo jobs. Ctrl-C, SIGTERM or closing the terminal (SIGHUP) stops it all; no
    component outlives it. One per state folder."""
    from connectors.cli.supervisor import Supervisor, components, register_demo, token_file
    from streams.lifecycle import InstanceRunning, hold_instance_lock

    settings = load_settings()
    try:  # the components' logs (each child reads it)
        os.environ["CRONLOG_LOG_FORMAT"] = chosen_log_format(log_format_setting(log_format))
    except LogFormatError as exc:
        raise fail(str(exc), 2) from None
    state = StackPaths.default(os.environ.get("CRONLOG_STATE_DIR")).state
    try:
        # Held until this process ends, however it ends: the kernel drops an flock
        # with its holder, so a SIGKILLed supervisor leaves no stale lock.
        lock = hold_instance_lock(state / "run.lock")
    except InstanceRunning as exc:
        pid = exc.pid if exc.pid is not None else "?"
        raise fail(
            f"cronlog run is already running with the state folder {state} (pid {pid}); "
            f"stop it first: Ctrl-C in its terminal, or `kill {pid}` (it stops every "
            "component), or use another CRONLOG_STATE_DIR"
        ) from exc
    component_bound_s = stop_bound_s()
    if not no_stack:
        try:
            local_stack().up(say)
        except StackError as exc:
            raise fail(str(exc)) from exc
    try:
        ensure_topics(settings)
        migrate_for(settings)
    except (TopicError, MigrationError, psycopg.Error) as exc:
        raise fail(str(exc), 2) from exc
    tokens = token_file(state)
    # One grants file for the node, the workers and the API (the user's, else the state
    # folder's, made once with nothing granted): a secret is usable by the owners it names.
    grants = os.environ.get("CRONLOG_SECRETS_GRANTS") or str(grants_file(state))
    try:
        settings = settings.with_(secret_grants=read_secret_grants(grants))
    except SettingsError as exc:
        raise fail(str(exc), 2) from exc
    env = {
        **os.environ,
        "CRONLOG_KAFKA": settings.kafka,
        "CRONLOG_DATABASE_URL": settings.database_url,
        "CRONLOG_TOPIC_PREFIX": settings.topic_prefix,
        "CRONLOG_PARTITIONS": str(settings.partitions),
        "CRONLOG_API_TOKENS_FILE": str(tokens),
        "CRONLOG_SECRETS_GRANTS": grants,
    }
    env.pop("CRONLOG_METRICS_PORT", None)  # each child is given its own port instead
    first_port = chosen_metrics_port(metrics_port)
    # A component gets its own stop bound (its watchdog) plus 10 s before the SIGKILL of
    # its process group; the supervisor's own watchdog fires only after that escalation
    # and the 10 s it then waits (and if it ever fires, the components die with it).
    escalate_s = component_bound_s + 10
    supervisor = Supervisor(
        components(state, lead_s, api_port, loglevel, first_port),
        env,
        say,
        stop_bound_s=escalate_s,
    )
    stop_watchdog(extra_s=10 + 10 + 5)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # SIGHUP: terminal closed
        signal.signal(signum, supervisor.stop)

    def started() -> None:
        if not no_demo and demo is not None and demo.exists():
            count = register_demo(settings, demo, say)
            say(f"registered {count} demo jobs from {demo}")
        sql = "SELECT run_id, state, exit_code FROM runs ORDER BY scheduled_at DESC LIMIT 10"
        # The tokens stay in their file (mode 600), never on a terminal or in its scrollback.
        lines = [
            "",
            "cronlog runs. Where to look:",
            f"  API    http://127.0.0.1:{api_port}/docs  (tokens, admin and the demo owner's,"
            f" in {tokens}, mode 600)",
            f"         cronlog login --api http://127.0.0.1:{api_port}   (asks for a token)",
            '         curl -H "Authorization: Bearer $CRONLOG_TOKEN" '
            f"http://127.0.0.1:{api_port}/runs",
            "  CLI    cronlog runs list | cronlog jobs list | cronlog runs show RUN_ID",
            f'  SQL    psql "{settings.database_url}" -c "{sql}"',
            "  audit  cronlog audit",
            f"  logs   {state / 'logs'}",
            "Ctrl-C stops everything (Kafka and PostgreSQL stay up: cronlog stack down).",
        ]
        typer.echo("\n".join(lines), err=True)

    supervisor.run(started)
    lock.close()


GRANTS_TEMPLATE = """\
# Which owners may use which secret a job's env names ({secret: NAME}): a secret's name,
# then the owners that may use it, as fnmatch patterns (docs/security.md, "Secrets"):
#
#   db-pass: [payments]
#   api-token: [team-*, ops]
#
# A secret not named here is no one's. The values are on the workers: the file NAME in
# CRONLOG_SECRETS_DIR, else CRONLOG_SECRET_<NAME> in their environment. Read at start by
# the node and the API (restart `cronlog run` after a change); the workers read it per run.
{}
"""


def grants_file(state: Path) -> Path:
    """The local stack's secret grants (`secret-grants.yaml` in the state folder), made
    once granting nothing; an operator's edits are kept."""
    path = state / "secret-grants.yaml"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(GRANTS_TEMPLATE)
    return path

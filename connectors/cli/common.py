"""What every `cronlog` command shares: the error exit, Settings from the environment,
logging, the metrics port, the stop watchdog, notes on stderr, the retention policy, and
the options several commands take.

The CLI is an edge: the variables these read (CRONLOG_LOG_FORMAT, CRONLOG_METRICS_PORT,
CRONLOG_STOP_TIMEOUT_S, CRONLOG_RETENTION_*) are read here and their values passed to the
modules that use them, which read no environment (tests/unit/test_config_edges.py)."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from connectors.webhooks import Destinations
from projections.retention import RetentionError, RetentionPolicy
from streams.logs import LogFormat, LogFormatError
from streams.logs import configure as configure_logging
from streams.settings import Settings, SettingsError

LogFormatOption = Annotated[
    str | None,
    typer.Option(
        "--log-format",
        help="text, or json: one JSON object per line (CRONLOG_LOG_FORMAT; default text).",
    ),
]


MetricsPortOption = Annotated[
    int | None,
    typer.Option(
        "--metrics-port",
        help="Serve /metrics, /healthz and /readyz on this port (CRONLOG_METRICS_PORT; "
        "default none). A node's ledger process serves on the port + 1.",
    ),
]


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print the error; the exit to raise."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    return typer.Exit(code)


def notify_destinations() -> Destinations:
    """Where the notifier may post, as `cronlog notifier` reads it (CRONLOG_NOTIFY_ALLOW):
    the API refuses at registration a webhook the notifier would refuse."""
    try:
        return Destinations.parse(os.environ.get("CRONLOG_NOTIFY_ALLOW", "").split(","))
    except ValueError as exc:
        raise fail(f"CRONLOG_NOTIFY_ALLOW: {exc}", 2) from exc


def load_settings() -> Settings:
    try:
        return Settings.from_env()
    except SettingsError as exc:
        raise fail(str(exc), 2) from exc


def log_format_setting(option: str | None) -> str | None:
    """--log-format, else CRONLOG_LOG_FORMAT; None: text."""
    return option or os.environ.get("CRONLOG_LOG_FORMAT")


def start_logging(level: str, component: str, instance: str | None, fmt: str | None) -> LogFormat:
    try:
        return configure_logging(level, component, instance, log_format_setting(fmt))
    except LogFormatError as exc:
        raise fail(str(exc), 2) from None


def chosen_metrics_port(option: int | None) -> int | None:
    """--metrics-port, else CRONLOG_METRICS_PORT, else None."""
    from streams.metrics import metrics_port

    try:
        return metrics_port(option, os.environ.get("CRONLOG_METRICS_PORT"))
    except ValueError as exc:
        raise fail(str(exc), 2) from None


def stop_bound_s() -> float:
    """CRONLOG_STOP_TIMEOUT_S (default 20): the bound on a component's stop."""
    from streams.lifecycle import STOP_TIMEOUT_ENV, stop_timeout_s

    try:
        return stop_timeout_s(os.environ.get(STOP_TIMEOUT_ENV))
    except ValueError as exc:
        raise fail(str(exc), 2) from exc


def stop_watchdog(extra_s: float = 0.0) -> float:
    """Bound this command's stop: exit hard if it has not stopped within
    CRONLOG_STOP_TIMEOUT_S (default 20) + `extra_s` of the first stop signal, even when
    a client call hangs. Before the command installs its own handlers (they get wrapped)."""
    from streams.lifecycle import install_stop_watchdog

    bound_s = stop_bound_s() + extra_s
    try:
        return install_stop_watchdog(bound_s)
    except ValueError as exc:
        raise fail(str(exc), 2) from exc


def say(message: str) -> None:
    typer.echo(f"cronlog: {message}", err=True)


def retention_policy() -> RetentionPolicy:
    try:
        return RetentionPolicy.from_env(os.environ)
    except RetentionError as exc:
        raise fail(str(exc), 2) from exc

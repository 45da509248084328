"""How `cronlog jobs`, `cronlog runs`, `apply` and `diff` reach cronlog, in two modes:
over the REST API with a token (a team member's; connectors/remote.py says where the URL
and token come from), or directly on Kafka and PostgreSQL as admin (an operator's),
through the same Service the REST API uses, so the rules are the same. A refusal is
printed as the API words it; the exit code is 1 for a refusal, 2 when cronlog cannot be
reached. `cronlog login` and `cronlog logout` keep and forget the profile of the first.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated

import psycopg
import typer

from connectors.api.service import Service, ServiceError
from connectors.cli.common import fail, load_settings, notify_destinations
from connectors.remote import Remote, RemoteService, find_remote
from projections.migrate import MigrationError, migrate_for


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


def use_mode(api: ApiOpt = None, token: TokenOpt = None, direct: DirectOpt = False) -> None:
    """Over the REST API when given a URL and a token, else directly (operators)."""
    MODE.api, MODE.token, MODE.direct = api, token, direct


def remote_for(api: str | None, token: str | None, direct: bool) -> Remote | None:
    """The API the options name, else CRONLOG_API_URL and CRONLOG_TOKEN, else the profile
    (connectors/remote.py); None for the direct mode."""
    return find_remote(
        api or os.environ.get("CRONLOG_API_URL"),
        token or os.environ.get("CRONLOG_TOKEN"),
        direct,
    )


@contextmanager
def open_service(wait_s: float = 5.0) -> Iterator[Service | RemoteService]:
    try:
        remote = remote_for(MODE.api, MODE.token, MODE.direct)
    except ServiceError as exc:
        raise fail(exc.message, 2) from exc
    service: Service | RemoteService
    if remote is not None:
        service = RemoteService(remote)
    else:
        settings = load_settings()
        try:
            migrate_for(settings)  # the tables it reads, at this version's schema
        except (MigrationError, psycopg.Error) as exc:
            raise fail(f"the database: {exc}", 2) from exc
        service = Service(settings, wait_s=wait_s, destinations=notify_destinations())
    service.open()
    try:
        yield service
    except ServiceError as exc:
        where = f" ({exc.field})" if exc.field else ""
        typer.secho(f"error{where}: {exc.message}", fg=typer.colors.RED, err=True)
        raise typer.Exit(1 if exc.status < 500 else 2) from exc
    finally:
        service.close()


def login(
    api: Annotated[str, typer.Option("--api", help="The REST API's URL.")],
    token: Annotated[
        str | None, typer.Option(help="An API token (asked for when not given).")
    ] = None,
) -> None:
    """Keep the API's URL and a token in your profile (mode 600): `cronlog jobs` and
    `cronlog runs` then work over the API, with that token's rights."""
    from connectors.client import ApiError, Client
    from connectors.remote import save_profile

    token = token or typer.prompt("token", hide_input=True)
    with Client(api, token) as client:
        try:
            client.jobs_page(limit=1)  # the token is known and may read jobs
            who = client.whoami()
        except ApiError as exc:
            raise fail(f"{api} refused: {exc.message}", 1 if exc.status < 500 else 2) from exc
    path = save_profile(api, token)
    typer.echo(f"logged in to {api} as {_as(who)}; profile {path}")


def _as(who: dict[str, str]) -> str:
    return "admin" if who.get("kind") == "admin" else f"{who.get('kind')} {who.get('name')}"


def whoami(api: ApiOpt = None, token: TokenOpt = None) -> None:
    """Who the API takes you for, and where: the token of --token, CRONLOG_TOKEN or the
    profile of `cronlog login`."""
    from connectors.client import ApiError, Client

    try:
        remote = remote_for(api, token, False)
    except ServiceError as exc:
        raise fail(exc.message, 2) from exc
    if remote is None:
        raise fail(
            "not logged in: `cronlog login --api URL`, or CRONLOG_API_URL and CRONLOG_TOKEN", 2
        )
    with Client(remote.url, remote.token) as client:
        try:
            who = client.whoami()
        except ApiError as exc:
            raise fail(
                f"{remote.url} refused: {exc.message}", 1 if exc.status < 500 else 2
            ) from exc
    typer.echo(f"{_as(who)} at {remote.url} (token from {remote.source})")


def logout() -> None:
    """Forget the profile `cronlog login` wrote."""
    from connectors.remote import profile_path

    path = profile_path()
    path.unlink(missing_ok=True)
    typer.echo(f"profile {path} removed")

"""`cronlog tokens create|list|revoke`: the API's tokens, in its tokens file, as commands.

The file is the one the API reads (CRONLOG_API_TOKENS_FILE; `cronlog run`'s is
`.state/api-tokens.yaml`), and the API reads it again when it changes
(connectors/api/auth.py `TokenSource`): a team added here can call the API a second
later, without a restart. A token made here is printed once and kept only as its hash
(`sha256:...`), so neither the file nor `list` ever shows it again; `list` names each
token by the first characters of its hash (its id), which `revoke` takes.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from connectors import safe_yaml
from connectors.api.auth import HASHED, MIN_TOKEN_CHARS, AuthConfigError, Tokens, token_hash
from connectors.cli.common import fail
from connectors.private_files import write_private

tokens_app = typer.Typer(help="The API's tokens: who may call it, as whom.", no_args_is_help=True)

FileOpt = Annotated[
    Path | None,
    typer.Option(
        "--file",
        help="The API's tokens file (else CRONLOG_API_TOKENS_FILE, else .state/api-tokens.yaml "
        "of `cronlog run`).",
    ),
]
ID_CHARS = 12  # of the hash's hex, after "sha256:"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", re.ASCII)  # as a job's owner


def _path(given: Path | None) -> Path:
    if given is not None:
        return given
    named = os.environ.get("CRONLOG_API_TOKENS_FILE")
    if named:
        return Path(named)
    state = Path(os.environ.get("CRONLOG_STATE_DIR", ".state"))
    found = state / "api-tokens.yaml"
    if not found.exists():
        raise fail(
            f"no tokens file at {found}: name the file the API reads (--file, or "
            "CRONLOG_API_TOKENS_FILE)",
            2,
        )
    return found


def _write(path: Path, doc: dict[str, Any]) -> None:
    """The file as `doc`, if the API would read it (else refused, nothing written): an
    entry already wrong in it would make the API keep its old tokens, a revoked one
    among them. It keeps its owner (a service's file rewritten by root)."""
    try:
        Tokens.of_document(doc, str(path))
    except AuthConfigError as exc:
        raise fail(f"not written, the API would not read it: {exc}", 1) from exc
    owner = None
    if path.exists():
        info = path.stat()
        owner = (info.st_uid, info.st_gid)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, yaml.safe_dump(doc, sort_keys=False), owner)


def _read(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        doc = safe_yaml.load_file(path) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise fail(f"cannot read {path}: {exc}", 2) from exc
    if not isinstance(doc, dict):
        raise fail(f"{path}: expected a mapping with admin/owners/workers", 2)
    return doc


def _id(key: str) -> str:
    """A token's id: the start of its hash (a token kept plain is hashed for it)."""
    hashed = key if key.startswith(HASHED) else token_hash(key)
    return hashed[len(HASHED) : len(HASHED) + ID_CHARS]


def _entries(doc: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(table, key, name) of every token in the file."""
    out: list[tuple[str, str, str]] = []
    for key in doc.get("admin") or []:
        out.append(("admin", str(key), "admin"))
    for table in ("owners", "workers"):
        for key, name in (doc.get(table) or {}).items():
            out.append((table, str(key), str(name)))
    return out


@tokens_app.command("create")
def tokens_create(
    owner: Annotated[str | None, typer.Option(help="A token of this owner (a team).")] = None,
    worker: Annotated[
        str | None, typer.Option(help="A token of this HTTP worker (its worker id).")
    ] = None,
    admin: Annotated[bool, typer.Option("--admin", help="An admin token (every owner).")] = False,
    file: FileOpt = None,
) -> None:
    """Make a token and print it once: the file keeps only its hash."""
    if sum((owner is not None, worker is not None, admin)) != 1:
        raise fail("give one of --owner NAME, --worker ID or --admin", 2)
    name = owner or worker or "admin"
    if not _NAME.fullmatch(name):
        raise fail(f"{name!r}: a name starts with a letter or digit, then those, '.', '_', '-'", 2)
    path = _path(file)
    doc = _read(path)
    token = secrets.token_urlsafe(24)
    assert len(token) >= MIN_TOKEN_CHARS
    hashed = token_hash(token)
    if admin:
        doc["admin"] = [*(doc.get("admin") or []), hashed]
    else:
        table = "owners" if owner else "workers"
        doc[table] = {**(doc.get(table) or {}), hashed: name}
    _write(path, doc)
    kind = "admin" if admin else ("owner " if owner else "worker ") + name
    typer.echo(f"token {_id(hashed)} for {kind} added to {path} (shown once, kept hashed):")
    typer.echo(token)
    typer.echo("use it: export CRONLOG_TOKEN=<the token above>", err=True)


@tokens_app.command("list")
def tokens_list(file: FileOpt = None) -> None:
    """Every token of the file: its id, kind and name (never the token)."""
    path = _path(file)
    entries = _entries(_read(path))
    if not entries:
        typer.echo(f"no tokens in {path}")
        return
    for table, key, name in entries:
        kept = "hashed" if key.startswith(HASHED) else "plain"
        typer.echo(f"{_id(key)}  {table.rstrip('s'):6}  {name:24}  {kept}")


@tokens_app.command("revoke")
def tokens_revoke(
    token_id: Annotated[str, typer.Argument(help="The id `tokens list` shows (or its start).")],
    file: FileOpt = None,
) -> None:
    """Remove a token: the API refuses it from the next second on."""
    path = _path(file)
    doc = _read(path)
    found = [(t, k, n) for t, k, n in _entries(doc) if token_id and _id(k).startswith(token_id)]
    if len(found) != 1:
        what = "no token" if not found else f"{len(found)} tokens"
        raise fail(f"{what} with id {token_id!r} in {path} (see `cronlog tokens list`)", 1)
    table, key, name = found[0]
    if table == "admin":
        doc["admin"] = [k for k in doc.get("admin") or [] if k != key]
    else:
        doc[table] = {k: v for k, v in (doc.get(table) or {}).items() if k != key}
    _write(path, doc)
    typer.echo(f"token {_id(key)} of {name} revoked")

"""Jobs as code (connectors/apply.py) on the command line: `cronlog apply` makes the
registered jobs what the files say, `cronlog diff` tells how they differ, `cronlog jobs
export` writes them as a file `apply` reads back unchanged."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from connectors.api.service import ADMIN, Service, ServiceError
from connectors.apply import (
    MANAGED_BY,
    NO_OWNER_TO_PRUNE,
    Change,
    JobFileError,
    JobFiles,
    PruneScopeError,
    describe,
    export_documents,
    missing_upstreams,
    param_hazards,
    plan,
    prune_scope,
    read_files,
    summary,
)
from connectors.cli.access import ApiOpt, DirectOpt, TokenOpt, open_service, use_mode
from connectors.cli.common import fail
from connectors.remote import RemoteService

FilesOpt = Annotated[
    list[Path],
    typer.Option("-f", "--file", help="A YAML/JSON file of jobs, or a directory of them."),
]
ManagedOpt = Annotated[
    str | None,
    typer.Option(
        "--managed-by",
        help=f"The name apply marks its jobs with ({MANAGED_BY} if not given), and prunes "
        "by: required with --prune, so that two folders applied under the same name do "
        "not prune each other's jobs.",
    ),
]
PRUNE_NEEDS_A_NAME = (
    "--prune needs --managed-by NAME: it deletes the jobs marked with that name (of the "
    "owners the files name) that the files no longer list, so each set of files applied "
    f"on its own needs a name of its own (jobs applied without one carry {MANAGED_BY!r})"
)
MissingOkOpt = Annotated[
    bool,
    typer.Option(
        "--allow-missing-upstreams",
        help="Accept depends_on naming jobs neither registered nor in the files (they "
        "wait for them); refused otherwise, since a typo would wait for ever.",
    ),
]
StrictParamsOpt = Annotated[
    bool,
    typer.Option(
        "--strict-params",
        help="Refuse (exit 1) jobs whose parameter values would be more than text: "
        "`{name}` inside `sh -c` code, or alone as an argument before `--` (warned "
        "otherwise).",
    ),
]
PruneOpt = Annotated[
    bool,
    typer.Option(
        "--prune",
        help="Delete the jobs of that name, of the owners the files (or --owner) name, "
        "that the files no longer list.",
    ),
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


def _load(files: list[Path], managed_by: str, owner: str | None) -> JobFiles:
    try:
        return read_files(files, managed_by, owner)
    except JobFileError as exc:
        raise fail(str(exc), 1) from exc
    except OSError as exc:
        raise fail(f"cannot read the job files: {exc}", 2) from exc


def _prune_owners(
    service: Service | RemoteService, named: frozenset[str], rows: list[dict[str, Any]]
) -> frozenset[str]:
    """The owners --prune may delete jobs of: those the files or --owner name. With none
    named, an owner's token's own (the API lists it only its jobs); refused as admin:
    directly, or with a token that lists jobs of several owners (an admin's)."""
    if named:
        return named
    listed = frozenset(row["owner"] for row in rows)
    # The API does not say whose a token is: one that lists a single owner's jobs is
    # taken for that owner's (an admin's, where only one owner has jobs, is the same).
    if isinstance(service, RemoteService) and len(listed) <= 1:
        return listed  # empty: the token has no jobs, nothing to prune
    raise fail(NO_OWNER_TO_PRUNE, 1)


def _plan(
    service: Service | RemoteService,
    files: list[Path],
    managed_by: str | None,
    owner: str | None,
    prune: bool,
    strict_params: bool = False,
    allow_missing_upstreams: bool = False,
) -> list[Change]:
    """What applying the files changes; with --prune (which needs --managed-by), its
    scope printed first. Jobs whose parameter values would be more than text are warned
    about on stderr (refused with --strict-params: `param_hazards`)."""
    if prune and not managed_by:
        raise fail(PRUNE_NEEDS_A_NAME, 2)
    managed_by = managed_by or MANAGED_BY
    found = _load(files, managed_by, owner or _default_owner(service))
    hazards = [
        f"{job.where}: job {job.spec.job_id}: {h}"
        for job in found.jobs
        for h in param_hazards(job.spec)
    ]
    for hazard in hazards:
        typer.secho(f"warning: {hazard}", fg=typer.colors.YELLOW, err=True)
    if hazards and strict_params:
        raise fail(f"--strict-params: {len(hazards)} parameter hazard(s), above", 1)
    rows = _registered(service)
    owners: frozenset[str] = frozenset()
    if prune:
        named = found.owners | ({owner} if owner else set())
        owners = _prune_owners(service, named, rows)
        why = ""
        if not named:  # an owner's token (_prune_owners refused an admin)
            why = "the token's: the files name none" if owners else "the token has no jobs"
        typer.echo(prune_scope(owners, managed_by, why))
    try:
        changes = plan(found.jobs, rows, managed_by, prune and bool(owners), owners)
    except PruneScopeError as exc:
        raise fail(str(exc), 1) from exc
    _check_upstreams(found, rows, changes, allow_missing_upstreams)
    return changes


def _check_upstreams(
    found: JobFiles, rows: list[dict[str, Any]], changes: list[Change], allow: bool
) -> None:
    """Every upstream the files' jobs name is registered (and not pruned by this apply),
    a job of the same owner in the files, or one the job already named; else each is
    said with its file and line, and refused unless `allow`."""
    deleted = {c.job_id for c in changes if c.kind == "delete"}
    known = {r["job_id"] for r in rows} - deleted
    had = {r["job_id"]: tuple((r.get("spec") or {}).get("depends_on") or ()) for r in rows}
    where = {job.spec.job_id: job.where for job in found.jobs}
    missing = missing_upstreams([job.spec for job in found.jobs], known, had)
    for job_id, names in missing.items():
        shown = ", ".join(repr(u) for u in names)
        text = (
            f"{where[job_id]}: job {job_id}: depends_on names {shown}, neither registered nor "
            "in the files"
        )
        if allow:
            typer.secho(f"warning: {text}: it waits for them", fg=typer.colors.YELLOW, err=True)
        else:
            typer.secho(f"error: {text}", fg=typer.colors.RED, err=True)
    if missing and not allow:
        raise fail(
            f"{len(missing)} job(s) name upstreams that do not exist (a typo would wait for "
            "ever): register them, add them to the files, or --allow-missing-upstreams",
            1,
        )


def apply_files(
    files: FilesOpt,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the changes only.")] = False,
    prune: PruneOpt = False,
    managed_by: ManagedOpt = None,
    owner: Annotated[str | None, typer.Option(help="Owner of jobs that name none.")] = None,
    api: ApiOpt = None,
    token: TokenOpt = None,
    direct: DirectOpt = False,
    strict_params: StrictParamsOpt = False,
    allow_missing_upstreams: MissingOkOpt = False,
) -> None:
    """Make the registered jobs what the files say: print the difference (created,
    changed field by field, unchanged, deleted with --prune), then apply it."""
    use_mode(api, token, direct)
    with open_service() as service:
        changes = _plan(
            service, files, managed_by, owner, prune, strict_params, allow_missing_upstreams
        )
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
                    # Upstreams checked above against the registered jobs and the files,
                    # which this apply registers in any order.
                    accepted = service.put_job(ADMIN, change.doc, allow_missing_upstreams=True)
                    for warning in accepted.body.get("warnings") or ():
                        if "not registered" not in warning:  # said above, with the file
                            typer.secho(
                                f"warning: {change.job_id}: {warning}",
                                fg=typer.colors.YELLOW,
                                err=True,
                            )
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
    managed_by: ManagedOpt = None,
    owner: Annotated[str | None, typer.Option(help="Owner of jobs that name none.")] = None,
    api: ApiOpt = None,
    token: TokenOpt = None,
    direct: DirectOpt = False,
    strict_params: StrictParamsOpt = False,
    allow_missing_upstreams: MissingOkOpt = False,
) -> None:
    """Print how the registered jobs differ from the files; exit 1 when they do (drift)
    or when the files cannot be applied, 0 when they do not, 2 when cronlog cannot be
    reached."""
    use_mode(api, token, direct)
    with open_service() as service:
        changes = _plan(
            service, files, managed_by, owner, prune, strict_params, allow_missing_upstreams
        )
    drift = [c for c in changes if c.kind != "same"]
    for change in drift:
        for line in describe(change):
            typer.echo(line)
    typer.echo(summary(changes))
    if drift:
        raise typer.Exit(1)


def jobs_export(
    owner: Annotated[str | None, typer.Option(help="Only this owner's jobs.")] = None,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="Write to this file (default: stdout).")
    ] = None,
) -> None:
    """The registered jobs as a YAML file that `cronlog apply` reads back unchanged."""
    with open_service() as service:
        rows = [r for r in _registered(service) if owner is None or r["owner"] == owner]
    text = yaml.safe_dump(export_documents(rows), sort_keys=False, allow_unicode=True)
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text)
        typer.echo(f"{len(rows)} jobs written to {output}")

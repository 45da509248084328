"""Jobs as code: job files, what applying them would change, and applying it.

`cronlog apply -f PATH...` reads YAML or JSON files (or directories of them) of jobs,
each the fields of a `job.upsert` command, validates every job with the one command
parser (an error names the file and the line), compares them with what is registered
and prints the difference: created, changed field by field, unchanged, deleted. It then
registers what changed (`--dry-run`: only prints). Every job it writes carries
`managed_by` (its name, `cronlog-apply` unless `--managed-by` says otherwise), and
`--prune` deletes the jobs that carry that name and the files no longer list: a job made
by hand, or by another repository's apply, is never pruned. `cronlog diff -f` prints the
same difference and exits 1 when there is one (for CI). `cronlog jobs export` writes the
registered jobs as a file `apply` reads back unchanged.

Prune is limited to owners (`prune_deletes`): those the files name, by `owner:` at a
file's top (`owner: team` with `jobs: []` names team and prunes all of its jobs) or on a
job, and `--owner`. No owner named is never every owner: the CLI then prunes the token's
owner (an owner's token lists only its own jobs) and refuses an admin (PruneScopeError).

The comparison is of normalised specs: each side parsed to a JobSpec and written back as
its command (`upsert_document`), so `every: 60s` and `every: 1m` are the same job.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson
import yaml

from connectors.safe_yaml import BoundedLoader
from schemas.json import from_plain
from schemas.spec import JobSpec
from streams.core.commands import Rejection, UpsertJob, parse_command, upsert_document

MANAGED_BY = "cronlog-apply"
SUFFIXES = (".yaml", ".yml", ".json")
PLACEHOLDER_OWNER = "owner-of-the-token"  # validation only: the API fills the real one

ChangeKind = Literal["create", "change", "same", "delete"]


class JobFileError(ValueError):
    """A file that cannot be applied: the message names the file and the line."""


class PruneScopeError(ValueError):
    """A prune that names no owner, or no managed_by: refused, never widened to all."""


NO_OWNER_TO_PRUNE = (
    "--prune: the files name no owner, and as admin (--direct or an admin token) that "
    "would prune every owner's jobs. Name the owner: `owner: NAME` at the top of a file "
    "(beside `jobs:`, even `jobs: []`), `owner:` on its jobs, or --owner NAME"
)


@dataclass(frozen=True, slots=True)
class Desired:
    """One job as a file gives it."""

    doc: dict[str, Any]  # the job.upsert fields as written, managed_by set
    spec: JobSpec  # as the command parser reads it
    where: str  # "FILE:LINE"


@dataclass(frozen=True, slots=True)
class Change:
    job_id: str
    kind: ChangeKind
    fields: tuple[tuple[str, Any, Any], ...] = ()  # (field, registered, in the files)
    doc: dict[str, Any] | None = None  # what to register (create, change)


@dataclass(frozen=True, slots=True)
class JobFiles:
    """What the files say: their jobs, and every owner they name (at a file's top, even
    beside `jobs: []`, or on a job); an owner only filled in (`load`'s `owner`) is not."""

    jobs: list[Desired]
    owners: frozenset[str]


def job_files(paths: Iterable[Path]) -> list[Path]:
    """The files named, and the job files under the directories named, in path order."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found.extend(sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES))
        elif path.exists():
            found.append(path)
        else:
            raise JobFileError(f"{path}: no such file or directory")
    return found


def read_jobs(
    text: str,
    name: str,
    calendars: dict[str, Any] | None = None,
    owners: set[str] | None = None,
) -> list[tuple[Any, int]]:
    """The jobs of one file's text, each with its 1-based line: a file holds one job, a
    list of jobs, `{jobs: [...]}` (with `owner:` beside it: the owner of its jobs that
    name none; with `calendars:`, named lists of days its and other files' jobs name),
    or several YAML documents of these. Calendars found are added to `calendars`, and
    the owners of `owner:` beside `jobs:` to `owners` (even when `jobs:` is empty: the
    file still says whose jobs it keeps). JobFileError names the file and line of YAML
    that cannot be read (aliases that would expand past a bound included: refused before
    they are expanded), and of a top-level `owner:` that is not a name."""
    loader = BoundedLoader(text)  # aliases expanding without bound (billion laughs) refused
    out: list[tuple[Any, int]] = []
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            owner = None
            if isinstance(node, yaml.MappingNode):
                keys = {k.value: v for k, v in node.value if isinstance(k, yaml.ScalarNode)}
                if "job_id" not in keys and ("jobs" in keys or "calendars" in keys):
                    if "calendars" in keys and calendars is not None:
                        _add_calendars(
                            calendars, loader.construct_document(keys["calendars"]), name
                        )
                    if "owner" in keys:
                        found = loader.construct_document(keys["owner"])
                        owner = _top_owner(found, name, keys["owner"].start_mark.line + 1)
                        if owners is not None:
                            owners.add(owner)
                    if "jobs" not in keys:
                        continue
                    node = keys["jobs"]
            items = node.value if isinstance(node, yaml.SequenceNode) else [node]
            for item in items:
                value = loader.construct_document(item)
                if owner is not None and isinstance(value, dict):
                    value = {"owner": owner, **value}
                out.append((value, item.start_mark.line + 1))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise JobFileError(f"{name}{line}: not valid YAML or JSON: {exc}") from exc
    finally:
        loader.dispose()
    return out


def _top_owner(value: object, name: str, line: int) -> str:
    if not isinstance(value, str) or not value:
        raise JobFileError(f"{name}:{line}: owner must be an owner's name, got {value!r}")
    return value


def _add_calendars(calendars: dict[str, Any], found: object, name: str) -> None:
    if not isinstance(found, dict):
        raise JobFileError(f"{name}: calendars must map a name to a list of days")
    for calendar, days in found.items():
        if calendar in calendars:
            raise JobFileError(f"{name}: calendar {calendar} is defined twice")
        calendars[calendar] = days


def _with_calendars(doc: dict[str, Any], calendars: dict[str, Any], where: str) -> None:
    """A job's `calendars: [name, ...]` becomes exclusions named after each calendar."""
    named = doc.pop("calendars", None)
    if named is None:
        return
    if not isinstance(named, list):
        raise JobFileError(f"{where}: calendars must be a list of calendar names")
    for calendar in named:
        if calendar not in calendars:
            known = ", ".join(sorted(calendars)) or "none"
            raise JobFileError(f"{where}: no calendar {calendar!r} in the files (known: {known})")
        days = calendars[calendar]
        doc["exclude"] = [*(doc.get("exclude") or []), {"name": calendar, "dates": days}]


def load(
    paths: Iterable[Path], managed_by: str = MANAGED_BY, owner: str | None = None
) -> list[Desired]:
    """The jobs of `read_files` (the files' jobs, validated)."""
    return read_files(paths, managed_by, owner).jobs


def read_files(
    paths: Iterable[Path], managed_by: str = MANAGED_BY, owner: str | None = None
) -> JobFiles:
    """Every job of the files, validated, and the owners the files name; JobFileError
    naming every job that is not valid (a line each: its file and line, and the parser's
    reason) and every job id given twice, in one pass. A job's `calendars` names
    calendars any of the files defines (`calendars:` at a file's top). `owner` is given
    to jobs that name none (not counted as named by the files)."""
    desired: list[Desired] = []
    seen: dict[str, str] = {}
    calendars: dict[str, Any] = {}
    owners: set[str] = set()
    errors: list[str] = []  # every job's, in one pass (one line each: file, line, why)
    files: list[tuple[Path, list[tuple[Any, int]]]] = []
    for path in job_files(paths):
        try:
            files.append((path, read_jobs(path.read_text(), str(path), calendars, owners)))
        except JobFileError as exc:
            errors.append(str(exc))
    for path, jobs in files:
        for value, line in jobs:
            where = f"{path}:{line}"
            try:
                job = _desired(value, where, calendars, owner, managed_by)
            except JobFileError as exc:
                errors.append(str(exc))
                continue
            if job.spec.job_id in seen:
                errors.append(f"{where}: job {job.spec.job_id} is also at {seen[job.spec.job_id]}")
                continue
            seen[job.spec.job_id] = where
            desired.append(job)
            if "owner" in value:
                owners.add(job.spec.owner)
    if errors:
        raise JobFileError("\n".join(errors))
    return JobFiles(desired, frozenset(owners))


def _desired(
    value: object, where: str, calendars: dict[str, Any], owner: str | None, managed_by: str
) -> Desired:
    if not isinstance(value, dict):
        raise JobFileError(f"{where}: a job must be a mapping of job.upsert fields")
    doc = {k: v for k, v in value.items() if k != "type"}
    _with_calendars(doc, calendars, where)
    if owner and "owner" not in doc:
        doc["owner"] = owner
    doc.setdefault("managed_by", managed_by)  # an export's own marker stays
    return Desired(doc, _parsed(doc, where), where)


def missing_upstreams(
    jobs: Iterable[JobSpec],
    known: Collection[str],
    had: Mapping[str, Collection[str]] | None = None,
) -> dict[str, list[str]]:
    """The upstreams each job names that are neither `known` (registered, and not
    deleted by this apply) nor a job of the same owner in `jobs` (registered by the same
    apply, in any order), by job id: refused unless the user says they will be
    registered (`--allow-missing-upstreams`). An upstream the job's registered version
    already named (`had`: job id -> its depends_on) is not refused again."""
    jobs = list(jobs)
    given = {(spec.owner, spec.job_id) for spec in jobs}
    had = had or {}
    out: dict[str, list[str]] = {}
    for spec in jobs:
        before = had.get(spec.job_id, ())
        missing = [
            u
            for u in spec.depends_on
            if (spec.owner, u) not in given and u not in known and u not in before
        ]
        if missing:
            out[spec.job_id] = missing
    return out


def _parsed(doc: Mapping[str, Any], where: str) -> JobSpec:
    command = {"type": "job.upsert", "owner": PLACEHOLDER_OWNER, **doc}
    try:
        raw = orjson.dumps(command)
    except TypeError as exc:  # a YAML value JSON has not (a date, a set)
        raise JobFileError(f"{where}: {exc}") from exc
    parsed = parse_command(raw)
    if isinstance(parsed, Rejection):
        job = doc.get("job_id", "?")
        raise JobFileError(f"{where}: job {job}: {parsed.reason}")
    assert isinstance(parsed, UpsertJob)
    return parsed.spec


# Programs whose `-c`/`-e` item is code: a `{name}` written into it runs the value.
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "ash", "busybox"})
_CODE_OPTIONS = {
    **dict.fromkeys(_SHELLS, "c"),
    **dict.fromkeys(("python", "python3", "python2"), "c"),
    **dict.fromkeys(("perl", "ruby", "node"), "e"),
}
_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}", re.ASCII)


def _names(arg: str) -> list[str]:
    return [m.group(1) for m in _PLACEHOLDER.finditer(arg) if m.group(1)]


def param_hazards(spec: JobSpec) -> list[str]:
    """Where a run's parameter values would be more than text (README "Parameters"):
    `{name}` inside code a shell or interpreter runs (`sh -c "... {day} ..."`), and a
    string `{name}` standing alone as a positional argument before any `--` (a value
    starting with `-` is read as an option). Empty when the command does not take values
    (`params_in_command` off) or takes them only in the safe forms."""
    if not spec.params_in_command or not spec.command:
        return []
    declared = {p.name: p.type for p in spec.params}
    command = spec.command
    program = Path(command[0]).name.rstrip("0123456789.") or command[0]
    letter = _CODE_OPTIONS.get(program) or _CODE_OPTIONS.get(Path(command[0]).name)
    found: list[str] = []
    code_at = None
    if letter is not None:
        for index, arg in enumerate(command[1:], 1):
            if arg == "--" or not arg.startswith("-"):
                break
            if not arg.startswith("--") and letter in arg[1:]:
                code_at = index + 1
                break
    ended = False  # after `--`: no more options
    for index, arg in enumerate(command):
        if index == 0:
            continue
        names = [n for n in _names(arg) if n in declared]
        if index == code_at and names:
            found.append(
                f"command[{index}] is code {command[0]} runs, with "
                f"{', '.join('{' + n + '}' for n in names)} written into it: a value is run "
                "as code. Pass the value as an argument of its own after the code "
                '(["sh", "-c", "tool \\"$1\\"", "sh", "{name}"]; sys.argv in Python) or '
                "read it from CRONLOG_PARAMS"
            )
        elif (
            code_at is None  # after a shell's code: its own arguments ($0, $1, ...)
            and not ended
            and names
            and arg == "{" + names[0] + "}"
            and declared[names[0]] == "string"
            and not command[index - 1].startswith("-")
        ):
            found.append(
                f"command[{index}] is {arg} alone, before any `--`: a value starting with "
                f"`-` is read as an option. Put `--` before it, or glue it to its option "
                f"(--{names[0]}={arg})"
            )
        if arg == "--":
            ended = True
    return found


def _normal(spec: JobSpec, with_owner: bool) -> dict[str, Any]:
    doc = upsert_document(spec)
    doc.pop("type", None)
    if not with_owner:
        doc.pop("owner", None)
    return doc


def plan(
    desired: Sequence[Desired],
    registered: Iterable[Mapping[str, Any]],
    managed_by: str = MANAGED_BY,
    prune: bool = False,
    owners: Iterable[str] | None = None,
) -> list[Change]:
    """What applying `desired` changes, given the registered jobs (rows with job_id,
    owner and spec, as the API lists them). Deletes only with `prune`, and only what
    `prune_deletes` gives for `owners` (the prune's scope; None: the owners the desired
    jobs name, the docs' `owner`). PruneScopeError for a prune with no owner."""
    current = {row["job_id"]: row for row in registered}
    changes: list[Change] = []
    for job in desired:
        row = current.get(job.spec.job_id)
        if row is None:
            changes.append(Change(job.spec.job_id, "create", doc=job.doc))
            continue
        named = "owner" in job.doc
        now = _normal(from_plain(row["spec"], JobSpec), named)
        want = _normal(job.spec, named)
        fields = tuple(
            (key, now.get(key), want.get(key))
            for key in sorted(now.keys() | want.keys())
            if now.get(key) != want.get(key)
        )
        kind: ChangeKind = "change" if fields else "same"
        changes.append(Change(job.spec.job_id, kind, fields, job.doc if fields else None))
    if prune:
        if owners is None:
            owners = {job.spec.owner for job in desired if "owner" in job.doc}
        listed = [job.spec.job_id for job in desired]
        changes.extend(
            Change(job_id, "delete")
            for job_id in prune_deletes(current.values(), listed, owners, managed_by)
        )
    return changes


def prune_deletes(
    registered: Iterable[Mapping[str, Any]],
    listed: Collection[str],
    owners: Iterable[str],
    managed_by: str = MANAGED_BY,
) -> list[str]:
    """The job ids `--prune` deletes, sorted: the registered jobs (rows with job_id, owner
    and spec, as the API lists them) whose spec's `managed_by` is `managed_by`, whose
    owner is one of `owners`, and whose id `listed` (the files' job ids) does not hold.
    PruneScopeError when `owners` is empty (no owner named is never every owner) or
    `managed_by` is (that would prune the jobs made by hand)."""
    scope = frozenset(owners)
    if not scope:
        raise PruneScopeError(NO_OWNER_TO_PRUNE)
    if not managed_by:
        raise PruneScopeError("--prune with an empty --managed-by would prune jobs made by hand")
    keep = set(listed)
    return sorted(
        row["job_id"]
        for row in registered
        if row["job_id"] not in keep
        and row["owner"] in scope
        and (row.get("spec") or {}).get("managed_by") == managed_by
    )


def prune_scope(owners: Iterable[str], managed_by: str = MANAGED_BY, why: str = "") -> str:
    """The line `apply --prune` and `diff --prune` print first: what the prune may delete
    (`why`: where the owners come from, when the files do not name them)."""
    names = ", ".join(sorted(owners)) or "none"
    said = f" ({why})" if why else ""
    return (
        f"prune scope: owner {names}{said}, managed_by {managed_by!r} "
        "(their jobs the files do not list are deleted)"
    )


def describe(change: Change) -> list[str]:
    """The lines that say a change, as `apply` and `diff` print them."""
    if change.kind == "create":
        return [f"+ {change.job_id} (create)"]
    if change.kind == "delete":
        return [f"- {change.job_id} (delete)"]
    if change.kind == "same":
        return [f"= {change.job_id} (unchanged)"]
    lines = [f"~ {change.job_id} (change)"]
    for key, old, new in change.fields:
        lines.append(f"    {key}: {_show(old)} -> {_show(new)}")
    return lines


def summary(changes: Sequence[Change]) -> str:
    count = {k: sum(c.kind == k for c in changes) for k in ("create", "change", "same", "delete")}
    return (
        f"{count['create']} to create, {count['change']} to change, "
        f"{count['same']} unchanged, {count['delete']} to delete"
    )


def _show(value: Any) -> str:
    return "(none)" if value is None else orjson.dumps(value).decode()


def export_documents(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The registered jobs as `apply` reads them (and writes them back unchanged)."""
    docs = []
    for row in rows:
        doc = upsert_document(from_plain(row["spec"], JobSpec))
        doc.pop("type", None)
        # Said even when empty: applied back, a job made by hand stays one (never pruned).
        doc.setdefault("managed_by", "")
        docs.append(doc)
    return docs

"""Jobs as code (connectors/apply.py): job files read with their lines, the difference with
what is registered, prune limited to apply's own jobs of the owners the files name (never
every owner: issue 52 item 6, issue 53 item 5), export read back unchanged."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner, Result

from connectors.api.service import ADMIN, Accepted, Principal, Service
from connectors.apply import (
    MANAGED_BY,
    JobFileError,
    PruneScopeError,
    describe,
    export_documents,
    load,
    plan,
    prune_deletes,
    read_files,
    summary,
)
from connectors.remote import RemoteService
from schemas.json import to_plain
from streams.core.commands import UpsertJob, parse_command

JOBS = """\
- job_id: etl
  owner: team
  schedule: {every: 60s}
  command: [etl, --full]
- job_id: report
  owner: team
  schedule: {cron: "0 6 * * MON", timezone: Europe/Berlin}
  command: [report]
  depends_on: [etl]
"""


def registered(doc: dict[str, Any]) -> dict[str, Any]:
    """A row as the API lists it: the parsed spec's JSON view."""
    import orjson

    parsed = parse_command(orjson.dumps({"type": "job.upsert", **doc}))
    assert isinstance(parsed, UpsertJob), parsed
    spec = to_plain(parsed.spec)
    return {"job_id": parsed.spec.job_id, "owner": parsed.spec.owner, "spec": spec}


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_new_file_creates_its_jobs_marked_as_applys(tmp_path: Path) -> None:
    desired = load([write(tmp_path, "jobs.yaml", JOBS)])
    assert [d.where for d in desired] == [f"{tmp_path}/jobs.yaml:1", f"{tmp_path}/jobs.yaml:5"]
    changes = plan(desired, [])
    assert [(c.job_id, c.kind) for c in changes] == [("etl", "create"), ("report", "create")]
    assert all(c.doc is not None and c.doc["managed_by"] == MANAGED_BY for c in changes)
    assert summary(changes) == "2 to create, 0 to change, 0 unchanged, 0 to delete"


def test_the_same_job_written_another_way_is_unchanged_and_a_real_change_is_named(
    tmp_path: Path,
) -> None:
    desired = load([write(tmp_path, "jobs.yaml", JOBS)])
    etl = registered(
        {"job_id": "etl", "owner": "team", "schedule": {"every": "1m"},
         "command": ["etl", "--full"], "managed_by": MANAGED_BY}
    )  # fmt: skip
    report = registered(
        {"job_id": "report", "owner": "team", "schedule": {"cron": "0 7 * * MON",
         "timezone": "Europe/Berlin"}, "command": ["report"], "depends_on": ["etl"]}
    )  # fmt: skip
    changes = {c.job_id: c for c in plan(desired, [etl, report])}
    assert changes["etl"].kind == "same"
    assert changes["report"].kind == "change"
    fields = {f for f, _, _ in changes["report"].fields}
    assert fields == {"schedule", "managed_by"}  # a hand-made job is taken over
    lines = describe(changes["report"])
    assert lines[0] == "~ report (change)"
    assert any('"0 7 * * MON"' in line and '"0 6 * * MON"' in line for line in lines)


def test_prune_deletes_only_applys_own_jobs_of_the_files_owners(tmp_path: Path) -> None:
    desired = load([write(tmp_path, "jobs.yaml", JOBS)])
    base = {"schedule": {"every": "1h"}, "command": ["x"]}
    rows = [
        registered({"job_id": "gone", "owner": "team", "managed_by": MANAGED_BY, **base}),
        registered({"job_id": "by-hand", "owner": "team", **base}),
        registered({"job_id": "other-repo", "owner": "team", "managed_by": "repo-b", **base}),
        registered({"job_id": "elsewhere", "owner": "other", "managed_by": MANAGED_BY, **base}),
    ]
    assert not [c for c in plan(desired, rows) if c.kind == "delete"]  # not without --prune
    deleted = [c.job_id for c in plan(desired, rows, prune=True) if c.kind == "delete"]
    assert deleted == ["gone"]
    other = [c.job_id for c in plan(desired, rows, "repo-b", prune=True) if c.kind == "delete"]
    assert other == ["other-repo"]


def test_an_invalid_job_is_refused_with_its_file_and_line(tmp_path: Path) -> None:
    text = (
        JOBS + "- job_id: broken\n  owner: team\n  schedule: {cron: '61 * * * *'}\n  command: [x]\n"
    )
    path = write(tmp_path, "jobs.yaml", text)
    with pytest.raises(JobFileError) as refused:
        load([path])
    message = str(refused.value)
    assert message.startswith(f"{path}:10: job broken: schedule: invalid cron expression")
    assert "minute field" in message


def test_a_job_given_twice_and_bad_yaml_are_refused_with_their_places(tmp_path: Path) -> None:
    a = write(
        tmp_path, "dir/a.yaml", "job_id: etl\nowner: team\nschedule: {every: 1h}\ncommand: [x]\n"
    )
    b = write(tmp_path, "dir/sub/b.json", '{"job_id": "etl", "owner": "team", "command": ["y"],'
              ' "schedule": {"every": "1h"}}')  # fmt: skip
    with pytest.raises(JobFileError, match=rf"{b}:1: job etl is also at {a}:1"):
        load([tmp_path / "dir"])
    bad = write(tmp_path, "bad.yaml", "- job_id: x\n  command: [unclosed\n")
    with pytest.raises(JobFileError, match=rf"{bad}:\d+: not valid YAML"):
        load([bad])
    with pytest.raises(JobFileError, match="no such file"):
        load([tmp_path / "missing.yaml"])


def test_export_reads_back_as_no_change(tmp_path: Path) -> None:
    desired = load([write(tmp_path, "jobs.yaml", JOBS)])
    rows = [registered(d.doc) for d in desired]
    exported = write(tmp_path, "exported.yaml", yaml.safe_dump(export_documents(rows)))
    again = load([exported])
    assert {c.kind for c in plan(again, rows, prune=True)} == {"same"}


def test_the_demo_file_form_gives_its_owner_to_its_jobs(tmp_path: Path) -> None:
    """`{owner: ..., jobs: [...]}` (examples/demo.yaml): added or applied as a new user
    would while `cronlog run` runs, its jobs stay the demo owner's."""
    text = "owner: demo\njobs:\n  - job_id: a\n    schedule: {every: 1h}\n    command: [x]\n"
    (desired,) = load([write(tmp_path, "demo.yaml", text)])
    assert desired.spec.owner == "demo"
    assert desired.where == f"{tmp_path}/demo.yaml:3"
    shipped = load([Path(__file__).parents[2] / "examples" / "demo.yaml"])
    assert {d.spec.owner for d in shipped} == {"demo"}


def test_named_calendars_shared_by_jobs_of_several_files(tmp_path: Path) -> None:
    """A calendar defined once (holidays) and named by jobs in other files: each job
    excludes its days, named after the calendar; a name no file defines is refused."""
    write(tmp_path, "jobs/calendars.yaml", "calendars:\n  holidays: ['2027-12-24..2027-12-26']\n")
    write(
        tmp_path,
        "jobs/etl.yaml",
        "- job_id: a\n  owner: t\n  schedule: {every: 1h}\n  command: [x]\n"
        "  calendars: [holidays]\n"
        "- job_id: b\n  owner: t\n  schedule: {every: 1h}\n  command: [x]\n"
        "  calendars: [holidays]\n  exclude: [{name: own, dates: ['2027-01-01']}]\n",
    )
    desired = {d.spec.job_id: d.spec for d in load([tmp_path / "jobs"])}
    assert [(e.name, e.first, e.last) for e in desired["a"].exclude] == [
        ("holidays", "2027-12-24", "2027-12-26")
    ]
    assert {e.name for e in desired["b"].exclude} == {"own", "holidays"}
    write(tmp_path, "other/x.yaml", "job_id: c\nowner: t\nschedule: {every: 1h}\ncommand: [x]\n"
          "calendars: [holidays]\n")  # fmt: skip
    with pytest.raises(JobFileError, match=r"x.yaml:1: no calendar 'holidays' in the files"):
        load([tmp_path / "other"])


def test_an_exported_hand_made_job_stays_hand_made_when_applied(tmp_path: Path) -> None:
    rows = [registered({"job_id": "manual", "owner": "t", "schedule": {"every": "1h"},
                        "command": ["x"]})]  # fmt: skip
    exported = write(tmp_path, "export.yaml", yaml.safe_dump(export_documents(rows)))
    (job,) = load([exported])
    assert job.spec.managed_by == ""
    assert [c.kind for c in plan([job], rows, prune=True)] == ["same"]


# -- prune's scope: the owners the files name ---------------------------------------------
BASE = {"schedule": {"every": "1h"}, "command": ["x"]}


def two_owners() -> list[dict[str, Any]]:
    """Apply-managed jobs of two owners, and a job of the first made by hand."""
    return [
        registered({"job_id": "team-old", "owner": "team", "managed_by": MANAGED_BY, **BASE}),
        registered({"job_id": "team-by-hand", "owner": "team", **BASE}),
        registered({"job_id": "other-etl", "owner": "other", "managed_by": MANAGED_BY, **BASE}),
        registered({"job_id": "other-report", "owner": "other", "managed_by": MANAGED_BY, **BASE}),
    ]


class Registry:
    """What the fake services below list, and the writes the CLI makes through them."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows
        self.put: list[str] = []
        self.deleted: list[str] = []


class DirectService(Service):
    """`--direct`: the Service itself, the caller admin (no Kafka or database here)."""

    def __init__(self, registry: Registry) -> None:  # no settings: nothing opened
        self.registry = registry

    def jobs(
        self,
        who: Principal,
        *,
        owner: str | None = None,
        paused: bool | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        return {"items": [r for r in self.registry.rows if who.may_see(r["owner"])], "next": None}

    def put_job(
        self, who: Principal, body: dict[str, Any], allow_missing_upstreams: bool = False
    ) -> Accepted:
        self.registry.put.append(body["job_id"])
        return Accepted({}, True)

    def job_command(self, who: Principal, job_id: str, kind: str, **fields: Any) -> Accepted:
        assert kind == "delete"
        self.registry.deleted.append(job_id)
        return Accepted({}, True)


class TokenService(RemoteService):
    """Over the API with a token: the API lists the token's caller only what it may see
    (connectors/api/service.py `jobs`: an owner its own jobs, an admin everyone's)."""

    def __init__(self, registry: Registry, caller: Principal) -> None:
        self.registry = registry
        self.caller = caller

    def jobs(
        self,
        who: Principal,
        *,
        owner: str | None = None,
        paused: bool | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        rows = [r for r in self.registry.rows if self.caller.may_see(r["owner"])]
        return {"items": rows, "next": None}

    def put_job(
        self, who: Principal, body: dict[str, Any], allow_missing_upstreams: bool = False
    ) -> Accepted:
        self.registry.put.append(body["job_id"])
        return Accepted({}, True)

    def job_command(self, who: Principal, job_id: str, kind: str, **fields: Any) -> Accepted:
        assert kind == "delete"
        assert self.caller.may_see(
            next(r for r in self.registry.rows if r["job_id"] == job_id)["owner"]
        )
        self.registry.deleted.append(job_id)
        return Accepted({}, True)


def caller(name: str, registry: Registry) -> Service | RemoteService:
    """`--direct`, an admin's token, or team's token."""
    if name == "direct":
        return DirectService(registry)
    return TokenService(registry, ADMIN if name == "admin-token" else Principal("owner", "team"))


def cronlog(
    monkeypatch: pytest.MonkeyPatch, service: Service | RemoteService, *args: str
) -> Result:
    """`cronlog ARGS` with the CLI's service replaced by `service`."""
    from connectors.cli import app

    @contextmanager
    def fake(wait_s: float = 5.0) -> Iterator[Service | RemoteService]:
        yield service

    monkeypatch.setattr("connectors.cli.jobs_as_code.open_service", fake)
    mode = ["--direct"] if isinstance(service, Service) else ["--api", "http://api", "--token", "t"]
    return CliRunner().invoke(app, [*args, *mode])


@pytest.mark.parametrize("who", ["direct", "admin-token"])
def test_an_owner_with_no_jobs_left_prunes_only_that_owners_jobs(
    who: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 52 item 6: files for `owner: team` with `jobs: []`, pruned as admin, delete
    team's apply-managed jobs and nothing of the other owner's (nor team's by hand)."""
    path = write(tmp_path, "team.yaml", "owner: team\njobs: []\n")
    registry = Registry(two_owners())
    service = caller(who, registry)
    drift = cronlog(
        monkeypatch, service, "diff", "-f", str(path), "--prune", "--managed-by", "cronlog-apply"
    )
    assert drift.exit_code == 1, drift.output
    assert "other-" not in drift.stdout
    assert "- team-old (delete)" in drift.stdout
    assert "prune scope: owner team, managed_by 'cronlog-apply'" in drift.stdout
    done = cronlog(
        monkeypatch, service, "apply", "-f", str(path), "--prune", "--managed-by", "cronlog-apply"
    )
    assert done.exit_code == 0, done.output
    assert registry.deleted == ["team-old"]
    assert registry.put == []


@pytest.mark.parametrize("who", ["direct", "admin-token"])
@pytest.mark.parametrize(
    "text",
    [
        "jobs: []\n",
        "- job_id: team-new\n  schedule: {every: 1h}\n  command: [x]\n",
    ],
    ids=["no-jobs", "a-job-naming-no-owner"],
)
def test_as_admin_a_prune_of_files_naming_no_owner_is_refused(
    who: str, text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 53 item 5: as admin, files naming no owner would prune every owner's jobs:
    refused, saying how to name the owner, before anything is written."""
    path = write(tmp_path, "jobs.yaml", text)
    registry = Registry(two_owners())
    service = caller(who, registry)
    for command in ("apply", "diff"):
        refused = cronlog(
            monkeypatch,
            service,
            command,
            "-f",
            str(path),
            "--prune",
            "--managed-by",
            "cronlog-apply",
        )
        assert refused.exit_code == 1, refused.output
        assert "the files name no owner" in refused.stderr
        assert "`owner: NAME` at the top of a file" in refused.stderr
        assert "--owner NAME" in refused.stderr
        assert "delete" not in refused.stdout
    assert registry.deleted == registry.put == []
    # Named with --owner, the same files prune that owner's jobs only.
    named = cronlog(
        monkeypatch,
        service,
        "apply",
        "-f",
        str(path),
        "--prune",
        "--managed-by",
        "cronlog-apply",
        "--owner",
        "other",
    )
    assert named.exit_code == 0, named.output
    assert "prune scope: owner other," in named.stdout
    assert sorted(registry.deleted) == ["other-etl", "other-report"]


def test_an_owners_token_prunes_its_own_jobs_when_the_files_name_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An owner's token (the README's CI): the API lists it only its jobs, so the prune's
    scope is that owner, said as the token's."""
    path = write(
        tmp_path, "jobs.yaml", "- job_id: team-new\n  schedule: {every: 1h}\n  command: [x]\n"
    )
    registry = Registry(two_owners())
    done = cronlog(
        monkeypatch,
        caller("team-token", registry),
        "apply",
        "-f",
        str(path),
        "--prune",
        "--managed-by",
        "cronlog-apply",
    )
    assert done.exit_code == 0, done.output
    assert "prune scope: owner team (the token's: the files name none)" in done.stdout
    assert registry.put == ["team-new"]
    assert registry.deleted == ["team-old"]
    nothing = Registry([])  # a token with no jobs yet: nothing to prune, not refused
    first = cronlog(
        monkeypatch,
        caller("team-token", nothing),
        "apply",
        "-f",
        str(path),
        "--prune",
        "--managed-by",
        "cronlog-apply",
    )
    assert first.exit_code == 0, first.output
    assert "prune scope: owner none (the token has no jobs)" in first.stdout


def test_the_files_owners_are_those_they_name_even_with_no_jobs(tmp_path: Path) -> None:
    write(tmp_path, "jobs/a.yaml", "owner: team\njobs: []\n")
    write(
        tmp_path,
        "jobs/b.yaml",
        "- job_id: b\n  owner: ops\n  schedule: {every: 1h}\n  command: [x]\n"
        "- job_id: c\n  schedule: {every: 1h}\n  command: [x]\n",
    )
    files = read_files([tmp_path / "jobs"], owner="default")
    assert files.owners == {"team", "ops"}  # "default", only filled in, is not named
    assert [d.spec.owner for d in files.jobs] == ["ops", "default"]
    bad = write(tmp_path, "bad.yaml", "jobs: []\nowner: [team]\n")
    with pytest.raises(JobFileError, match=rf"{bad}:2: owner must be an owner's name"):
        read_files([bad])


def test_prune_deletes_refuses_an_empty_scope(tmp_path: Path) -> None:
    rows = two_owners()
    assert prune_deletes(rows, [], ["team"]) == ["team-old"]
    assert prune_deletes(rows, ["team-old"], ["team", "other"]) == ["other-etl", "other-report"]
    with pytest.raises(PruneScopeError, match="the files name no owner"):
        prune_deletes(rows, [], [])
    with pytest.raises(PruneScopeError, match="jobs made by hand"):
        prune_deletes(rows, [], ["team"], managed_by="")
    with pytest.raises(PruneScopeError):  # desired jobs naming no owner: no scope
        plan(load([write(tmp_path, "x.yaml", "jobs: []\n")]), rows, prune=True)


OWNERS = ["team", "other", "ops"]
MARKERS = [MANAGED_BY, "repo-b", ""]
IDS = [f"j{i}" for i in range(8)]

rows_strategy = st.dictionaries(
    st.sampled_from(IDS), st.tuples(st.sampled_from(OWNERS), st.sampled_from(MARKERS))
)
maybe_owner = st.none() | st.sampled_from(OWNERS)


@st.composite
def job_files_strategy(draw: st.DrawFn) -> list[tuple[str | None, list[tuple[str, str | None]]]]:
    """Up to three files, each (its top-level owner or None, [(job id, its owner or None)]),
    no job id in two places."""
    ids = draw(st.lists(st.sampled_from(IDS), unique=True))
    cuts = sorted(draw(st.lists(st.integers(0, len(ids)), min_size=2, max_size=2)))
    parts = [ids[: cuts[0]], ids[cuts[0] : cuts[1]], ids[cuts[1] :]]
    return [(draw(maybe_owner), [(job_id, draw(maybe_owner)) for job_id in part]) for part in parts]


@settings(max_examples=200)
@given(rows_strategy, job_files_strategy(), st.sampled_from([MANAGED_BY, "repo-b"]))
def test_every_prune_delete_is_of_an_owner_the_files_name_and_of_its_managed_by(
    existing: dict[str, tuple[str, str]],
    files: list[tuple[str | None, list[tuple[str, str | None]]]],
    managed_by: str,
) -> None:
    """For any registered jobs and any files: prune deletes exactly the jobs with that
    managed_by, of an owner the files name (at a file's top or on a job), the files do
    not list; with no owner named it refuses (never every owner)."""
    rows = [
        registered({"job_id": j, "owner": o, "managed_by": m, **BASE})
        for j, (o, m) in existing.items()
    ]
    named: set[str] = set()
    listed: set[str] = set()
    with tempfile.TemporaryDirectory() as tmp:
        for i, (top, jobs) in enumerate(files):
            docs = [{"job_id": j, **({"owner": o} if o else {}), **BASE} for j, o in jobs]
            body: Any = {"owner": top, "jobs": docs} if top else docs
            write(Path(tmp), f"{i}.yaml", yaml.safe_dump(body))
            named |= {top} if top else set()
            named |= {o for _, o in jobs if o}
            listed |= {j for j, _ in jobs}
        found = read_files([Path(tmp)], managed_by)
    if not named:
        with pytest.raises(PruneScopeError):
            plan(found.jobs, rows, managed_by, prune=True, owners=found.owners)
        return
    changes = plan(found.jobs, rows, managed_by, prune=True, owners=found.owners)
    deleted = {c.job_id for c in changes if c.kind == "delete"}
    for job_id in deleted:
        owner, marker = existing[job_id]
        assert owner in named
        assert marker == managed_by
        assert job_id not in listed
    assert deleted == {
        j for j, (o, m) in existing.items() if o in named and m == managed_by and j not in listed
    }
    assert found.owners == named


def test_every_invalid_job_of_the_files_is_named_in_one_pass(tmp_path: Path) -> None:
    """Three mistakes in two files: one run of apply names them all, each with its file
    and line (issue 55: three runs to find three mistakes)."""
    a = write(
        tmp_path,
        "jobs/a.yaml",
        "- job_id: one\n  owner: team\n  schedule: {every: 1m}\n  command: [x]\n  timeout: 5\n"
        "- job_id: two\n  owner: team\n  schedule: {cron: '61 * * * *'}\n  command: [x]\n",
    )
    b = write(tmp_path, "jobs/b.yaml", "job_id: three\nowner: team\ncommand: []\n")
    with pytest.raises(JobFileError) as refused:
        load([tmp_path / "jobs"])
    lines = str(refused.value).splitlines()
    assert len(lines) == 3, lines
    assert lines[0].startswith(f"{a}:1: job one: unknown field 'timeout'")
    assert lines[1].startswith(f"{a}:6: job two: schedule")
    assert lines[2].startswith(f"{b}:1: job three: command")


def test_an_upstream_neither_registered_nor_in_the_files_is_refused_unless_allowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A typo in depends_on (`etll`) is refused before anything is applied, with its
    file and line; upstreams registered or in the files, in any order, are not; with
    --allow-missing-upstreams it is applied, with a warning."""
    path = write(
        tmp_path,
        "jobs.yaml",
        "- job_id: report\n  owner: team\n  depends_on: [load, etll]\n  command: [r]\n"
        "- job_id: load\n  owner: team\n  depends_on: [etl]\n  command: [l]\n",
    )
    registry = Registry([registered(yaml.safe_load(JOBS)[0])])  # etl is registered
    refused = cronlog(monkeypatch, DirectService(registry), "apply", "-f", str(path))
    assert refused.exit_code == 1, refused.output
    assert f"{path}:1: job report: depends_on names 'etll', neither registered" in refused.output
    assert "'load'" not in refused.output.split("depends_on names")[1].splitlines()[0]
    assert registry.put == []  # nothing applied
    allowed = cronlog(
        monkeypatch,
        DirectService(registry),
        "apply",
        "-f",
        str(path),
        "--allow-missing-upstreams",
    )
    assert allowed.exit_code == 0, allowed.output
    assert "warning:" in allowed.output
    assert sorted(registry.put) == ["load", "report"]


def test_a_webhook_s_on_key_reads_as_the_word_on(tmp_path: Path) -> None:
    """YAML 1.1 reads a plain `on:` key as True ("Dict key must be str" before; issue 55);
    a job file's `on:` is the word, while `idempotent: yes` stays a boolean value."""
    path = write(
        tmp_path,
        "hooks.yaml",
        "job_id: hooked\nowner: team\nschedule: {every: 1h}\ncommand: [x]\nidempotent: yes\n"
        "notify:\n  url: https://hooks.example.com/cronlog\n  on: [failed, lost]\n",
    )
    (job,) = load([path])
    assert job.spec.notify is not None
    assert job.spec.notify.on == ("failed", "lost")
    assert job.spec.idempotent is True


def test_a_prune_without_its_own_name_is_refused_so_folders_never_prune_each_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 55: `apply --prune` of one folder deleted the jobs applied from another
    folder of the same owner (both carried the default name). A prune now needs
    --managed-by NAME, refused (exit 2) before anything is read or deleted; two folders
    with names of their own prune only their own jobs."""
    etl = write(tmp_path, "etl/jobs.yaml", JOBS)
    registry = Registry([registered({**yaml.safe_load(JOBS)[0], "managed_by": "reports"})])
    refused = cronlog(monkeypatch, DirectService(registry), "apply", "-f", str(etl), "--prune")
    assert refused.exit_code == 2
    assert "--prune needs --managed-by NAME" in refused.output
    assert registry.put == []
    assert registry.deleted == []
    done = cronlog(
        monkeypatch,
        DirectService(registry),
        "apply",
        "-f",
        str(write(tmp_path, "etl2/jobs.yaml", JOBS.split("- job_id: report")[0])),
        "--prune",
        "--managed-by",
        "etl",
    )
    assert done.exit_code == 0, done.output
    assert registry.deleted == []  # `etl` registered by "reports": not this folder's


def test_an_upstream_pruned_by_the_same_apply_or_of_another_owner_is_missing() -> None:
    """The hostile review: an upstream about to be deleted by this apply's prune, or a
    job of the files with another owner, is no upstream; one the registered version of
    the job already named is not refused again (it was allowed before)."""
    from connectors.apply import missing_upstreams

    def spec(job_id: str, owner: str, *ups: str) -> Any:
        doc = {"job_id": job_id, "owner": owner, "command": ["x"], "depends_on": list(ups)}
        return _parsed_spec(doc)

    a = spec("a", "alice", "b", "c", "d")
    b_of_bob = spec("b", "bob")
    assert missing_upstreams([a, b_of_bob], known={"c", "d"}) == {"a": ["b"]}
    assert missing_upstreams([a], known={"b", "c"}) == {"a": ["d"]}  # d pruned: not known
    assert missing_upstreams([a], known={"b", "c"}, had={"a": ("d",)}) == {}


def _parsed_spec(doc: dict[str, Any]) -> Any:
    import orjson

    parsed = parse_command(orjson.dumps({"type": "job.upsert", **doc}))
    assert isinstance(parsed, UpsertJob), parsed
    return parsed.spec

"""Jobs as code (connectors/apply.py): job files read with their lines, the difference with
what is registered, prune limited to apply's own jobs, export read back unchanged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from connectors.apply import (
    MANAGED_BY,
    JobFileError,
    describe,
    export_documents,
    load,
    plan,
    summary,
)
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

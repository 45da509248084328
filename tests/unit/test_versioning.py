"""The version an operator follows: every record version in the schema history belongs to
one CHANGELOG.md section, the sections are 0.1.0, 0.2.0 ... in order, and pyproject.toml
says the newest. Pure: it reads three files of the checkout.

When a record schema gets a new version (a new file in schemas/avro/history), the
failure says what to add: a section on top of CHANGELOG.md naming it, and the bumped
version in pyproject.toml.
"""

from __future__ import annotations

import datetime
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from typer.testing import CliRunner

from connectors.cli import app, record_versions

ROOT = Path(__file__).resolve().parents[2]
HISTORY = ROOT / "schemas" / "avro" / "history"
CHANGELOG = ROOT / "CHANGELOG.md"
HEADING = re.compile(r"^## 0\.(\d+)\.0 \((\d{4}-\d{2}-\d{2})\)$")
RECORD = re.compile(r"^(\w+) v(\d+)$")

# Who must run the new version first, by record (CHANGELOG.md's table): the hint the
# failure message gives for the new section's upgrade notes.
READERS_FIRST = {
    "job_log": "all nodes first (they read job-log), then workers and the API",
    "run_event": "projector, notifier and API first, then nodes",
    "job_state": "projector and notifier first, then nodes",
    "run_state": "nodes one after the other without a pause",
    "dispatch": "nodes one after the other without a pause",
    "worker_inbox": "workers and the API first, then nodes",
    "heartbeat": "nodes and projector first, then workers",
    "run_log": "projector first, then workers",
}


@dataclass(frozen=True)
class Section:
    minor: int
    date: str
    records: tuple[tuple[str, int], ...]
    has_upgrade_notes: bool


def history() -> set[tuple[str, int]]:
    found = set()
    for path in HISTORY.glob("*.avsc"):
        match = re.fullmatch(r"(\w+)\.v(\d+)\.avsc", path.name)
        assert match, f"{path.name}: not <record>.v<N>.avsc"
        found.add((match[1], int(match[2])))
    return found


def sections() -> list[Section]:
    """CHANGELOG.md's version sections, newest first, as written."""
    found: list[Section] = []
    lines = CHANGELOG.read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if HEADING.match(line)]
    for start, end in zip(starts, [*starts[1:], len(lines)], strict=True):
        heading = HEADING.match(lines[start])
        assert heading
        body = lines[start + 1 : end]
        named = [line.removeprefix("Records:") for line in body if line.startswith("Records:")]
        assert len(named) == 1, f"{lines[start]}: one 'Records:' line, found {len(named)}"
        records = []
        for item in named[0].split(","):
            record = RECORD.match(item.strip())
            assert record, f"{lines[start]}: {item.strip()!r} is not '<record> v<N>'"
            records.append((record[1], int(record[2])))
        found.append(
            Section(
                int(heading[1]),
                heading[2],
                tuple(records),
                any(line.startswith("- Upgrade:") for line in body),
            )
        )
    return found


def project_version() -> str:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert isinstance(version, str)
    return version


def what_to_add(missing: set[tuple[str, int]], newest: Section) -> str:
    version = f"0.{newest.minor + 1}.0"
    records = ", ".join(f"{name} v{n}" for name, n in sorted(missing))
    order = "; ".join(sorted({f"{name}: {READERS_FIRST.get(name, '?')}" for name, _ in missing}))
    return (
        f"schemas/avro/history has record versions no CHANGELOG.md section names: {records}.\n"
        f"Add this section on top of CHANGELOG.md (above '## 0.{newest.minor}.0'), with the "
        f"commit and what changed:\n\n"
        f"## {version} ({datetime.date.today().isoformat()})\n\n"
        f"Records: {records}\n"
        f"Commits: <this commit>\n"
        f"Database: <migrations added since 0.{newest.minor}.0, or drop this line>\n\n"
        f"<what changed, one sentence>\n\n"
        f"- Upgrade: {order}.\n"
        f"- Rollback: <to 0.{newest.minor}.0: possible until the first writer of the new "
        f"version writes; none after>\n\n"
        f'and set version = "{version}" in pyproject.toml.'
    )


def test_every_record_version_has_its_changelog_section() -> None:
    files = history()
    found = sections()
    # Not vacuous: the history and the changelog were both read.
    assert len(files) >= 40, f"only {len(files)} schema files under {HISTORY}"
    assert len(found) >= 17, f"only {len(found)} version sections in CHANGELOG.md"
    named = [record for section in found for record in section.records]
    twice = sorted({r for r in named if named.count(r) > 1})
    assert not twice, f"named by more than one CHANGELOG.md section: {twice}"
    phantom = sorted(set(named) - files)
    assert not phantom, f"CHANGELOG.md names record versions with no schema file: {phantom}"
    missing = files - set(named)
    assert not missing, what_to_add(missing, found[0])


def test_versions_go_up_by_one_minor_per_record_change() -> None:
    found = sections()
    minors = [s.minor for s in found]
    assert minors == list(range(len(found), 0, -1)), (
        f"CHANGELOG.md sections must be 0.N.0 ... 0.1.0, newest first, one MINOR apart: {minors}"
    )
    dates = [s.date for s in found]
    assert dates == sorted(dates, reverse=True), f"section dates not newest first: {dates}"
    assert all(s.has_upgrade_notes for s in found), "every section needs a '- Upgrade:' line"
    # A record's versions belong to versions in the same order: a newer section adds
    # newer versions only.
    newest_seen: dict[str, int] = {}
    for section in reversed(found):
        for name, n in section.records:
            assert n > newest_seen.get(name, 0), f"{name} v{n} in 0.{section.minor}.0"
            newest_seen[name] = n


def test_pyproject_says_the_newest_section() -> None:
    newest = f"0.{sections()[0].minor}.0"
    assert project_version() == newest, (
        f'pyproject.toml says {project_version()}: set version = "{newest}" '
        f"(CHANGELOG.md's newest section)"
    )


def test_cli_prints_the_version_and_the_records_it_writes() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("cronlog 0."), result.output
    newest = {name: max(n for r, n in history() if r == name) for name, _ in history()}
    assert record_versions() == dict(sorted(newest.items()))
    assert "job_log v" in result.output

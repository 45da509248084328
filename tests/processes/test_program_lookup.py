"""A job's program is looked up in its PATH once a second at most (procs.ProgramLookup);
a program remembered that is gone since is looked up again, not reported missing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from connectors.worker.procs import ProgramLookup, decode_status, spawn


def _program(folder: Path, name: str, says: str) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\necho {says}\n")
    path.chmod(0o755)
    return path


def _run(argv: list[str], path: str, tmp_path: Path) -> str:
    out = tmp_path / "out"
    with open(out, "wb") as stdout:
        pid = spawn(argv, {"PATH": path}, tmp_path, stdout.fileno(), stdout.fileno())
    _, status = os.waitpid(pid, 0)
    assert decode_status(status) == (0, None)
    return out.read_text()


def test_a_lookup_is_remembered_then_forgotten(tmp_path: Path) -> None:
    first = _program(tmp_path / "a", "tool", "a")
    path = f"{tmp_path / 'a'}:{tmp_path / 'b'}"
    lookup = ProgramLookup(keep_s=3600)
    assert lookup.find("tool", path) == str(first)
    first.unlink()
    second = _program(tmp_path / "b", "tool", "b")
    assert lookup.find("tool", path) == str(first)  # remembered
    assert lookup.forget("tool", path)
    assert lookup.find("tool", path) == str(second)
    assert ProgramLookup(keep_s=0).find("tool", path) == str(second)


def test_a_relative_path_is_never_remembered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _program(tmp_path / "bin", "tool", "x")
    lookup = ProgramLookup(keep_s=3600)
    assert lookup.find("tool", "bin") == "bin/tool"
    assert not lookup.forget("tool", "bin")


def test_a_program_gone_since_its_lookup_is_found_again(tmp_path: Path) -> None:
    first = _program(tmp_path / "a", "cronlog-lookup-tool", "first")
    path = f"{tmp_path / 'a'}:{tmp_path / 'b'}"
    assert _run(["cronlog-lookup-tool"], path, tmp_path) == "first\n"
    first.unlink()  # an upgrade moves it, within the second the lookup is kept
    _program(tmp_path / "b", "cronlog-lookup-tool", "second")
    assert _run(["cronlog-lookup-tool"], path, tmp_path) == "second\n"
    (tmp_path / "b" / "cronlog-lookup-tool").unlink()
    with pytest.raises(FileNotFoundError):
        _run(["cronlog-lookup-tool"], path, tmp_path)

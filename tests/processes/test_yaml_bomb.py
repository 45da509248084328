"""Issue 53, item 6, the attack itself: `cronlog diff -f` (the CI step) on 594 bytes of
nested YAML aliases ("billion laughs") that ask for gigabytes once expanded. Played in a
child process whose address space is bounded, so the old loader fails the test (out of
memory: a MemoryError or a crash) instead of exhausting the machine; the loader of
connectors/safe_yaml.py refuses the file at once, naming it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.unit.test_safe_yaml import LAUGHS

ROOT = Path(__file__).resolve().parents[2]
AS_LIMIT = 1536 * 1024 * 1024  # the child's address space: far below what the bomb asks


def _in_bounded_child(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    prelude = textwrap.dedent(
        f"""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, ({AS_LIMIT}, {AS_LIMIT}))
        """
    )
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(script), *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_diff_f_refuses_a_billion_laughs_naming_the_file(tmp_path: Path) -> None:
    """`cronlog diff -f bomb.yaml` (the CI step) exits 1 with the file and line named,
    at once and in bounded memory; with the old loader the child ran out of memory."""
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(LAUGHS)
    done = _in_bounded_child(
        """
        import sys
        from contextlib import contextmanager
        from typer.testing import CliRunner
        import connectors.cli.jobs_as_code as jobs_as_code
        from connectors.cli import app
        from tests.unit.test_apply import DirectService, Registry

        @contextmanager
        def fake(wait_s=5.0):
            yield DirectService(Registry([]))

        jobs_as_code.open_service = fake
        result = CliRunner().invoke(app, ["diff", "-f", sys.argv[1], "--direct"])
        print("exit", result.exit_code, type(result.exception).__name__)
        print(result.output)
        """,
        str(bomb),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "MemoryError" not in done.stdout, done.stdout[-2000:]
    assert done.stdout.startswith("exit 1 SystemExit"), done.stdout[-2000:]
    assert f"{bomb}:" in done.stdout
    assert "billion laughs" in done.stdout

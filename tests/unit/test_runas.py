"""Which user a worker runs its jobs as (connectors/worker/runas.py)."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from connectors.worker.runas import DEFAULT_PATH, RunAs, RunAsError, choose

NOBODY = pwd.getpwnam("nobody")


def test_root_without_a_choice_is_refused_with_what_to_do() -> None:
    with pytest.raises(RunAsError, match="--run-as USER") as raised:
        choose(None, allow_root=False, euid=0)
    assert "--allow-root" in str(raised.value)
    assert choose(None, allow_root=True, euid=0) is None  # on purpose
    assert choose(None, allow_root=False, euid=1000) is None  # not root: itself


def test_run_as_names_an_unprivileged_user() -> None:
    found = choose("nobody", allow_root=False, euid=0)
    assert found == RunAs("nobody", NOBODY.pw_uid, NOBODY.pw_gid, NOBODY.pw_dir)
    assert found.env == {"HOME": NOBODY.pw_dir, "USER": "nobody", "LOGNAME": "nobody"}
    assert choose(str(NOBODY.pw_uid), allow_root=False, euid=0) == found


@pytest.mark.parametrize(
    ("user", "euid", "words"),
    [
        ("root", 0, "add --allow-root"),
        ("no-such-user-here", 0, "no such user"),
        ("nobody", 1000, "only root can run jobs as another user"),
    ],
)
def test_impossible_or_dangerous_choices_are_refused(user: str, euid: int, words: str) -> None:
    with pytest.raises(RunAsError, match=words):
        choose(user, allow_root=False, euid=euid)


def test_naming_oneself_changes_nothing() -> None:
    assert choose("nobody", allow_root=False, euid=NOBODY.pw_uid) is None


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A folder anyone may enter (pytest's own open_tmp sits below a 0700 folder)."""
    made = Path(tempfile.mkdtemp(prefix="cronlog-runas-"))
    made.chmod(0o755)
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)


def test_a_job_s_path_keeps_only_what_its_user_can_enter(open_tmp: Path) -> None:
    """A root worker's PATH beginning in a folder of root's (issue 55: `python3` found in
    /root/.pyenv/shims, then "[Errno 13] Permission denied" for `nobody`): the job's PATH
    keeps the entries its user can search, in order, or the system's usual one."""
    nobody = pwd.getpwnam("nobody")
    user = RunAs("nobody", nobody.pw_uid, nobody.pw_gid, nobody.pw_dir)
    closed = open_tmp / "closed"
    (closed / "bin").mkdir(parents=True)
    closed.chmod(0o700)
    opened = open_tmp / "open" / "bin"
    opened.mkdir(parents=True)
    for folder in (open_tmp, open_tmp / "open", opened):
        folder.chmod(0o755)
    assert all(os.stat(folder).st_mode & stat.S_IXOTH for folder in open_tmp.parents)
    given = f"{closed / 'bin'}:{opened}:relative/bin:/usr/bin"
    assert user.path(given) == f"{opened}:/usr/bin"
    assert user.path(f"{closed / 'bin'}") == DEFAULT_PATH
    assert user.path(None) == DEFAULT_PATH

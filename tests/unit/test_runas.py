"""Which user a worker runs its jobs as (connectors/worker/runas.py)."""

from __future__ import annotations

import pwd

import pytest

from connectors.worker.runas import RunAs, RunAsError, choose

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

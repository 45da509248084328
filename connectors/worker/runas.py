"""Which user a worker's jobs run as.

A worker started as root runs no job as root unless told to: `cronlog worker --run-as
USER` runs every job as that user (its uid, its primary group, no supplementary groups,
HOME, USER and LOGNAME set to it), each in a run directory it owns; `--allow-root` is the
explicit choice to run jobs as root. A worker started as another user runs jobs as
itself (it cannot change users), and `--run-as` then may only name that user.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass


class RunAsError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class RunAs:
    name: str
    uid: int
    gid: int
    home: str

    @property
    def ids(self) -> tuple[int, int]:
        return self.uid, self.gid

    @property
    def env(self) -> dict[str, str]:
        return {"HOME": self.home, "USER": self.name, "LOGNAME": self.name}


def choose(user: str | None, allow_root: bool, euid: int | None = None) -> RunAs | None:
    """The user jobs run as (None: this worker's own), or a RunAsError saying what to do."""
    euid = os.geteuid() if euid is None else euid
    if user is None:
        if euid == 0 and not allow_root:
            raise RunAsError(
                "this worker runs as root, so its jobs would run as root: give --run-as "
                "USER (an unprivileged user to run them as, e.g. --run-as nobody), or "
                "--allow-root to run them as root on purpose"
            )
        return None
    try:
        entry = pwd.getpwnam(user) if not user.isdigit() else pwd.getpwuid(int(user))
    except KeyError:
        raise RunAsError(f"--run-as {user}: no such user on this machine") from None
    if entry.pw_uid == 0 and not allow_root:
        raise RunAsError(f"--run-as {user} is root: add --allow-root to run jobs as root")
    if euid != 0 and entry.pw_uid != euid:
        raise RunAsError(
            f"--run-as {user}: only root can run jobs as another user (this worker runs "
            f"as uid {euid})"
        )
    if entry.pw_uid == euid:
        return None  # itself: nothing to change
    return RunAs(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir)

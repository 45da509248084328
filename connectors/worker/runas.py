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
import stat
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

    def path(self, worker_path: str | None) -> str:
        """The PATH of its jobs: the worker's entries this user can search (a root
        worker's PATH may begin in /root, which another user cannot enter: the program
        found there would not start), or the system's usual one when none is left. A
        job's own `env` PATH still wins."""
        kept = [d for d in (worker_path or "").split(":") if d and _searchable(d, self)]
        return ":".join(kept) or DEFAULT_PATH


# The PATH of a job run as another user when none of the worker's entries serve it (the
# Debian default of a login shell, as sudo's secure_path).
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _searchable(directory: str, user: RunAs) -> bool:
    """Whether `user` may enter `directory` and every directory above it (by the mode
    bits for its uid, primary group or others; supplementary groups are dropped)."""
    if not os.path.isabs(directory):
        return False
    current = os.path.realpath(directory)
    while True:
        try:
            info = os.stat(current)
        except OSError:
            return False
        if info.st_uid == user.uid:
            bit = stat.S_IXUSR
        elif info.st_gid == user.gid:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not info.st_mode & bit:
            return False
        parent = os.path.dirname(current)
        if parent == current:
            return True
        current = parent


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

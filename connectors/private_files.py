"""Files and folders only the node's user may read: secrets written 0600 from their first
byte, and folders checked before anything private goes into them.

A file written, then chmod-ed, is readable in between: whoever opens it then keeps a
descriptor that reads what is written after the chmod. So `write_private` writes a new
file created 0600 (O_CREAT|O_EXCL|O_NOFOLLOW, whatever the umask) beside the target and
renames it over the target: the name never shows anything else, and a reader of the old
file never sees the new content.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700


class NotPrivate(ValueError):
    """A folder another user could read or change: its message says which and why."""


def write_private(path: Path, data: str | bytes, owner: tuple[int, int] | None = None) -> None:
    """Replace `path` with `data`, readable by this user only from its creation on (by
    `owner`, a uid and gid, instead when given: the file keeps the user that reads it,
    say a service's, when root rewrites it)."""
    body = data.encode() if isinstance(data, str) else data
    temp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temp, flags, PRIVATE_FILE)
    try:
        try:
            os.fchmod(fd, PRIVATE_FILE)  # the mode given is already at most this: a belt
            if owner is not None:
                os.fchown(fd, *owner)
            view = memoryview(body)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, path)  # replaces a link at `path` itself, never its target
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


def private_dir(path: Path, what: str) -> Path:
    """`path` as a folder for this user only: made 0700 when missing; an existing one
    must be this user's and writable by no one else (NotPrivate, naming it and `what` it
    is for), and loses its group and other bits. A link is judged by what it names."""
    path.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    info = os.stat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise NotPrivate(f"{what} {path} is not a folder")
    if info.st_uid != os.geteuid():
        raise NotPrivate(
            f"{what} {path} belongs to uid {info.st_uid}, not to this user "
            f"(uid {os.geteuid()}): whoever owns it could read or replace what is kept "
            "there; remove it, or choose a folder of this user's"
        )
    if info.st_mode & 0o022:
        raise NotPrivate(
            f"{what} {path} is writable by its group or others "
            f"(mode {stat.S_IMODE(info.st_mode):04o}): they could replace what is kept "
            f"there; chmod 700 {path}, or choose another folder"
        )
    if stat.S_IMODE(info.st_mode) != PRIVATE_DIR:
        os.chmod(path, PRIVATE_DIR)
    return path

"""Where an attempt runs and where its output goes: the run directory, a boundary the job
cannot cross.

    runs/<run>/            the run's directory, the worker's (0711: traversable only)
        <attempt>/         the attempt's, the worker's (0711), made fresh for it
            stdout         the job's output, made by the executor before the job exists
            stderr         (O_EXCL, O_NOFOLLOW, 0600): the job holds them open, never
                           by name, and cannot replace them (their directory is not its)
            work/          the job's working directory, its own (0700)

`<run>` is a one-to-one encoding of the run id (`name_of`), so two runs never share a
directory; an attempt's directory that exists already is refused, never reused, so
nothing a job left behind meets a later one. The worker reads the output through
`open_output` only: no symbolic link followed, nothing but a regular file read, never
a blocking open (a FIFO in its place would stop the worker's loop).

Directories are removed once the attempt's report was acknowledged and a retention
has passed (the worker's ``keep_s``): `remove_run_dir` for an attempt the journal
forgets, `prune_run_dirs` at start-up for whatever an earlier incarnation left (by age,
sparing the attempts still unfinished).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

# Longer encoded names are hashed (a file name holds 255 bytes); the two kinds of name
# start differently, so a hashed name never equals an encoded one.
_LONGEST_NAME = 200
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_APPEND | os.O_CLOEXEC
_REOPEN = os.O_WRONLY | os.O_NOFOLLOW | os.O_APPEND | os.O_CLOEXEC | os.O_NONBLOCK
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class RunDirError(OSError):
    """An attempt's directory cannot be made as it must be (it exists, or is not ours)."""


def name_of(run_id: str) -> str:
    """The run's directory name: one-to-one (every byte but letters, digits and '-'
    percent-encoded, '%' itself included), never '.' or '..', at most 200 bytes."""
    encoded = "r" + quote(run_id, safe="-")
    if len(encoded) <= _LONGEST_NAME:
        return encoded
    return "h" + hashlib.sha256(run_id.encode()).hexdigest()


def attempt_dir(runs_root: Path, run_id: str, attempt: int) -> Path:
    return runs_root / name_of(run_id) / str(int(attempt))


@dataclass(frozen=True, slots=True)
class Prepared:
    """An attempt's directory, made: the job's working directory and the descriptors
    of its output files (the caller hands them to the job and closes them)."""

    work: Path
    stdout: int
    stderr: int

    def close(self) -> None:
        for fd in (self.stdout, self.stderr):
            with contextlib.suppress(OSError):
                os.close(fd)


def _real_dir(path: Path) -> None:
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise RunDirError(f"{path} is not a directory")
    if info.st_uid != os.geteuid():
        raise RunDirError(f"{path} is not this worker's (owner uid {info.st_uid})")


def prepare(run_dir: Path, owner: tuple[int, int] | None) -> Prepared:
    """Make the attempt's directory fresh (RunDirError if it exists), its output files,
    and its working directory, owned by `owner` (uid, gid) when the job runs as another
    user. Everything is made by this process before the job exists."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    _real_dir(run_dir.parent)
    run_dir.parent.chmod(0o711)
    try:
        run_dir.mkdir(mode=0o711)
    except FileExistsError:
        raise RunDirError(f"the attempt's directory {run_dir} exists already: not reused") from None
    run_dir.chmod(0o711)
    work = run_dir / "work"
    work.mkdir(mode=0o700)
    if owner is not None:
        os.chown(work, *owner, follow_symlinks=False)
    work.chmod(0o700)
    out = os.open(run_dir / "stdout", _CREATE, 0o600)
    try:
        err = os.open(run_dir / "stderr", _CREATE, 0o600)
    except OSError:
        os.close(out)
        raise
    return Prepared(work, out, err)


def reopen(run_dir: Path, owner: tuple[int, int] | None) -> Prepared:
    """The attempt's directory as `prepare(run_dir, None)` made it ahead of the start: its
    output files opened again (never created, no symbolic link followed, never a blocking
    open, regular files of this worker's only), and its working directory handed to
    `owner` only now. Until then all of it is the worker's alone (the attempt's directory
    0711, `work/` 0700), so no other job, even one running as the same user, can leave
    anything in it before the job starts."""
    fds: list[int] = []
    try:
        for name in ("stdout", "stderr"):
            fd = os.open(run_dir / name, _REOPEN)
            fds.append(fd)
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
                raise RunDirError(f"{run_dir / name} is not this worker's output file")
            os.set_blocking(fd, True)  # the job gets it as its stdout or stderr
        work = run_dir / "work"
        _real_dir(work)
        if owner is not None:
            os.chown(work, *owner, follow_symlinks=False)
    except OSError:
        for fd in fds:
            os.close(fd)
        raise
    return Prepared(work, fds[0], fds[1])


def open_output(path: Path) -> int | None:
    """A descriptor to read an attempt's output file from, or None if there is none to
    read: missing, a symbolic link, or anything but a regular file of this worker's."""
    try:
        fd = os.open(path, _READ)
    except OSError:
        return None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
        os.close(fd)
        return None
    return fd


def remove_run_dir(run_dir: Path) -> None:
    """Remove an attempt's directory, and its run's directory once empty. (rmtree
    removes links, never what they point at.)"""
    shutil.rmtree(run_dir, ignore_errors=True)
    with contextlib.suppress(OSError):  # not empty: another attempt of the run is there
        run_dir.parent.rmdir()


def _newest_change(path: Path) -> float:
    """The latest mtime of a directory and of the entries in it (the job's output files
    change without changing their directory's mtime)."""
    newest = path.stat().st_mtime
    with os.scandir(path) as found:
        for item in found:
            with contextlib.suppress(OSError):
                newest = max(newest, item.stat(follow_symlinks=False).st_mtime)
    return newest


def prune_run_dirs(runs_root: Path, older_than: float, protected: Collection[Path]) -> int:
    """Remove the attempt directories under `runs_root` unchanged since `older_than`
    (wall clock, s), except the `protected` ones (attempts not yet reported); the
    number removed."""
    if not runs_root.is_dir():
        return 0
    keep = {p.resolve() for p in protected}
    removed = 0
    for run in runs_root.iterdir():
        if run.is_symlink() or not run.is_dir():
            continue
        for attempt in run.iterdir():
            try:
                if attempt.is_symlink() or not attempt.is_dir():
                    continue
                if attempt.resolve() in keep or _newest_change(attempt) >= older_than:
                    continue
            except OSError:
                continue  # gone meanwhile
            remove_run_dir(attempt)
            removed += 1
        with contextlib.suppress(OSError):
            run.rmdir()  # only when empty
    return removed

"""How much a job may write on its worker's disk: the output cap.

A job's stdout and stderr are files in its attempt's directory, on the volume that also
holds the worker's journal and leases (connectors/worker/rundirs.py). Only the first
1 MiB of each is shipped to run-logs (connectors/worker/runlogs.py), but without a cap
a job printing for ever fills that volume, and every owner's runs on the worker fail
with it (docs/security.md, "The job boundary").

The cap (`cronlog worker --output-cap-mb`, CRONLOG_WORKER_OUTPUT_CAP_MB, 64 MiB by
default, 0 for none) is the job's `RLIMIT_FSIZE`, soft and hard: no file the job or
any process it starts writes grows past it (the kernel cuts the write and sends
SIGXFSZ, which kills a process that does not ignore it, or answers EFBIG), and the job
cannot raise it (only a privileged process may raise a hard limit). Its output files
are therefore bounded exactly. The limit is per file: a job can still fill its working
directory with many files below the cap (docs/security.md says so).

Jobs started by fork (a memory limit, another user) get the limit in the child before
exec. posix_spawn cannot set limits, and a limit set on the child after the spawn
returns comes too late on a busy machine (measured: a job had written 5 MiB before it;
`prlimit` races the job). So a job is started by posix_spawn only by an executor that
may raise its own limits again (root, CAP_SYS_RESOURCE): it lowers its own
RLIMIT_FSIZE for the spawn, which the child inherits, and raises it back at once
(`lowered`; the executor is single-threaded and writes nothing meanwhile). An executor
that could not raise it back (a worker started as a normal user, or as root without
CAP_SYS_RESOURCE, as in many containers) starts the job through util-linux's `prlimit`
(`trampoline`): posix_spawn of `prlimit --fsize=CAP:CAP -- COMMAND`, which sets the
limit on itself and execs the command, so the executor's cost per start stays
posix_spawn's and the extra exec (about 1 ms of CPU, measured) is the job's. Under
bubblewrap the command is bwrap, started with its own fixed environment, so nothing of
the job's runs in `prlimit`; without bubblewrap `prlimit` gets the job's environment,
and a job of the worker's own user could evade the cap by its own LD_PRELOAD, as it
could do anything else of that user there (docs/security.md). Without `prlimit` such an
executor starts capped jobs by fork (`spawn_by_fork`), about 1.5 ms more of its CPU per
start (measured: 2.3-2.5 against 0.8-0.9 ms).

When either output file reached the cap the run is told why: the executor's result
carries `output_cut` (`reason`), which the worker reports as the run's failure.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Final

MIB: Final = 1024 * 1024
DEFAULT_OUTPUT_CAP_MB: Final = 64
STREAMS: Final = ("stdout", "stderr")


def set_limit(cap_bytes: int) -> None:
    """In a child before exec: this process's RLIMIT_FSIZE, soft and hard, at `cap_bytes`
    (never above a hard limit it already has). 0 or less: nothing."""
    if cap_bytes <= 0:
        return
    _soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    value = cap_bytes if hard == resource.RLIM_INFINITY else min(cap_bytes, hard)
    resource.setrlimit(resource.RLIMIT_FSIZE, (value, value))


_CAP_SYS_RESOURCE: Final = 24


def can_raise_limits() -> bool:
    """Whether this process may raise a hard limit again (CAP_SYS_RESOURCE effective)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> _CAP_SYS_RESOURCE & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


_RAISE = can_raise_limits()
TRAMPOLINE = shutil.which("prlimit", path="/usr/bin:/bin:/usr/sbin:/sbin")


def spawn_by_fork(cap_bytes: int) -> bool:
    """Whether jobs must be started by fork to get the cap (see the module's text)."""
    return cap_bytes > 0 and not _RAISE and TRAMPOLINE is None


def trampoline(argv: list[str], cap_bytes: int) -> list[str]:
    """`argv` as posix_spawn starts it here: through `prlimit`, which sets the cap on
    itself first, when this process cannot lend the cap for the spawn (`lowered`)."""
    if cap_bytes <= 0 or _RAISE or TRAMPOLINE is None:
        return argv
    return [TRAMPOLINE, f"--fsize={cap_bytes}:{cap_bytes}", "--", *argv]


@contextlib.contextmanager
def lowered(cap_bytes: int) -> Iterator[None]:
    """This process's RLIMIT_FSIZE at `cap_bytes` (soft and hard) for the block, for a
    child spawned in it to inherit, then as it was. Only for a process that may raise it
    back (`can_raise_limits`), single-threaded, writing nothing in the block. 0 or
    less: nothing."""
    if cap_bytes <= 0 or not _RAISE:
        yield
        return
    before = resource.getrlimit(resource.RLIMIT_FSIZE)
    set_limit(cap_bytes)
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, before)


def cut_streams(run_dir: Path, cap_bytes: int) -> list[str]:
    """The output files of the attempt in `run_dir` that reached the cap (the worker's
    own regular files: the job cannot replace them; no link is followed)."""
    if cap_bytes <= 0:
        return []
    cut = []
    for name in STREAMS:
        with contextlib.suppress(OSError):
            if os.lstat(run_dir / name).st_size >= cap_bytes:
                cut.append(name)
    return cut


def reason(streams: list[str], cap_bytes: int) -> str:
    """What a run whose output was cut is told."""
    return (
        f"output cut: {' and '.join(streams)} passed the worker's output cap of "
        f"{cap_bytes / MIB:g} MiB (RLIMIT_FSIZE; the worker's --output-cap-mb), and the "
        "job could write no more"
    )

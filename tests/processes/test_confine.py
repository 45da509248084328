"""The cover over a worker's files (connectors/worker/confine.py), played by a job of the
worker's own user: it finds nothing of what is hidden, keeps its own working directory,
and cannot lift the cover from a user namespace of its own. Each attack is played
without the cover too, so the test shows the cover is what stops it."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from connectors.worker.confine import Confinement, confinement

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="playing another user needs root"),
]
NOBODY = pwd.getpwnam("nobody")


@dataclass(frozen=True)
class Worker:
    """A worker's layout, all of it readable by the job's user (the worker's own)."""

    state: Path
    work: Path
    token: Path
    journal: Path


@pytest.fixture
def worker() -> Iterator[Worker]:
    # Not under pytest's tmp_path: its parents are root's alone, and the job's user must
    # reach these files by permission (only the cover may stop it).
    tmp_path = Path(tempfile.mkdtemp(prefix="cronlog-confine-test-"))
    tmp_path.chmod(0o755)
    state = tmp_path / "state"
    work = state / "workers" / "w1" / "runs" / "r1" / "1" / "work"
    work.mkdir(parents=True)
    journal = state / "workers" / "w1" / "journal"
    journal.write_text("seal-of-another-run\n")
    token = tmp_path / "kafka.properties"
    token.write_text("sasl.password=hunter2\n")
    for path in (*[p for p in tmp_path.rglob("*")], tmp_path):
        os.chown(path, NOBODY.pw_uid, NOBODY.pw_gid)
    try:
        yield Worker(state, work, token, journal)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


JOB_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def _as_job(
    argv: list[str], cwd: Path, made: Confinement | None = None, env: dict[str, str] | None = None
) -> str:
    """Run `argv` as the job's user, as the executor does: under `made` if given (bwrap
    with its own environment, the job's passed by descriptor)."""
    env = {"PATH": JOB_PATH, **(env or {})}
    fds: tuple[int, ...] = ()
    sandbox = None
    if made is not None:
        sandbox = made.wrap(argv, cwd, env)
        argv, env, fds = sandbox.argv, sandbox.env, (sandbox.args_fd,)
    try:
        done = subprocess.run(
            argv,
            cwd=cwd,
            user=NOBODY.pw_uid,
            group=NOBODY.pw_gid,
            extra_groups=[],
            env=env,
            pass_fds=fds,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    finally:
        if sandbox is not None:
            sandbox.close()
    assert done.returncode == 0, done.stderr
    return done.stdout


def _probe(w: Worker) -> list[str]:
    return [
        "sh",
        "-c",
        f"cat {w.journal} 2>/dev/null || echo journal-hidden; "
        f"cat {w.token} 2>/dev/null | grep -q hunter2 && echo token-read || echo token-hidden; "
        f"unshare -Urm sh -c 'umount -l {w.state}; umount -l {w.token}; cat {w.journal}' "
        "2>/dev/null || echo cover-held; "
        "echo mine > own && cat own",
    ]


def test_the_job_sees_only_its_own_directory(worker: Worker) -> None:
    made = confinement([worker.state, worker.token])
    assert isinstance(made, Confinement), made
    seen = _as_job(_probe(worker), worker.work, made).split()
    assert seen == ["journal-hidden", "token-hidden", "cover-held", "mine"]
    assert (worker.work / "own").read_text() == "mine\n"  # its writes land where they should


def test_without_the_cover_the_same_job_reads_everything(worker: Worker) -> None:
    seen = _as_job(_probe(worker), worker.work).split()
    assert seen[:2] == ["seal-of-another-run", "token-read"]


def test_a_missing_program_is_said_as_without_bubblewrap(worker: Worker) -> None:
    made = confinement([worker.state])
    assert isinstance(made, Confinement), made
    with pytest.raises(FileNotFoundError, match="no-such-program"):
        made.wrap(["no-such-program"], worker.work, {"PATH": "/usr/bin:/bin"})


def test_no_confinement_where_bubblewrap_cannot_run(tmp_path: Path) -> None:
    missing = confinement([tmp_path], program=str(tmp_path / "bwrap"))
    assert isinstance(missing, str)
    assert missing.startswith("bwrap cannot run")
    false = shutil.which("false")
    assert false is not None
    refused = confinement([tmp_path], program=false)
    assert isinstance(refused, str)
    assert refused.startswith("bwrap cannot make its namespaces")


# -- issue 53: what bwrap itself runs with, the PID namespace, the private /tmp ----------

PRELOAD_SOURCE = r"""
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
/* An owner's library: says where it was loaded, and copies the file GRAB names to
   stderr from wherever it runs. */
__attribute__((constructor)) static void grab(void) {
    char comm[64] = {0};
    int fd = open("/proc/self/comm", O_RDONLY);
    if (fd >= 0) { if (read(fd, comm, sizeof comm - 1) < 0) comm[0] = 0; close(fd); }
    dprintf(2, "preload-in:%s", comm);
    const char *target = getenv("GRAB");
    if (target == NULL) return;
    fd = open(target, O_RDONLY);
    if (fd < 0) { dprintf(2, "grab-denied\n"); return; }
    char buf[4096];
    ssize_t n = read(fd, buf, sizeof buf);
    if (n > 0 && write(2, buf, (size_t)n) < 0) return;
    close(fd);
}
"""


@pytest.fixture(scope="module")
def preload_library() -> Iterator[Path]:
    """The owner's LD_PRELOAD library, in a folder anyone may read outside /tmp (which
    jobs no longer share: the library must be where the job itself finds it too)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler (cc) to build the LD_PRELOAD library")
    folder = Path(tempfile.mkdtemp(prefix="cronlog-preload-", dir="/var/lib"))
    folder.chmod(0o755)
    (folder / "grab.c").write_text(PRELOAD_SOURCE)
    built = subprocess.run(
        [compiler, "-shared", "-fPIC", "-o", str(folder / "grab.so"), str(folder / "grab.c")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    (folder / "grab.so").chmod(0o755)
    try:
        yield folder / "grab.so"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _stderr_as_job(argv: list[str], cwd: Path, env: dict[str, str]) -> str:
    """stderr of `argv` run as the job's user with exactly `env` (no sandbox)."""
    done = subprocess.run(
        argv,
        cwd=cwd,
        user=NOBODY.pw_uid,
        group=NOBODY.pw_gid,
        extra_groups=[],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return done.stderr


def test_the_jobs_ld_preload_never_runs_in_bwrap(worker: Worker, preload_library: Path) -> None:
    """The job's environment is applied inside the sandbox only: its LD_PRELOAD runs in
    the job's own processes, where the journal is covered, never in bwrap, which starts
    before any namespace exists and sees every file of the worker's user."""
    made = confinement([worker.state, worker.token])
    assert isinstance(made, Confinement), made
    env = {"PATH": JOB_PATH, "LD_PRELOAD": str(preload_library), "GRAB": str(worker.journal)}
    sandbox = made.wrap(["true"], worker.work, env)
    try:
        done = subprocess.run(
            sandbox.argv,
            cwd=worker.work,
            user=NOBODY.pw_uid,
            group=NOBODY.pw_gid,
            extra_groups=[],
            env=sandbox.env,
            pass_fds=(sandbox.args_fd,),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    finally:
        sandbox.close()
    assert done.returncode == 0, done.stderr
    assert "preload-in:true" in done.stderr  # the library ran, in the job
    assert "grab-denied" in done.stderr
    assert "preload-in:bwrap" not in done.stderr
    assert "seal-of-another-run" not in done.stderr
    # The control, as the executor ran jobs before issue 53: bwrap started with the
    # job's environment, and the owner's library read the journal from bwrap.
    old = [made.program, "--dev-bind", "/", "/", "--tmpfs", str(worker.state)]
    old += ["--bind", str(worker.work), str(worker.work), "--", "true"]
    leaked = _stderr_as_job(old, worker.work, env)
    assert "preload-in:bwrap" in leaked
    assert "seal-of-another-run" in leaked


def test_the_jobs_environment_is_on_no_command_line(worker: Worker) -> None:
    """Every user may read every /proc/PID/cmdline: the job's values (its secrets among
    them) are handed to bwrap by descriptor, never as arguments."""
    made = confinement([worker.state])
    assert isinstance(made, Confinement), made
    value = f"VALUE-{os.getpid()}-{id(made)}"
    sandbox = made.wrap(
        ["sh", "-c", 'echo "$SECRET"; sleep 3'],
        worker.work,
        {
            "PATH": JOB_PATH,
            "SECRET": value,
        },
    )
    try:
        proc = subprocess.Popen(
            sandbox.argv,
            cwd=worker.work,
            user=NOBODY.pw_uid,
            group=NOBODY.pw_gid,
            extra_groups=[],
            env=sandbox.env,
            pass_fds=(sandbox.args_fd,),
            stdout=subprocess.PIPE,
            text=True,
        )
    finally:
        sandbox.close()
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == value  # the job has it
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    cmdline = (entry / "cmdline").read_bytes()
                except OSError:
                    continue
                assert value.encode() not in cmdline, f"{entry}: {cmdline!r}"
    finally:
        proc.kill()
        proc.wait()


def test_a_job_cannot_see_or_signal_processes_outside_its_sandbox(worker: Worker) -> None:
    """A process of the job's own user (another job, the executor of a worker that runs
    jobs as itself) is neither visible nor killable from the job; its parents neither.
    Without the sandbox the same job kills it."""
    made = confinement([worker.state])
    assert isinstance(made, Confinement), made
    bystander = subprocess.Popen(
        ["sleep", "60"], user=NOBODY.pw_uid, group=NOBODY.pw_gid, extra_groups=[]
    )
    killer = [
        "sh",
        "-c",
        f"kill -9 {bystander.pid} 2>/dev/null && echo killed || echo missed; "
        # and every ancestor it can find, as a job hunting its executor would
        'p=$PPID; while [ "$p" -gt 1 ]; do kill -9 $p 2>/dev/null; '
        "p=$(awk '/^PPid:/ {print $2}' /proc/$p/status 2>/dev/null || echo 0); done; "
        "echo processes=$(ls /proc | grep -c '^[0-9]')",
    ]
    try:
        seen = _as_job(killer, worker.work, made).split()
        assert seen[0] == "missed"
        assert int(seen[1].removeprefix("processes=")) <= 6  # init, sh, $(), ls, grep
        assert bystander.poll() is None
        # The control: the same job without the sandbox.
        assert _as_job([*killer[:2], killer[2].split(";")[0]], worker.work).split() == ["killed"]
        bystander.wait(5)
    finally:
        bystander.kill()
        bystander.wait()


def test_each_job_has_a_tmp_of_its_own(worker: Worker) -> None:
    """What one run leaves in /tmp (an LD_PRELOAD library, a rigged tool) a later run of
    the same user never sees; the job's working directory, under /tmp here, still
    shows through."""
    made = confinement([worker.state])
    assert isinstance(made, Confinement), made
    name = f"planted-{os.getpid()}"
    plant = ["sh", "-c", f"echo x > /tmp/{name} && echo planted; echo x > /dev/shm/{name}"]
    look = ["sh", "-c", f"ls /tmp/{name} /dev/shm/{name} 2>/dev/null | wc -l; pwd"]
    assert _as_job(plant, worker.work, made).split() == ["planted"]
    assert _as_job(look, worker.work, made).split() == ["0", str(worker.work)]
    assert not Path(f"/tmp/{name}").exists()


def test_a_jobs_private_tmpfs_has_a_size(worker: Worker) -> None:
    """A job cannot fill the host's RAM through its private /dev/shm (or /tmp): each
    tmpfs has a size, and a write past it fails with ENOSPC. Without `--size` a tmpfs
    may take half the machine's RAM."""
    made = confinement([worker.state])
    assert isinstance(made, Confinement), made
    small = Confinement(made.program, made.hidden, made.own_pids, tmpfs_bytes=1024 * 1024)
    assert str(1024 * 1024) in small.args()  # the executor is given the size
    fill = [
        "sh",
        "-c",
        "for d in /dev/shm /tmp; do "
        "head -c 2097152 /dev/zero > $d/fill 2>err; echo rc=$?; "
        "grep -c 'No space left' err; "
        "wc -c < $d/fill; done",
    ]
    seen = _as_job(fill, worker.work, small).split()
    # Each write cut at the size, with ENOSPC ("No space left on device").
    assert seen == ["rc=1", "1", str(1024 * 1024)] * 2, seen
    # The default: 64 MiB each, not half the RAM.
    sizes = _as_job(["sh", "-c", "df -k /dev/shm /tmp /var/tmp | tail -n +2"], worker.work, made)
    assert [line.split()[1] for line in sizes.splitlines()] == ["65536"] * 3, sizes


def test_an_environment_that_would_inject_options_is_refused(worker: Worker) -> None:
    made = confinement([worker.state])
    assert isinstance(made, Confinement), made
    forged = {"PATH": JOB_PATH, "X": f"a\0--bind\0{worker.state}\0/uncovered"}
    with pytest.raises(ValueError, match="NUL"):
        made.wrap(["true"], worker.work, forged)


def test_where_no_fresh_proc_is_allowed_the_covers_still_hold(worker: Worker) -> None:
    """A host that refuses a fresh /proc (some containers) gets the sandbox without its
    PID namespace: the covers and the private /tmp hold, and the executor is told."""
    made = confinement([worker.state, worker.token])
    assert isinstance(made, Confinement), made
    shared = Confinement(made.program, made.hidden, own_pids=False)
    assert "--bwrap-shared-pids" in shared.args()
    assert "--bwrap-shared-pids" not in made.args()
    seen = _as_job(_probe(worker), worker.work, shared).split()
    assert seen == ["journal-hidden", "token-hidden", "cover-held", "mine"]
    sandbox = shared.wrap(["true"], worker.work, {"PATH": JOB_PATH})
    sandbox.close()
    assert "--unshare-pid" not in sandbox.argv
    assert "--tmpfs" in sandbox.argv

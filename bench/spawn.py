"""Spawn: what one start of a job process costs, by the ways a worker can start it.

No Kafka. N starts, one after the other, of `sh -c 'echo hi'` with its stdout appended to
a file of its own, through:

  a. supervise   `python -m connectors.supervise ... -- sh -c ...`: the per-run Python
                 supervisor the worker started every run through (as the worker did:
                 start_new_session, cwd the run folder, a lease file, --start-at-ms);
  b. popen       subprocess.Popen(start_new_session=True): CPython's vfork path;
  c. popen-rlimit  Popen with a preexec_fn that sets RLIMIT_AS: forces fork + exec;
  d. posix_spawn os.posix_spawn(setsid=True), stdout opened by a file action;
  e. zygote      a forked Python helper that, per request on a pipe, os.fork()s and
                 execs the job, and answers with its exit status.

For each: wall ms per start (until the job, or the supervisor, has exited and been
reaped), the parent's CPU ms per start (this process: what a worker's own loop would
pay), the children's CPU ms per start (the job itself, plus the supervisor or the zygote),
and starts/s one after the other. `python -m bench.spawn --starts 1000` (`--quick`: 200).

connectors/supervise.py may be gone from the work tree (the executor that replaced it does
not need it); then its last committed version is read from git (`--supervise-rev`).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import percentile, report, table

ROOT = Path(__file__).resolve().parents[1]
JOB = ["sh", "-c", "echo hi"]
RLIMIT_AS_BYTES = 1 << 30
WARMUP = 5
SUPERVISE = Path("connectors") / "supervise.py"

Starter = Callable[[int], None]  # start job number i and wait for it


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return done.stdout if done.returncode == 0 else ""


def supervise_path(workdir: Path, rev: str | None) -> tuple[Path, str]:
    """A folder to put on PYTHONPATH so that `-m connectors.supervise` finds the module,
    and where it came from."""
    if rev is None and (ROOT / SUPERVISE).exists():
        return ROOT, f"work tree ({ROOT / SUPERVISE})"
    candidates = [rev] if rev else ["HEAD"]
    if not rev:
        last = _git("rev-list", "-n", "1", "HEAD", "--", str(SUPERVISE)).strip()
        if last:
            candidates += [last, f"{last}^"]  # the last change, or before its deletion
    for candidate in candidates:
        source = _git("show", f"{candidate}:{SUPERVISE}")
        if source:
            package = workdir / "supervise-src" / "connectors"
            package.mkdir(parents=True, exist_ok=True)
            (package / "__init__.py").write_text("")
            (package / "supervise.py").write_text(source)
            commit = _git("rev-parse", "--short", candidate).strip()
            return package.parent, f"git {candidate} ({commit})"
    raise SystemExit("connectors/supervise.py is neither in the work tree nor in git history")


def supervise_starter(workdir: Path, source: Path) -> Starter:
    lease = workdir / "lease"
    lease.write_text(f"{int(time.time() * 1000) + 24 * 3600 * 1000}\n")
    env = {**os.environ, "PYTHONPATH": str(source), "CRONLOG_RUN_ID": "bench"}

    def start(i: int) -> None:
        run_dir = workdir / "runs" / str(i)
        run_dir.mkdir(parents=True)
        argv = [
            sys.executable,
            "-m",
            "connectors.supervise",
            "--run-dir",
            str(run_dir),
            "--lease-file",
            str(lease),
            "--timeout-s",
            "3600.0",
            "--grace-s",
            "1.0",
            "--start-at-ms",
            str(int(time.time() * 1000)),
            "--",
            *JOB,
        ]
        with open(run_dir / "supervisor.log", "ab") as err:
            proc = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=err,
                start_new_session=True,
                cwd=run_dir,
            )
        if proc.wait() != 0:
            raise RuntimeError(f"supervise failed: {(run_dir / 'supervisor.log').read_text()}")

    return start


def popen_starter(workdir: Path, rlimit: bool) -> Starter:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (RLIMIT_AS_BYTES, RLIMIT_AS_BYTES))

    def start(i: int) -> None:
        with open(workdir / f"{i}.out", "ab") as out:
            proc = subprocess.Popen(
                JOB,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=limit if rlimit else None,  # forces fork: the point here
            )
        if proc.wait() != 0:
            raise RuntimeError("the job failed")

    return start


def posix_spawn_starter(workdir: Path) -> Starter:
    sh = shutil.which(JOB[0])
    assert sh is not None
    env = dict(os.environ)

    def start(i: int) -> None:
        pid = os.posix_spawn(
            sh,
            JOB,
            env,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (
                    os.POSIX_SPAWN_OPEN,
                    1,
                    str(workdir / f"{i}.out"),
                    os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                    0o644,
                ),
                (os.POSIX_SPAWN_DUP2, 1, 2),
            ],
            setsid=True,
        )
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError("the job failed")

    return start


def burst_floor(command: list[str], n: int, parallel: int, workdir: Path) -> list[float]:
    """What fork/exec alone allows for a burst: `n` starts of `command` (stdout to a file
    each, made beforehand, as the executor does), shared by `parallel` forked starters
    that each start theirs as fast as posix_spawn goes, reaping as they go, with nothing
    else of cronlog running. Returns each start's offset from the common start, in
    seconds, sorted: a burst's start lateness can be no better than these."""
    program = shutil.which(command[0])
    assert program is not None
    env = dict(os.environ)
    # The output files exist before the clock starts: fork/exec alone is timed, as the
    # executor makes a run's directory and files ahead of its start (engine.py).
    for i in range(n):
        (workdir / f"f{i}.out").touch()
    t0 = time.time() + 0.2  # every starter forked before the first start
    parts = []
    for k in range(parallel):
        out = workdir / f"floor-{k}.txt"
        parts.append(out)
        if os.fork() == 0:  # a starter: its share, then its offsets to `out`
            try:
                offsets = []
                running = 0
                while time.time() < t0:
                    time.sleep(0.001)
                for i in range(k, n, parallel):
                    offsets.append(time.time() - t0)
                    os.posix_spawn(
                        program,
                        command,
                        env,
                        file_actions=[
                            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                            (
                                os.POSIX_SPAWN_OPEN,
                                1,
                                str(workdir / f"f{i}.out"),
                                os.O_WRONLY | os.O_CREAT,
                                0o644,
                            ),
                            (os.POSIX_SPAWN_DUP2, 1, 2),
                        ],
                        setsid=True,
                    )
                    running += 1
                    while running and os.waitpid(-1, os.WNOHANG)[0]:
                        running -= 1
                while running:
                    os.waitpid(-1, 0)
                    running -= 1
                out.write_text("\n".join(f"{o:.6f}" for o in offsets))
            finally:
                os._exit(0)
    for _ in range(parallel):
        os.wait()
    return sorted(float(x) for out in parts for x in out.read_text().split())


# The zygote: a small Python started once (stdlib only, as a worker would start it at
# boot, before it has grown); per request line `path`, it forks, and the child starts a
# session and execs the job with stdout and stderr to path. It answers with the exit code.
ZYGOTE = """
import os, sys
job = sys.argv[1:]
requests, replies = sys.stdin.buffer, sys.stdout.buffer
while line := requests.readline():
    child = os.fork()
    if child == 0:
        try:
            os.setsid()
            null = os.open(os.devnull, os.O_RDONLY)
            out = os.open(line.rstrip(b"\\n"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(null, 0)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.closerange(3, 256)
            os.execvp(job[0], job)
        finally:
            os._exit(127)
    _, status = os.waitpid(child, 0)
    replies.write(b"%d\\n" % os.waitstatus_to_exitcode(status))
    replies.flush()
"""


class Zygote:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-c", ZYGOTE, *JOB],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.requests, self.replies = self.proc.stdin, self.proc.stdout

    def start(self, path: Path) -> int:
        self.requests.write(bytes(path) + b"\n")
        self.requests.flush()
        return int(self.replies.readline())

    def close(self) -> None:
        self.requests.close()
        self.proc.wait(10)  # its CPU (and its jobs') now counts as the children's
        self.replies.close()


def zygote_starter(zygote: Zygote, workdir: Path) -> Starter:
    def start(i: int) -> None:
        if zygote.start(workdir / f"{i}.out") != 0:
            raise RuntimeError("the job failed")

    return start


def measure(
    name: str, start: Starter, n: int, finish: Callable[[], None] | None = None
) -> dict[str, object]:
    """`finish` runs after the parent's CPU is read and before the children's is (the
    zygote is reaped there, so its CPU counts as the children's)."""
    for i in range(WARMUP):
        start(-1 - i)
    walls: list[float] = []
    self_before = resource.getrusage(resource.RUSAGE_SELF)
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    for i in range(n):
        t = time.perf_counter()
        start(i)
        walls.append((time.perf_counter() - t) * 1000)
    elapsed = time.perf_counter() - began
    self_after = resource.getrusage(resource.RUSAGE_SELF)
    if finish is not None:
        finish()
    children_after = resource.getrusage(resource.RUSAGE_CHILDREN)

    def cpu_ms(after: resource.struct_rusage, before: resource.struct_rusage) -> float:
        return 1000 * (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / n

    return {
        "method": name,
        "ms_per_start": 1000 * elapsed / n,
        "p50_ms": percentile(walls, 0.5),
        "p99_ms": percentile(walls, 0.99),
        "parent_cpu_ms": cpu_ms(self_after, self_before),
        "children_cpu_ms": cpu_ms(children_after, children_before),
        "starts_per_s": n / elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--starts", type=int, default=1000)
    parser.add_argument("--quick", action="store_true", help="200 starts")
    parser.add_argument(
        "--supervise-rev", default=None, help="take connectors/supervise.py from this git rev"
    )
    parser.add_argument("--only", default="", help="comma-separated methods (default: all of them)")
    args = parser.parse_args()
    n = 200 if args.quick else args.starts
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="bench-spawn-") as tmp:
        workdir = Path(tmp)
        source, origin = supervise_path(workdir, args.supervise_rev)
        methods: dict[str, Callable[[Path], Starter]] = {
            "a. supervise": lambda d: supervise_starter(d, source),
            "b. popen": lambda d: popen_starter(d, rlimit=False),
            "c. popen-rlimit": lambda d: popen_starter(d, rlimit=True),
            "d. posix_spawn": posix_spawn_starter,
        }
        only = {m.strip() for m in args.only.split(",") if m.strip()}
        for name, make in methods.items():
            if only and name.split(". ")[1] not in only and name[0] not in only:
                continue
            folder = workdir / name.split(". ")[1]
            folder.mkdir()
            rows.append(measure(name, make(folder), n))
            print(f"{name}: {rows[-1]['ms_per_start']:.3f} ms per start", flush=True)
        if not only or "zygote" in only or "e" in only:
            folder = workdir / "zygote"
            folder.mkdir()
            zygote = Zygote()
            rows.append(measure("e. zygote", zygote_starter(zygote, folder), n, zygote.close))
    table(f"spawn: {n} starts of {' '.join(JOB)!r} each, one after the other", rows)
    report(
        "spawn",
        {
            "starts": n,
            "job": " ".join(JOB),
            "supervise_from": origin,
            "python": sys.executable,
            "methods": rows,
        },
    )


if __name__ == "__main__":
    main()

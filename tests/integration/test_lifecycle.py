"""No orphans: every cronlog process dies with its supervisor and stops within a bound.

Real processes throughout: `cronlog run` (with a private state folder, on the module's
topics and database) and its whole process tree (the node's ledger process, the workers'
executors and the jobs they run), found through /proc."""

from __future__ import annotations

import fcntl
import os
import select
import signal
import subprocess
import sys
import termios
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from streams.settings import Settings
from tests.support.nodes import ROOT, Node, env_for
from tests.support.ports import free_port
from tests.support.waiting import eventually, until_passes

CLI = [sys.executable, "-m", "connectors.cli"]
JOB_MARK = "613"  # `sleep 613`: the long job the demo below runs, found by its argv
# After the supervisor dies: its components at once (SIGKILL from the kernel); the jobs
# once their worker's lease (7 s) has expired and its executor fenced them.
GONE_WITHIN_S = 60


# -- the process tree, from /proc ------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    pid: int
    start: int  # start time in clock ticks: tells a reused pid apart
    argv: str


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(ppid, state, start time) of a process, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return int(fields[1]), fields[0], int(fields[19])


def _argv(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def descendants(root: int) -> list[Proc]:
    """Every live process below `root` (children, grandchildren, ...)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None:
                children.setdefault(stat[0], []).append(int(entry.name))
    found: list[Proc] = []
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        stat = _stat(pid)
        if stat is not None and stat[1] != "Z":
            found.append(Proc(pid, stat[2], _argv(pid)))
        todo.extend(children.get(pid, []))
    return found


def alive(proc: Proc) -> bool:
    stat = _stat(proc.pid)
    return stat is not None and stat[1] != "Z" and stat[2] == proc.start


def catches(pid: int, sig: signal.Signals) -> bool:
    """Whether `pid` has a handler for `sig` (its SigCgt mask in /proc)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:  # gone
        return False
    for line in lines:
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


def tree_complete(root: int, jobs: bool = True) -> list[Proc] | None:
    """The tree once every part runs: the five components, the node's ledger process,
    both workers' executors and (with `jobs`) at least one run of the long job."""
    procs = descendants(root)
    argvs = [p.argv for p in procs]
    parts = [
        sum("connectors.cli scheduler" in a for a in argvs) == 1,
        sum("connectors.cli worker" in a for a in argvs) == 2,
        sum("connectors.cli projector" in a for a in argvs) == 1,
        sum("connectors.cli api" in a for a in argvs) == 1,
        any("multiprocessing.spawn" in a for a in argvs),  # the node's ledger
        sum("connectors.worker.engine" in a for a in argvs) == 2,
        not jobs or any(a == f"sleep {JOB_MARK}" for a in argvs),
    ]
    return procs if all(parts) else None


def still_alive(procs: list[Proc]) -> list[str]:
    return [f"{p.pid} {p.argv}" for p in procs if alive(p)]


def all_gone(procs: list[Proc], what: str, timeout_s: float) -> None:
    """Every process of `procs` ends within `timeout_s`; else fail, naming the living."""

    def gone() -> None:
        living = still_alive(procs)
        assert not living, f"{what}: still alive: {living}"

    until_passes(gone, timeout_s, interval_s=0.3)


# -- `cronlog run` -----------------------------------------------------------------------


def run_argv(port: int, demo: Path) -> list[str]:
    return [
        *CLI,
        "run",
        "--no-stack",
        "--api-port",
        str(port),
        "--loglevel",
        "warning",
        "--demo",
        str(demo),
    ]


def long_job_demo(tmp_path: Path) -> Path:
    """One job that runs for ten minutes, started every 10 s: jobs run while we kill."""
    demo = tmp_path / "long.yaml"
    job = {
        "job_id": "long-sleeper",
        "schedule": {"every": "10s"},
        "command": ["sleep", JOB_MARK],
        "resources": {"cpu": 0.1, "memory_mb": 64},
    }
    demo.write_text(yaml.safe_dump({"jobs": [job]}))
    return demo


def run_env(topics: Settings, state: Path) -> dict[str, str]:
    return {**env_for(topics), "CRONLOG_STATE_DIR": str(state)}


class Terminal:
    """A pseudo-terminal that `cronlog run` has as its controlling terminal, as in a
    shell; closing it is closing the terminal window: the kernel sends SIGHUP."""

    def __init__(self) -> None:
        self.master, self.slave = os.openpty()
        self.output = bytearray()
        self.reading = True
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while self.reading:
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if ready:
                try:
                    self.output += os.read(self.master, 65536)
                except OSError:
                    return

    def start(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        def controlling_terminal() -> None:  # runs in the child, after setsid
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env,
            stdin=self.slave,
            stdout=self.slave,
            stderr=self.slave,
            start_new_session=True,
            preexec_fn=controlling_terminal,
        )
        os.close(self.slave)
        return proc

    def text(self) -> str:
        return self.output.decode(errors="replace")

    def close(self) -> None:
        self.reading = False
        self.reader.join(5)
        os.close(self.master)


def kill_tree(procs: list[Proc], proc: subprocess.Popen[bytes]) -> None:
    """Clean up after a failed test: nothing of ours stays behind."""
    if proc.poll() is None:
        proc.kill()
    for p in procs:
        if alive(p):
            os.kill(p.pid, signal.SIGKILL)
    proc.wait(10)


def test_closing_the_terminal_stops_everything_and_a_second_run_is_refused(
    topics: Settings, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    env = run_env(topics, state)
    terminal = Terminal()
    proc = terminal.start(run_argv(free_port(), long_job_demo(tmp_path)), env)
    procs: list[Proc] = []
    try:
        procs = eventually(lambda: tree_complete(proc.pid), "every component and a job", 180)

        # A second `cronlog run` on the same state folder: refused, and says by whom.
        second = subprocess.run(
            run_argv(free_port(), long_job_demo(tmp_path)),
            cwd=ROOT,
            env=env,
            capture_output=True,
            timeout=120,
        )
        said = second.stderr.decode()
        assert second.returncode != 0, said
        assert "already running" in said, said
        assert f"pid {proc.pid}" in said, said
        assert f"kill {proc.pid}" in said, said
        assert "started (pid" not in said, said
        assert tree_complete(proc.pid) is not None  # the first one was left alone

        procs = descendants(proc.pid)  # the newest jobs too
        began = time.monotonic()
        terminal.close()  # the terminal goes away: SIGHUP to its session
        code = proc.wait(GONE_WITHIN_S)
        assert code == 0, terminal.text()[-3000:]
        all_gone(procs, "the tree", GONE_WITHIN_S)
        print(f"SIGHUP: {len(procs)} processes gone in {time.monotonic() - began:.1f} s")
    finally:
        if terminal.reading:
            terminal.close()
        kill_tree(procs, proc)


def test_sigkill_of_the_supervisor_takes_every_component_down(
    topics: Settings, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    out = tmp_path / "run.out"
    with open(out, "wb") as sink:
        proc = subprocess.Popen(
            run_argv(free_port(), long_job_demo(tmp_path)),
            cwd=ROOT,
            env=run_env(topics, state),
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    procs: list[Proc] = []
    try:
        eventually(lambda: tree_complete(proc.pid), "every component and a job", 180)
        procs = descendants(proc.pid)
        began = time.monotonic()
        proc.kill()  # SIGKILL: the supervisor stops nothing itself
        proc.wait(10)
        components = [p for p in procs if "connectors.cli" in p.argv or "spawn" in p.argv]
        all_gone(components, "the components", 10)
        print(f"SIGKILL: components gone in {time.monotonic() - began:.1f} s")
        all_gone(procs, "the tree", GONE_WITHIN_S)
        print(f"SIGKILL: {len(procs)} processes gone in {time.monotonic() - began:.1f} s")
        # The lock died with its holder: a new `cronlog run` could start at once.
        with open(state / "run.lock", "a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        kill_tree(procs, proc)


def test_a_component_that_does_not_stop_is_killed_with_its_group(
    topics: Settings, tmp_path: Path
) -> None:
    """The supervisor's stop escalates: SIGTERM, then SIGKILL of the component's whole
    process group (the node and its ledger) once the bound has passed."""
    out = tmp_path / "run.out"
    env = {**run_env(topics, tmp_path / "state"), "CRONLOG_STOP_TIMEOUT_S": "2"}
    with open(out, "wb") as sink:
        proc = subprocess.Popen(
            [*run_argv(free_port(), long_job_demo(tmp_path)), "--no-demo"],
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    procs: list[Proc] = []
    try:
        procs = eventually(lambda: tree_complete(proc.pid, jobs=False), "every component", 180)
        node = next(p for p in procs if "connectors.cli scheduler" in p.argv)
        # Once it handles SIGTERM (the node's handler), a stopped node keeps it pending; it
        # cannot stop. (Without a handler the kernel would kill it, stopped or not.)
        eventually(lambda: catches(node.pid, signal.SIGTERM), "the node's signal handlers", 120)
        os.kill(node.pid, signal.SIGSTOP)
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(GONE_WITHIN_S)
        took = time.monotonic() - began
        said = out.read_text()
        print(f"escalation: supervisor exited {code} after {took:.1f} s (bound 2 + 10 s)")
        assert code == 0, said[-3000:]
        assert "scheduler did not stop in 12 s; killing it" in said, said[-3000:]
        assert took >= 12
        all_gone(procs, "the tree", GONE_WITHIN_S)
    finally:
        kill_tree(procs, proc)


# -- the stop watchdog, on a process whose stop hangs -----------------------------------


def test_a_node_whose_stop_hangs_still_stops_within_the_bound(
    topics: Settings, tmp_path: Path
) -> None:
    """A real scheduler node, stopped by its signal handling, whose ledger process
    cannot be stopped (SIGSTOPped): the node would wait for it; its watchdog ends it
    within the bound, and the ledger dies with it."""
    node = Node(topics, "wedged", tmp_path, {"CRONLOG_STOP_TIMEOUT_S": "3"}).start()
    assert node.proc is not None
    pid = node.proc.pid
    ledger: list[Proc] = []
    try:
        # The node handles SIGTERM once its loops are started.
        eventually(lambda: catches(pid, signal.SIGTERM), "the node's signal handlers", 120)
        ledger = eventually(
            lambda: [p for p in descendants(pid) if "multiprocessing.spawn" in p.argv],
            "the ledger process",
        )
        # Its SIGTERM handler is set right after it asked to die with its parent: from
        # then on it cannot outlive the node. (Before, it is still importing; a node that
        # dies then is noticed by the same call: the ledger exits when it gets there.)
        eventually(lambda: catches(ledger[0].pid, signal.SIGTERM), "the ledger's start", 120)
        os.kill(ledger[0].pid, signal.SIGSTOP)  # it will not stop when the node asks
        began = time.monotonic()
        node.signal(signal.SIGTERM)
        code = node.proc.wait(60)
        took = time.monotonic() - began
        said = node.log.read_text()
        print(f"wedged node: exit {code} after {took:.1f} s (bound 3 s)")
        assert code == 70, said[-3000:]
        assert "did not stop within 3 s of SIGTERM" in said
        all_gone(ledger, "the ledger, with its node", 10)
    finally:
        for p in ledger:
            if alive(p):
                os.kill(p.pid, signal.SIGKILL)
        node.stop()


@pytest.mark.parametrize(
    ("mode", "sig"),
    [("plain", signal.SIGTERM), ("interrupt", signal.SIGINT)],
)
@pytest.mark.parametrize("how", ["none", "released", "held"])
def test_a_stop_that_hangs_is_bounded(
    mode: str, sig: signal.Signals, how: str, tmp_path: Path
) -> None:
    bound_s = 2.0
    out = tmp_path / "out"
    with open(out, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.hanging_stop", mode, how],
            cwd=ROOT,
            env={**os.environ, "CRONLOG_STOP_TIMEOUT_S": str(bound_s)},
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        eventually(lambda: "ready" in out.read_text(), "the process to be ready", 60)
        began = time.monotonic()
        proc.send_signal(sig)
        code = proc.wait(60)
        took = time.monotonic() - began
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    said = out.read_text()
    print(f"{mode}/{how}: exit {code} after {took:.2f} s (bound {bound_s} s)")
    if how == "none":  # a stop that does not hang ends by itself, before the watchdog
        assert code == 0, said
        assert "did not stop" not in said
    elif how == "released":  # the watchdog's thread ends it, and says why
        assert code == 70, said
        assert f"did not stop within 2 s of {sig.name}" in said
        assert took >= bound_s
    else:  # no Python thread can run: the kernel's alarm ends it, 5 s later
        assert code == -signal.SIGALRM, said
        assert took >= bound_s + 5

"""`cronlog run`: everything on one machine under one supervisor (for `make run`).

A node, two workers, the projector, the notifier and the API run as child
processes, each logging to ``<state>/logs/<name>.log``. A child that exits on its own is
reported and restarted (backing off up to 30 s when it keeps crashing). Ctrl-C, SIGTERM or SIGHUP
(the terminal closed) stops them all: SIGTERM, then SIGKILL of each one's process group
once the stop bound has passed. Jobs of a demo file are registered once the projection
database is reachable.

No component outlives the supervisor: each is started with PR_SET_PDEATHSIG
(streams/lifecycle.py), so the kernel SIGKILLs it when the supervisor dies, SIGKILL
included. Children are started from the main thread only: the kernel sends that signal
when the *thread* that forked the child ends.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from connectors import safe_yaml
from connectors.api.service import ADMIN, Service, ServiceError
from connectors.private_files import write_private
from streams.lifecycle import die_with_parent_preexec
from streams.settings import Settings

MAX_BACKOFF_S = 30.0
STABLE_S = 60.0  # a child that ran this long is healthy again: the backoff resets


@dataclass
class Child:
    name: str
    args: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    restarts: int = 0
    backoff_s: float = 1.0
    due: float = 0.0  # when to restart after a crash
    out: IO[bytes] | None = field(default=None, repr=False)

    def start(self, env: dict[str, str]) -> None:
        if self.out is None:
            self.log.parent.mkdir(parents=True, exist_ok=True)
            self.out = open(self.log, "ab")  # noqa: SIM115 - open for the child's life
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "connectors.cli", *self.args],
            stdout=self.out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # Ctrl-C reaches the supervisor only: it stops them
            preexec_fn=die_with_parent_preexec(),  # and they die with it, whatever kills it
        )
        self.started = time.monotonic()


def token_file(state: Path) -> Path:
    """Tokens for the local API, made once: an admin token, the demo owner's and one for
    an HTTP worker named local-http."""
    path = state / "api-tokens.yaml"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "admin": [secrets.token_urlsafe(24)],
            "owners": {secrets.token_urlsafe(24): "demo"},
            "workers": {secrets.token_urlsafe(24): "local-http"},
        }
        # 0600 from its creation, never written then chmod-ed (connectors/private_files.py)
        write_private(path, yaml.safe_dump(doc))
    else:
        # Made by an earlier version, its worker token acted as any worker ("*"), which
        # the API now refuses: bind it to the one worker it stands for here.
        doc = safe_yaml.load_file(path) or {}
        workers = doc.get("workers") if isinstance(doc, dict) else None
        if isinstance(workers, dict) and "*" in workers.values():
            doc["workers"] = {t: "local-http" if w == "*" else w for t, w in workers.items()}
            write_private(path, yaml.safe_dump(doc))
        elif path.stat().st_mode & 0o077:  # an earlier version's file: no one else's
            path.chmod(0o600)
    return path


def register_demo(settings: Settings, demo: Path, say: Callable[[str], None]) -> int:
    """Register (create or replace) the demo's jobs; how many were registered."""
    docs = safe_yaml.load_file(demo) or {}
    service = Service(settings, wait_s=0.0)
    service.open()
    done = 0
    try:
        for job in docs.get("jobs", []):
            deadline = time.monotonic() + 60
            while True:
                try:
                    # The demo's upstreams are its own jobs, registered in this loop
                    # (wait_s=0: not yet projected when the next names them).
                    doc = {"owner": docs.get("owner", "demo"), **job}
                    service.put_job(ADMIN, doc, allow_missing_upstreams=True)
                    done += 1
                    break
                except ServiceError as exc:
                    if exc.status < 500 or time.monotonic() > deadline:
                        say(f"demo job {job.get('job_id')} not registered: {exc.message}")
                        break
                    time.sleep(1)
    finally:
        service.close()
    return done


class Supervisor:
    def __init__(
        self,
        children: list[Child],
        env: dict[str, str],
        say: Callable[[str], None],
        stop_bound_s: float = 30.0,
    ):
        self.children = children
        self.env = env
        self._say = say
        self.stop_bound_s = stop_bound_s  # SIGTERM, then SIGKILL of the group after this
        self.stopping = threading.Event()

    def say(self, message: str) -> None:
        # After SIGHUP the terminal is gone and writing to it fails (EIO): stopping the
        # components matters more than telling a terminal nobody reads.
        with contextlib.suppress(OSError):
            self._say(message)

    def stop(self, *_: Any) -> None:
        self.stopping.set()

    def run(self, on_started: Callable[[], None] | None = None) -> None:
        for child in self.children:
            child.start(self.env)
            pid = child.proc.pid if child.proc else "?"
            self.say(f"{child.name} started (pid {pid}), log {child.log}")
        if on_started is not None:
            threading.Thread(target=on_started, daemon=True).start()
        try:
            while not self.stopping.wait(0.5):
                self._watch()
        finally:
            self._stop_all()

    def _watch(self) -> None:
        now = time.monotonic()
        for child in self.children:
            assert child.proc is not None
            code = child.proc.poll()
            if code is None:
                if now - child.started > STABLE_S:
                    child.backoff_s = 1.0
                continue
            if child.due == 0.0:
                child.due = now + child.backoff_s
                self.say(
                    f"{child.name} exited with status {code}; restarting in "
                    f"{child.backoff_s:.0f} s (see {child.log})"
                )
            elif now >= child.due:
                child.restarts += 1
                child.backoff_s = min(child.backoff_s * 2, MAX_BACKOFF_S)
                child.due = 0.0
                child.start(self.env)
                self.say(f"{child.name} restarted (restart {child.restarts})")

    def _stop_all(self) -> None:
        self.say("stopping every component")
        live = [c for c in self.children if c.proc is not None and c.proc.poll() is None]
        for child in live:
            assert child.proc is not None
            child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_bound_s
        for child in live:
            assert child.proc is not None
            try:
                child.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.say(f"{child.name} did not stop in {self.stop_bound_s:g} s; killing it")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.proc.wait(10)  # one in uninterruptible sleep: left to the kernel
        for child in self.children:
            if child.out is not None:
                child.out.close()
        self.say("stopped")


def jobs_user() -> list[str]:
    """As root, the demo's workers run jobs as `nobody` (never as root by default);
    `--allow-root` only where no such user exists. As anyone else, as that user."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        return ["--allow-root"]
    return ["--run-as", "nobody"]


def components(
    state: Path, lead_s: float, api_port: int, loglevel: str, metrics_port: int | None = None
) -> list[Child]:
    """The children of `cronlog run`. With `metrics_port` P each serves its metrics on a
    port of its own: the node P (its ledger P + 1), the workers P + 10 and P + 11, the
    projector P + 20, the notifier P + 21 (compose/prometheus/prometheus.yml scrapes
    these); the API serves
    /metrics on its own port."""
    cpus = os.cpu_count() or 1
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (4 * 1024 * 1024)
    logs = state / "logs"
    level = ["--loglevel", loglevel]

    def port(offset: int) -> list[str]:
        return [] if metrics_port is None else ["--metrics-port", str(metrics_port + offset)]

    scheduler = ["scheduler", "--node-id", "local", "--lead-s", str(lead_s), *level, *port(0)]
    children = [Child("scheduler", scheduler, logs / "scheduler.log")]
    for n in (1, 2):
        worker = ["worker", "--id", f"local-{n}", "--cpu", str(cpus), "--memory-mb", str(memory)]
        worker += jobs_user()
        children.append(
            Child(f"worker local-{n}", [*worker, *level, *port(9 + n)], logs / f"worker-{n}.log")
        )
    children.append(Child("projector", ["projector", *level, *port(20)], logs / "projector.log"))
    children.append(Child("notifier", ["notifier", *level, *port(21)], logs / "notifier.log"))
    api = ["api", "--port", str(api_port), "--loglevel", loglevel]
    children.append(Child("api", api, logs / "api.log"))
    return children

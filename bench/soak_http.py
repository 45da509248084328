"""A worker over HTTP for the soak (bench/soak.py): what a worker written in another
language does, by the protocol README.md describes ("A worker in another language joins
over HTTP"), as its own process so the nemesis can kill it like any other.

Every second a heartbeat (capacity, labels, what it holds, `ack` of the last answer);
the answer's messages in seq order: an assignment is claimed (`/runs/{id}/ack` with its
placement), a granted claim is started at its time (`/started`), its exit reported
(`/finished`); a stop order kills a started attempt or releases one not started. Like
the native worker it fences itself: with no heartbeat acknowledged for `LEASE_S` it kills
what it runs, since by then the ledger may place those runs elsewhere. Reports are
retried until the API takes them (an API restarted in between). A journal (one line per
grant, start and end) lets a restarted worker account for what its killed predecessor
held, as the native worker's does: a granted attempt never started is released, one
started is killed (its process group) and reported finished.

    python -m bench.soak_http API_URL WORKER_ID TOKEN CPU JOURNAL
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

LEASE_S = 7.0  # under the native worker's 8 s lease: fenced before it may be replaced
BEAT_S = 1.0


@dataclass
class Held:
    dispatch: dict[str, Any]
    granted: bool = False
    proc: subprocess.Popen[bytes] | None = None
    done: bool = False
    timer: threading.Timer | None = field(default=None, repr=False)


class HttpWorker:
    def __init__(self, url: str, worker_id: str, token: str, cpu: float, journal: Path):
        self.client = httpx.Client(
            base_url=url, timeout=10, headers={"Authorization": f"Bearer {token}"}
        )
        self.worker_id = worker_id
        self.cpu = cpu
        self.held: dict[tuple[str, int], Held] = {}
        self.lock = threading.Lock()
        self.acked = 0
        self.last_ok = time.monotonic()
        self.stopping = threading.Event()
        self.journal_path = journal
        self.outbox: queue.Queue[tuple[str, str, dict[str, Any]]] = queue.Queue()
        threading.Thread(target=self.send_reports, daemon=True).start()

    # -- the journal ---------------------------------------------------------------------
    def recover(self) -> None:
        """What the previous process of this worker held and never finished."""
        held: dict[tuple[str, int], list[str]] = {}
        try:
            lines = self.journal_path.read_text().splitlines()
        except OSError:
            lines = []
        for line in lines:
            parts = line.split()
            if len(parts) != 5:
                continue  # torn by the kill
            edge, run_id, number, placement, pgid = parts
            key = (run_id, int(number))
            if edge == "done":
                held.pop(key, None)
            else:
                held[key] = [edge, placement, pgid]
        for (run_id, attempt), (edge, placement, pgid) in held.items():
            body = {"attempt": attempt, "placement": placement}
            if edge == "granted":
                self.report(run_id, "released", {**body, "reason": "worker restarted"})
            else:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.killpg(int(pgid), signal.SIGKILL)
                self.report(run_id, "finished", {**body, "exit_code": -9})
        self.journal = open(self.journal_path, "w")  # noqa: SIM115 - kept open for the process

    def note(self, edge: str, key: tuple[str, int], placement: str, pgid: int = 0) -> None:
        self.journal.write(f"{edge} {key[0]} {key[1]} {placement} {pgid}\n")
        self.journal.flush()

    # -- the heartbeat loop --------------------------------------------------------------
    def run(self) -> None:
        while not self.stopping.is_set():
            started = time.monotonic()
            self.beat()
            if time.monotonic() - self.last_ok > LEASE_S:
                self.fence()
            self.stopping.wait(max(0.0, BEAT_S - (time.monotonic() - started)))

    def beat(self) -> None:
        with self.lock:
            running = [
                {"run_id": run_id, "attempt": attempt}
                for (run_id, attempt), h in self.held.items()
                if h.granted and not h.done
            ]
        body = {
            "capacity": {"cpu": self.cpu, "memory_mb": 4096},
            "labels": {"via": "http"},
            "running": running,
            "ack": self.acked,
        }
        try:
            answer = self.client.post(f"/workers/{self.worker_id}/heartbeat", json=body)
        except httpx.HTTPError:
            return
        if answer.status_code != 200:
            return
        self.last_ok = time.monotonic()
        doc = answer.json()
        items = sorted(
            (item["seq"], kind, item)
            for kind in ("assignments", "grants", "kills")
            for item in doc.get(kind, [])
        )
        for _, kind, item in items:
            getattr(self, f"on_{kind}")(item)
        self.acked = max(self.acked, int(doc.get("seq", self.acked)))

    # -- messages ------------------------------------------------------------------------
    def on_assignments(self, d: dict[str, Any]) -> None:
        key = (d["run_id"], int(d["attempt"]))
        with self.lock:
            known = self.held.get(key)
            # A repeat is claimed already; the same attempt assigned again after this
            # worker released it is a new placement, claimed anew.
            if known is not None and not (known.done and known.proc is None):
                return
            if known is not None and known.dispatch.get("placement") == d.get("placement"):
                return
            self.held[key] = Held(d)
        self.report(d["run_id"], "ack", {"attempt": key[1], "placement": d["placement"]})

    def on_grants(self, g: dict[str, Any]) -> None:
        key = (g["run_id"], int(g["attempt"]))
        with self.lock:
            held = self.held.get(key)
            if held is None and g["granted"]:
                # Granted to a process of this worker that was killed before it noted
                # the grant: released, or the ledger waits for it until the timeout.
                self.report(key[0], "released", _release(key, g))
                return
            if held is None or held.granted or held.done:
                return
            if not g["granted"]:
                del self.held[key]
                return
            held.granted = True
            self.note("granted", key, held.dispatch["placement"])
            wait_s = max(0.0, held.dispatch.get("not_before_ms", 0) / 1000 - time.time())
            held.timer = threading.Timer(wait_s, self.start, (key,))
            held.timer.daemon = True
            held.timer.start()

    def on_kills(self, k: dict[str, Any]) -> None:
        key = (k["run_id"], int(k["attempt"]))
        with self.lock:
            held = self.held.get(key)
            if held is None:  # held by a killed process of this worker: let it go
                self.report(key[0], "released", _release(key, k))
                return
            if held.done:
                return
            if held.proc is None:
                if held.timer is not None:
                    held.timer.cancel()
                held.done = True
                release = True
                self.note("done", key, held.dispatch["placement"])
            else:
                _kill(held.proc)
                release = False
        if release:
            self.report(key[0], "released", {"attempt": key[1], "reason": "stop order"})

    # -- executions ----------------------------------------------------------------------
    def start(self, key: tuple[str, int]) -> None:
        with self.lock:
            held = self.held[key]
            if held.done or held.proc is not None or self.stopping.is_set():
                return
            d = held.dispatch
            try:
                env = {
                    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                    **_pairs(d.get("env")),
                    "CRONLOG_RUN_ID": d["run_id"],
                    "CRONLOG_JOB_ID": d["job_id"],
                    "CRONLOG_ATTEMPT": str(d["attempt"]),
                    "CRONLOG_SCHEDULED_AT": str(d["scheduled_ms"]),
                }
                held.proc = subprocess.Popen(
                    list(d["command"]),
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,  # its group: killed whole on a stop order
                )
            except (OSError, ValueError, TypeError, IndexError):
                held.proc = None  # reported as a failed start below, never left held
        body = {"attempt": key[1], "placement": d["placement"]}
        if held.proc is None:
            held.done = True
            self.report(key[0], "finished", {**body, "exit_code": 127})
            with self.lock:
                self.note("done", key, d["placement"])
            return
        with self.lock:
            self.note("started", key, d["placement"], held.proc.pid)
        self.report(key[0], "started", body)
        code = held.proc.wait()
        self.report(key[0], "finished", {**body, "exit_code": code})
        with self.lock:
            held.done = True
            self.note("done", key, d["placement"])

    def fence(self) -> None:
        """No heartbeat acknowledged for the lease: stop everything held."""
        with self.lock:
            for held in self.held.values():
                if held.timer is not None:
                    held.timer.cancel()
                if held.proc is not None and held.proc.poll() is None:
                    _kill(held.proc)

    def report(self, run_id: str, kind: str, body: dict[str, Any]) -> None:
        """Queued for the sender, in order: the heartbeat never waits on a report."""
        self.outbox.put((run_id, kind, body))

    def send_reports(self) -> None:
        while True:
            run_id, kind, body = self.outbox.get()
            self.send(run_id, kind, body)

    def send(self, run_id: str, kind: str, body: dict[str, Any]) -> None:
        """Until the API takes it (it may be restarting): a report lost is a run the
        ledger must guess about."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not self.stopping.is_set():
            try:
                answer = self.client.post(f"/runs/{run_id}/{kind}", json=body)
                if answer.status_code < 500 and answer.status_code != 429:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)


def _release(key: tuple[str, int], message: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"attempt": key[1], "reason": "not held by this worker"}
    if message.get("placement"):
        body["placement"] = message["placement"]
    return body


def _pairs(env: object) -> dict[str, str]:
    """A dispatch's env as JSON gives it: an object, or [name, value] pairs."""
    if isinstance(env, dict):
        return {str(k): str(v) for k, v in env.items()}
    if isinstance(env, list):
        return {str(pair[0]): str(pair[1]) for pair in env}
    return {}


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def main() -> None:
    url, worker_id, token, cpu, journal = sys.argv[1:6]
    worker = HttpWorker(url, worker_id, token, float(cpu), Path(journal))
    worker.recover()
    signal.signal(signal.SIGTERM, lambda *_: worker.stopping.set())
    worker.run()
    worker.fence()


if __name__ == "__main__":
    main()

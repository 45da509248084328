"""Another host on this machine: a network namespace of the test's own making, joined to
the root namespace by a veth pair, for network faults (root only).

The pair has a /30 of its own: the root end (`host_ip`) is where a private cluster serves
clients (tests/support/cluster.py, `host=`), the namespace's end (`ns_ip`) is the other
host's address; a process started with `prefix` (`ip netns exec NS`) runs "on the other
host" and reaches the brokers only across the pair. Faults act on the pair only:

- `cut()` / `heal()`: the root end down / up (a partition, both ways);
- `drop(direction)` / `undrop()`: nftables drop rules inside the namespace, one way only
  (`"out"`: nothing the other host sends arrives, `"in"`: nothing reaches it) or a share
  of packets (`percent`), for loss;
- `delay(port, ms, jitter_ms)` / `undelay()`: latency with jitter on the connections to
  the broker's port: `tc netem` is not available on this machine's kernel, so an
  nftables rule in the namespace redirects them to tests/support/latency_proxy.py, run
  there as an unprivileged user (whose own connection to the broker the rule lets pass),
  which forwards every chunk that much later; the connections open before are aborted
  (`ss -K`), so the clients reconnect through it.

Every address is on this machine and every rule inside the namespace; `close()` (the
context manager's exit) deletes the namespace, which takes the pair and the rules with
it, even when the test failed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from tests.support.waiting import eventually

Direction = Literal["in", "out", "both"]
PROXY = Path(__file__).with_name("latency_proxy.py")
PROXY_USER = 65534  # nobody: the one user whose connections the redirect leaves alone
PROXY_PORT = 19090


def available() -> str | None:
    """Why network namespaces cannot be used here (None: they can)."""
    import os

    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed"
    return None


def _proxy_listening(pid: int) -> bool:
    """Whether process `pid` runs the latency proxy (so in the namespace: `ip netns exec`
    entered it before the exec) and its namespace's TCP table (/proc/PID/net/tcp) has a
    socket listening (state 0A) on PROXY_PORT."""
    try:
        if str(PROXY).encode() not in Path(f"/proc/{pid}/cmdline").read_bytes():
            return False
        rows = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return False
    return any(
        row[1].endswith(f":{PROXY_PORT:04X}") and row[3] == "0A" for row in map(str.split, rows)
    )


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


class Namespace:
    def __init__(self, name: str, index: int):
        assert 0 < index < 64, "one /30 per index in 10.231.0.0/24"
        self.name = name
        self.host_end = f"cl{index}h"
        self.ns_end = f"cl{index}n"
        self.host_ip = f"10.231.0.{4 * index + 1}"
        self.ns_ip = f"10.231.0.{4 * index + 2}"
        self.prefix: tuple[str, ...] = ("ip", "netns", "exec", name)
        self.proxy: subprocess.Popen[bytes] | None = None

    def open(self) -> None:
        self.close()  # what a killed earlier run left
        _ip("netns", "add", self.name)
        _ip("link", "add", self.host_end, "type", "veth", "peer", "name", self.ns_end)
        _ip("link", "set", self.ns_end, "netns", self.name)
        _ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_end)
        _ip("link", "set", self.host_end, "up")
        self.inside("ip", "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_end)
        self.inside("ip", "link", "set", self.ns_end, "up")
        self.inside("ip", "link", "set", "lo", "up")
        # Everything else (another namespace's broker address, on the root namespace)
        # through the root end.
        self.inside("ip", "route", "add", "default", "via", self.host_ip)

    def inside(self, *argv: str) -> None:
        subprocess.run([*self.prefix, *argv], check=True, capture_output=True, timeout=10)

    def cut(self) -> None:
        """A partition, both ways: the root end of the pair goes down."""
        _ip("link", "set", self.host_end, "down")

    def heal(self) -> None:
        _ip("link", "set", self.host_end, "up")

    def drop(self, direction: Direction, percent: int = 100) -> None:
        """nftables rules in the namespace drop `percent` % of what it sends ("out"),
        receives ("in") or both."""
        if shutil.which("nft") is None:
            raise RuntimeError("nftables (`nft`) is not installed: make test installs it")
        self.undrop()
        self.inside("nft", "add", "table", "inet", "fault")
        hooks = {"out": ["output"], "in": ["input"], "both": ["input", "output"]}[direction]
        for hook in hooks:
            self.inside(
                "nft",
                "add",
                "chain",
                "inet",
                "fault",
                hook,
                f"{{ type filter hook {hook} priority 0 ; }}",
            )
            rule = ["ip", "daddr" if hook == "output" else "saddr", self.host_ip]
            if percent < 100:
                rule += ["numgen", "random", "mod", "100", "<", str(percent)]
            self.inside("nft", "add", "rule", "inet", "fault", hook, *rule, "drop")

    def delay(self, port: int, ms: float, jitter_ms: float) -> None:
        """Connections from the namespace to `host_ip:port` go through the latency proxy."""
        if shutil.which("nft") is None:
            raise RuntimeError("nftables (`nft`) is not installed: make test installs it")
        self.undelay()
        python = shutil.which("python3", path="/usr/bin:/usr/local/bin") or sys.executable
        self.proxy = subprocess.Popen(
            [
                *self.prefix,
                "setpriv",
                f"--reuid={PROXY_USER}",
                f"--regid={PROXY_USER}",
                "--clear-groups",
                python,
                str(PROXY),
                str(PROXY_PORT),
                self.host_ip,
                str(port),
                str(ms),
                str(jitter_ms),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        proxy = self.proxy
        eventually(
            lambda: proxy.poll() is not None or _proxy_listening(proxy.pid),
            "the latency proxy listening before anything is sent its way",
            10,
            interval_s=0.05,
        )
        assert proxy.poll() is None, "the latency proxy did not start"
        self.inside("nft", "add", "table", "ip", "latency")
        self.inside(
            "nft",
            "add",
            "chain",
            "ip",
            "latency",
            "out",
            "{ type nat hook output priority -100 ; }",
        )
        self.inside(
            "nft",
            "add",
            "rule",
            "ip",
            "latency",
            "out",
            "ip",
            "daddr",
            self.host_ip,
            "tcp",
            "dport",
            str(port),
            "meta",
            "skuid",
            "!=",
            str(PROXY_USER),
            "redirect",
            "to",
            f":{PROXY_PORT}",
        )
        # Open connections keep their path (NAT applies to new ones): abort them, and the
        # clients reconnect through the proxy.
        self.inside("ss", "-K", "dst", self.host_ip, "dport", "=", f":{port}")

    def undelay(self) -> None:
        subprocess.run(
            [*self.prefix, "nft", "delete", "table", "ip", "latency"],
            capture_output=True,
            timeout=10,
        )
        proxy = self.proxy
        if proxy is not None and proxy.poll() is None:
            proxy.kill()
            proxy.wait(10)
        self.proxy = None

    def undrop(self) -> None:
        subprocess.run(
            [*self.prefix, "nft", "delete", "table", "inet", "fault"],
            capture_output=True,
            timeout=10,
        )

    def close(self) -> None:
        if self.proxy is not None:
            self.undelay()
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=10)
        subprocess.run(["ip", "link", "del", self.host_end], capture_output=True, timeout=10)


@contextmanager
def namespace(name: str, index: int) -> Iterator[Namespace]:
    ns = Namespace(name, index)
    ns.open()
    try:
        yield ns
    finally:
        ns.close()

"""Free TCP ports for the processes a test starts.

They are chosen below the kernel's ephemeral range. `bind(("", 0))` hands out a port in
that range, and every outgoing connection (each Kafka client's, dozens per test) takes
its local port from the same range: between the test's choice and the process's bind, a
connection can take the port, and the process dies on EADDRINUSE. A CI run lost a
ledger's metrics port (the node's + 1) that way. Below the range only a listener takes
a port, and the ones listening are checked here.
"""

from __future__ import annotations

import random
import socket
from contextlib import ExitStack
from pathlib import Path

LOWEST = 20000  # above the ports services are usually configured on


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux: 32768 by default)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(count: int, span: int = 1) -> list[int]:
    """`count` ports P, each with P .. P + span - 1 free on every address, no two ranges
    overlapping; all are held open until every one is chosen."""
    high = ephemeral_low() - span
    chosen: list[int] = []
    with ExitStack() as held:
        while len(chosen) < count:
            base = random.randrange(LOWEST, high)
            if any(abs(base - other) < span for other in chosen):
                continue
            try:
                for port in range(base, base + span):
                    sock = held.enter_context(socket.socket())
                    sock.bind(("0.0.0.0", port))  # a listener on any address conflicts
            except OSError:
                continue
            chosen.append(base)
    return chosen


def free_port(span: int = 1) -> int:
    """A port P with P .. P + span - 1 free (see free_ports)."""
    return free_ports(1, span)[0]

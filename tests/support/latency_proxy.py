"""A TCP proxy that delays every chunk it forwards, in both directions, by a latency with
jitter, keeping each direction's order (what `tc netem delay` would do, which this
machine's kernel lacks). Standard library only: tests/support/netns.py runs it with the
system's python3, inside a test's network namespace, as an unprivileged user, so that
nftables can send every other process's traffic to the broker through it.

    python3 latency_proxy.py LISTEN_PORT TARGET_HOST TARGET_PORT DELAY_MS JITTER_MS
"""

from __future__ import annotations

import asyncio
import random
import sys
import time


async def pump(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float, jitter_s: float
) -> None:
    """Forward what `reader` yields to `writer`, each chunk `delay_s` +- `jitter_s`
    later, never before the chunk read ahead of it."""
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def send() -> None:
        while True:
            due, data = await queue.get()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                writer.close()
                return
            writer.write(data)
            await writer.drain()

    sender = asyncio.create_task(send())
    last = 0.0
    try:
        while True:
            data = await reader.read(65536)
            due = max(last, time.monotonic() + delay_s + random.uniform(-jitter_s, jitter_s))
            last = due
            await queue.put((due, data))
            if not data:
                break
        await sender
    except (ConnectionError, asyncio.CancelledError):
        sender.cancel()
        writer.close()


async def main(listen: int, host: str, port: int, delay_ms: float, jitter_ms: float) -> None:
    delay_s, jitter_s = delay_ms / 1000, jitter_ms / 1000

    async def connected(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(host, port)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(
            pump(client_r, server_w, delay_s, jitter_s),
            pump(server_r, client_w, delay_s, jitter_s),
            return_exceptions=True,
        )

    server = await asyncio.start_server(connected, "127.0.0.1", listen)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    listen, host, port, delay, jitter = sys.argv[1:6]
    asyncio.run(main(int(listen), host, int(port), float(delay), float(jitter)))

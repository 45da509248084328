"""What one caller may cost the API: a bounded body, and a request rate per token.

- Bodies: refused by their Content-Length before any byte is read, or as soon as what
  arrives passes the limit; never buffered whole (413).
- Rate: a token bucket per bearer token (the dashboard's cookie counts as its token;
  a request with neither, or with a token that names no one, is counted per client
  address). A caller over its rate gets
  429 with Retry-After, and other callers are not slowed: each has its own bucket.
  Configured by ``CRONLOG_API_RATE`` (requests per second, default 50; 0 turns it off)
  and ``CRONLOG_API_BURST`` (default 100). Buckets idle for ten minutes are dropped, so
  memory is bounded by the callers of the last minutes. Per API process: behind a load
  balancer of N instances a caller may reach N times the rate.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from fastapi import Request

from connectors.api.service import ServiceError

DEFAULT_RATE = 50.0
DEFAULT_BURST = 100.0
IDLE_S = 600.0


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ServiceError(413, f"body is {declared} bytes; at most {limit} allowed")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > limit:
            raise ServiceError(413, f"body is over {limit} bytes; at most {limit} allowed")
    return bytes(raw)


@dataclass
class _Bucket:
    tokens: float
    at: float


class RateLimiter:
    def __init__(
        self,
        rate: float = DEFAULT_RATE,
        burst: float = DEFAULT_BURST,
        clock: Callable[[], float] = time.monotonic,
    ):
        if rate < 0 or burst < 1:
            raise ValueError("CRONLOG_API_RATE must be >= 0 and CRONLOG_API_BURST >= 1")
        self.rate, self.burst, self.clock = rate, burst, clock
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()
        self._swept = clock()

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> RateLimiter:
        """From CRONLOG_API_RATE and CRONLOG_API_BURST in `env` (the entry point's
        environment, passed in by `cronlog api`)."""
        try:
            rate = float(env.get("CRONLOG_API_RATE", DEFAULT_RATE))
            burst = float(env.get("CRONLOG_API_BURST", DEFAULT_BURST))
        except ValueError as exc:
            raise ValueError(f"CRONLOG_API_RATE/CRONLOG_API_BURST: {exc}") from exc
        return cls(rate, burst)

    def wait_s(self, caller: str) -> float:
        """0 when `caller` may go on now (one token taken), else the seconds until it may."""
        if self.rate == 0:
            return 0.0
        now = self.clock()
        with self._lock:
            if now - self._swept > IDLE_S:
                self._sweep(now)
            bucket = self._buckets.get(caller)
            if bucket is None:
                bucket = self._buckets[caller] = _Bucket(self.burst, now)
            bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.at) * self.rate)
            bucket.at = now
            if bucket.tokens >= 1:
                bucket.tokens -= 1
                return 0.0
            return (1 - bucket.tokens) / self.rate

    def _sweep(self, now: float) -> None:
        self._swept = now
        for key in [k for k, b in self._buckets.items() if now - b.at > IDLE_S]:
            del self._buckets[key]


def caller_key(request: Request, cookie: str, known: Callable[[str], object]) -> str:
    """Who a request counts against: a digest of its bearer token or dashboard cookie
    (the token itself is never kept) when `known(token)` names a caller; else its client
    address, so made-up tokens share one bucket instead of each getting a fresh one."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    secret = token.strip() if scheme.lower() == "bearer" else ""
    secret = secret or request.cookies.get(cookie, "")
    if secret and known(secret) is not None:
        return "t:" + hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()
    return "a:" + (request.client.host if request.client else "?")

"""Placement seals: proof that the dispatcher placed (run, attempt) on one worker.

A worker claims the attempts assigned to it; the ledger grants the first claim of an
attempt. Without more, any worker could claim any due attempt (its run id is in every
run event), including one placed on another worker, and then report it done. So the
dispatcher seals each assignment: an HMAC of (run, attempt, worker) under a key only
nodes hold, carried in the assignment's dispatch request. The worker sends the
seal back with its claim, and the ledger grants a claim only if the seal is that of the
claiming worker for that attempt (LedgerConfig.placement_key).

A seal is bound to one worker: a seal read from another worker's assignment is useless
under a different worker id. Re-placing an attempt (a release, a dead worker) seals it
anew for the new worker; the old worker's seal still proves its own placement, and the
first claim in the log still wins. Deterministic (no clock, no randomness): the
ledger's decisions stay a function of its inputs and the key.
"""

from __future__ import annotations

import hashlib
import hmac

SEAL_CHARS = 32  # 128 bits of HMAC-SHA256, hex
KEY_BYTES = 32


def seal(key: bytes, run_id: str, attempt: int, worker_id: str) -> str:
    """The seal of placing (run_id, attempt) on worker_id, under key."""
    message = b"\x00".join((run_id.encode(), str(attempt).encode(), worker_id.encode()))
    return hmac.new(key, message, hashlib.sha256).hexdigest()[:SEAL_CHARS]


def sealed(key: bytes, placement: str, run_id: str, attempt: int, worker_id: str) -> bool:
    """Whether `placement` is the seal of (run_id, attempt) on worker_id (constant time)."""
    return hmac.compare_digest(placement.encode(), seal(key, run_id, attempt, worker_id).encode())

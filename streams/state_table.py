"""The ledger's in-memory table of one state topic's partition: key -> state, each held
either decoded (a frozen record) or as the bytes of its newest record, decoded when
first needed.

Why: the ledger holds every registered job and every run it keeps, but decides about few
of them at any moment. A decoded job state is several times the size of its record and
slow to decode (docs/performance.md's changelog has the figures). So a takeover keeps the
records it restored as bytes (the restore reads the topics and decodes nothing: its time
is the read), and a state the ledger will not need soon (a job with nothing live and
nothing due within `COLD_AFTER_MS`, a final run) goes back to the bytes just written for
it. What the ledger decides about is decoded once, on its first input, and stays decoded
while it is active. The bytes are exactly the state record on the topic, so nothing here is trusted
beyond the topic: a transaction that fails restores the table from the topics again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Generic, TypeAlias, TypeVar

from streams.state_store import DiskStates, MemoryStates

T = TypeVar("T")
Encoded: TypeAlias = MemoryStates | DiskStates  # where the bytes are held (state_store)

# A job state is kept as bytes once nothing of it is live and its next firing is this
# far from the ledger's time of its last decision (or it has none).
COLD_AFTER_MS: Final = 10 * 60_000


class StateTable(Generic[T]):
    __slots__ = ("_cold", "_decode", "_hot")

    def __init__(self, decode: Callable[[bytes], T], cold: Encoded | None = None):
        self._decode = decode
        self._hot: dict[str, T] = {}
        self._cold: Encoded = MemoryStates() if cold is None else cold

    def get(self, key: str) -> T | None:
        value = self._hot.get(key)
        if value is not None:
            return value
        data = self._cold.pop(key, None)
        if data is None:
            return None
        value = self._decode(data)  # a CodecError here is the restore's own failure, late
        self._hot[key] = value
        return value

    def __getitem__(self, key: str) -> T:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __setitem__(self, key: str, value: T) -> None:
        self._hot[key] = value
        self._cold.pop(key, None)

    def keep_encoded(self, key: str, value: T, data: bytes) -> None:
        """Hold `key` as `data`, the record just written for `value`, if `value` is what
        the table holds for it (a table restored meanwhile keeps its own)."""
        if self._hot.get(key) is value:
            del self._hot[key]
            self._cold[key] = data

    def pop(self, key: str, default: None = None) -> None:
        """Drop `key` (absent: nothing); `default` makes it a dict's `pop(key, None)`."""
        self._hot.pop(key, None)
        self._cold.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._hot or key in self._cold

    def __len__(self) -> int:
        return len(self._hot) + len(self._cold)

    @property
    def decoded(self) -> int:
        """How many states are held decoded (the rest as bytes)."""
        return len(self._hot)

"""What the projector last wrote of each job's row, to skip a job state that changes
none of its columns.

The ledger writes a job's state at a firing (its next due time moves) and again when a
run ends (only its run lists, which the `jobs` table does not hold, change): about half
of the states the projector reads leave the row as it is, and writing it anyway costs
an upsert of the whole spec (jsonb). A row is skipped only when this projector wrote the
same one in a transaction PostgreSQL committed: rows of a batch are `pending` until
`commit`, and everything is forgotten by `forget` (a batch not committed makes the
projector rewind, and a batch written record by record may leave some rows out). Pure:
no database here.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

# Jobs whose last row is kept (~200 bytes each): beyond it the least recently written
# are forgotten, and their next state is written whatever it holds.
JOB_ROWS_KEPT = 100_000


class WrittenRows:
    def __init__(self, most: int = JOB_ROWS_KEPT) -> None:
        self.most = most
        self._committed: OrderedDict[bytes, Hashable] = OrderedDict()
        self._pending: dict[bytes, Hashable] = {}

    def unchanged(self, key: bytes, row: Hashable) -> bool:
        """Whether `row` is the row last written for `key` (pending in this batch, or
        committed); if not, it becomes the pending one."""
        last = self._pending.get(key)
        if last is None:
            last = self._committed.get(key)
        if last == row:
            return True
        self._pending[key] = row
        return False

    def commit(self) -> None:
        """The batch's rows are in PostgreSQL."""
        committed = self._committed
        for key, row in self._pending.items():
            committed[key] = row
            committed.move_to_end(key)
        self._pending.clear()
        while len(committed) > self.most:
            committed.popitem(last=False)

    def forget(self) -> None:
        self._pending.clear()
        self._committed.clear()

    def __len__(self) -> int:
        return len(self._committed)

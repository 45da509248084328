"""How the projector orders a run's transitions (projections/projector.py): by the
sequence number in the ledger's event ids, never by event times, which different
machines stamp. The same rule on PostgreSQL: tests/integration/test_projector.py."""

from __future__ import annotations

from typing import Any

import pytest

from projections.projector import _fold, event_seq


def test_event_seq_reads_the_ledger_s_event_ids() -> None:
    assert event_seq("j@2026-01-01T00:00:00Z#12", "j@2026-01-01T00:00:00Z") == 12
    assert event_seq("j@manual:r#0", "j@manual:r") == 0  # a run skipped at once


@pytest.mark.parametrize(
    "event_id",
    ["j@manual:r", "j@manual:r#", "j@manual:r#-1", "j@manual:r#1a", "k@x#1", "j@manual:r#\u0663"],
)
def test_any_other_event_id_is_malformed(event_id: str) -> None:
    with pytest.raises(ValueError, match="malformed event id"):
        event_seq(event_id, "j@manual:r")


def row(seq: int, at: int, state: str, **columns: Any) -> dict[str, Any]:
    base = {
        "worker_id": None,
        "started_at": None,
        "exit_code": None,
        "created_at": at,
        "params": None,
        "first_started_at": None,
    }
    return {**base, "seq": seq, "at": at, "state": state, **columns}


def test_the_fold_keeps_the_highest_seq_whatever_the_times() -> None:
    start = row(3, 3_000, "running", worker_id="w1", started_at=3_000)
    cancel = row(4, 1_000, "cancelled")
    folded = _fold(start, cancel)
    assert (folded["state"], folded["seq"], folded["at"]) == ("cancelled", 4, 1_000)
    assert (folded["worker_id"], folded["started_at"]) == ("w1", 3_000)  # kept, as COALESCE
    assert _fold(cancel, start) is cancel  # an earlier transition arriving late
    assert _fold(cancel, dict(cancel)) is cancel  # the same one again


def test_a_runs_values_from_its_first_event_survive_later_ones_in_the_batch() -> None:
    first = row(1, 100, "due", params={"day": "2026-12-01"})
    later = row(2, 200, "dispatched", worker_id="w1")
    assert _fold(_fold(None, first), later)["params"] == {"day": "2026-12-01"}

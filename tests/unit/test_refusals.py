"""Issue 53 item 1, without a server or a broker: the API refuses (422) values and
defaults that make a command too large as written, and the ledger tells an output that
can never be written (refused for good: the input is refused) from an error that may
pass (retried)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from confluent_kafka import KafkaError, KafkaException

from connectors.api.service import ServiceError, _check_values, _upsert_command
from schemas.json import to_plain
from streams.core.params import parse_values
from streams.ledger import Deliveries, refusal

REPEATED = "{v}" * 6800  # 20 KB: a 1 KiB value makes it 7 MB


def doc(default: str | None, argv: list[str] | None = None) -> dict[str, Any]:
    decl: dict[str, Any] = {"type": "string"}
    if default is not None:
        decl["default"] = default
    return {
        "type": "job.upsert",
        "job_id": "big",
        "owner": "o",
        "schedule": {"every": "1h"},
        "command": argv or ["echo", REPEATED],
        "params": {"v": decl, "w": {"type": "string"}},
        "params_in_command": True,
    }


def test_a_registration_whose_defaults_make_the_command_too_large_is_a_422() -> None:
    with pytest.raises(ServiceError) as refused:
        _upsert_command(doc("a" * 1024))
    assert refused.value.status == 422
    assert "with the defaults" in str(refused.value)
    # A small default, or none, is registered: the run-now that gives a value is checked.
    assert _upsert_command(doc("a")).spec.job_id == "big"
    assert _upsert_command(doc(None)).spec.job_id == "big"


def _row(default: str | None) -> dict[str, Any]:
    spec = _upsert_command(doc(default)).spec
    return {"spec": orjson.loads(orjson.dumps(to_plain(spec)))}


def test_run_now_or_backfill_values_too_large_as_written_are_a_422() -> None:
    with pytest.raises(ServiceError) as refused:
        _check_values(_row("a"), parse_values({"v": "b" * 1024, "w": "c"}))
    assert refused.value.status == 422
    assert "command[1]" in str(refused.value)
    _check_values(_row("a"), parse_values({"v": "b", "w": "c"}))  # within every limit
    # Without values a parameter without a default stays the ledger's to refuse or skip.
    _check_values(_row("a"), ())


def test_a_request_without_values_whose_defaults_are_too_large_is_a_422() -> None:
    """A job registered past the API (the topic path) with such a default: a run-now
    without values would fail at its dispatch; the API says so first."""
    row = _row("a")
    row["spec"]["params"] = [
        {"name": "v", "type": "string", "default": orjson.dumps("a" * 1024).decode()},
        {"name": "w", "type": "string", "default": '"c"'},
    ]
    with pytest.raises(ServiceError) as refused:
        _check_values(row, ())
    assert refused.value.status == 422


@pytest.mark.parametrize(
    "code",
    [KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE, KafkaError.INVALID_RECORD],
)
def test_a_record_refused_for_good_refuses_its_input(code: int) -> None:
    reason = refusal(KafkaException(KafkaError(code, "refused")))
    assert reason.startswith("the ledger cannot write what this input leads to")
    assert KafkaError(code).name() in reason


@pytest.mark.parametrize(
    "code",
    [
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._FENCED,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError._STATE,
        KafkaError.INVALID_MSG,  # a CRC mismatch on the way: sent again, it may pass
    ],
)
def test_an_error_that_may_pass_is_retried(code: int) -> None:
    assert refusal(KafkaException(KafkaError(code, "transient"))) == ""
    assert refusal(KafkaException()) == ""


@pytest.mark.parametrize("then", [KafkaError._STATE, KafkaError._TIMED_OUT])
def test_a_refused_delivery_tells_a_refusal_whatever_the_next_call_says(then: int) -> None:
    """Once the broker refuses a record, the producer is in an abortable state and the
    call that fails next (a produce, the offsets, the commit) often says only that, or
    times out: the delivery report's code is what tells a refusal. Before, such a
    transaction was retried for ever."""
    deliveries = Deliveries()
    failed = KafkaException(KafkaError(then, "Local: Erroneous state"))
    assert deliveries.why(failed) == ""  # a transient error, on its own
    deliveries.report(None, None)  # a record delivered says nothing
    deliveries.report(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too large"), None)
    deliveries.report(KafkaError(KafkaError._STATE, "later ones"), None)
    assert "MSG_SIZE_TOO_LARGE" in deliveries.why(failed)
    deliveries.begin()  # the next transaction starts with nothing refused
    assert deliveries.why(failed) == ""


def test_a_transient_delivery_error_is_not_a_refusal() -> None:
    deliveries = Deliveries()
    deliveries.report(KafkaError(KafkaError._MSG_TIMED_OUT, "timed out"), None)
    failed = KafkaException(KafkaError(KafkaError._STATE, "Local: Erroneous state"))
    assert deliveries.why(failed) == ""

"""Log lines as JSON objects (streams/logs.py), pure."""

from __future__ import annotations

import logging
import sys

import orjson
import pytest

from connectors.cli.common import log_format_setting
from streams.logs import (
    JsonFormatter,
    LogFormatError,
    configure,
    kafka_log_settings,
    log_format,
)


def record(message: str, *args: object, **extra: object) -> logging.LogRecord:
    made = logging.LogRecord("cronlog.worker", logging.WARNING, __file__, 1, message, args, None)
    for name, value in extra.items():
        setattr(made, name, value)
    return made


def test_a_json_line_carries_the_component_the_instance_and_the_run() -> None:
    line = JsonFormatter("worker", "w-1").format(
        record("no room for %s#%d", "a@x", 2, run_id="a@x", job_id="a", attempt=2)
    )
    fields = orjson.loads(line)
    assert fields["message"] == "no room for a@x#2"
    assert (fields["component"], fields["instance"], fields["level"]) == (
        "worker",
        "w-1",
        "warning",
    )
    assert (fields["run_id"], fields["job_id"], fields["attempt"]) == ("a@x", "a", 2)
    assert fields["logger"] == "cronlog.worker"
    assert fields["ts"].endswith("+00:00")
    assert "\n" not in line


def test_a_traceback_stays_inside_its_one_line() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        made = record("failed")
        made.exc_info = sys.exc_info()
    line = JsonFormatter("ledger", None).format(made)
    assert "\n" not in line
    fields = orjson.loads(line)
    assert "RuntimeError: boom" in fields["exc"]
    assert "instance" not in fields
    assert "run_id" not in fields


def test_the_format_comes_from_the_option_then_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CLI reads CRONLOG_LOG_FORMAT (connectors/cli/common.py); streams/logs.py is
    given the value and reads no environment."""
    monkeypatch.delenv("CRONLOG_LOG_FORMAT", raising=False)
    assert log_format(log_format_setting(None)) == "text"
    monkeypatch.setenv("CRONLOG_LOG_FORMAT", "JSON")
    assert log_format(log_format_setting(None)) == "json"
    assert log_format(log_format_setting("text")) == "text"
    assert log_format(None) == "text"  # not given the environment's value: the default
    assert log_format("JSON") == "json"
    with pytest.raises(LogFormatError, match="text, json"):
        log_format("xml")


def test_json_routes_librdkafka_logs_through_the_handler_and_text_leaves_them() -> None:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        configure("info", "scheduler", "n1", "json")
        assert kafka_log_settings() == {"logger": logging.getLogger("librdkafka")}
        assert isinstance(root.handlers[0].formatter, JsonFormatter)
        configure("info", "scheduler", "n1", "text")
        assert kafka_log_settings() == {}
    finally:
        configure("info", "tests", None, "text")  # the routing flag back off
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])

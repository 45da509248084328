"""The API's tokens configuration and its per-caller limits, without a server."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from connectors.api.auth import AuthConfigError, Tokens
from connectors.api.limits import RateLimiter


def tokens_file(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "tokens.yaml"
    path.write_text(text)
    return {"CRONLOG_API_TOKENS_FILE": str(path)}


@pytest.mark.parametrize(
    "text",
    [
        'admin: "s3cret"',  # a string: each character would have become an admin token
        "admin: [1, 2]",
        "owners: [tok-a]",
        "owners: {tok-a: 5}",
        "workers: {tok-w: ''}",
    ],
)
def test_a_tokens_file_of_the_wrong_shape_is_refused(tmp_path: Path, text: str) -> None:
    with pytest.raises(AuthConfigError, match="expected"):
        Tokens.from_env(tokens_file(tmp_path, text))


def test_no_single_character_passes_for_an_admin_token(tmp_path: Path) -> None:
    tokens = Tokens.from_env(tokens_file(tmp_path, "admin: [s3cret]\nowners: {tok-a: team-a}"))
    assert tokens.principal("s3cret") is not None
    assert all(tokens.principal(c) is None for c in "s3cret")


@given(st.text(max_size=40))
def test_any_header_text_is_a_token_or_none_never_an_error(text: str) -> None:
    tokens = Tokens(frozenset({"adm"}), {"tok-a": "team-a"}, {"tok-w": "w1"})
    found = tokens.principal(text)
    assert (found is not None) == (text in {"adm", "tok-a", "tok-w"})


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_then_the_rate_and_each_caller_its_own_bucket() -> None:
    clock = Clock()
    limiter = RateLimiter(rate=10, burst=5, clock=clock)
    assert [limiter.wait_s("a") for _ in range(5)] == [0.0] * 5
    assert limiter.wait_s("a") == pytest.approx(0.1)  # empty: one token in 0.1 s
    assert limiter.wait_s("b") == 0.0  # another caller is not slowed
    clock.now += 0.1
    assert limiter.wait_s("a") == 0.0
    assert limiter.wait_s("a") > 0
    clock.now += 100
    assert [limiter.wait_s("a") for _ in range(5)] == [0.0] * 5  # refilled to the burst
    assert limiter.wait_s("a") > 0


@given(st.lists(st.floats(0, 2), min_size=1, max_size=200))
def test_never_more_than_the_burst_plus_the_rate_over_any_run(gaps: list[float]) -> None:
    clock = Clock()
    limiter = RateLimiter(rate=20, burst=10, clock=clock)
    allowed = 0
    for gap in gaps:
        clock.now += gap
        allowed += limiter.wait_s("t") == 0.0
    assert allowed <= 10 + 20 * clock.now + 1e-9


def test_rate_zero_turns_it_off_and_bad_settings_are_refused() -> None:
    off = RateLimiter.from_env({"CRONLOG_API_RATE": "0"})
    assert all(off.wait_s("t") == 0.0 for _ in range(1000))
    with pytest.raises(ValueError, match="CRONLOG_API_RATE"):
        RateLimiter.from_env({"CRONLOG_API_RATE": "fast"})
    with pytest.raises(ValueError, match="CRONLOG_API_BURST"):
        RateLimiter.from_env({"CRONLOG_API_BURST": "0"})

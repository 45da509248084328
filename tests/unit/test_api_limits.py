"""The API's tokens configuration and its per-caller limits, without a server."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from connectors.api.auth import AuthConfigError, Tokens
from connectors.api.limits import RateLimiter
from connectors.api.service import Principal


def tokens_file(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "tokens.yaml"
    path.write_text(text)
    return {"CRONLOG_API_TOKENS_FILE": str(path)}


@pytest.mark.parametrize(
    "text",
    [
        'admin: "s3cret"',  # a string: each character would have become an admin token
        "admin: [1, 2]",
        "owners: [tok-a-0123456789ab]",
        "owners: {tok-a-0123456789ab: 5}",
        "workers: {tok-w-0123456789ab: ''}",
    ],
)
def test_a_tokens_file_of_the_wrong_shape_is_refused(tmp_path: Path, text: str) -> None:
    with pytest.raises(AuthConfigError, match="expected"):
        Tokens.from_env(tokens_file(tmp_path, text))


def test_no_single_character_passes_for_an_admin_token(tmp_path: Path) -> None:
    tokens = Tokens.from_env(
        tokens_file(tmp_path, "admin: [s3cret-0123456789ab]\nowners: {tok-a-0123456789ab: team-a}")
    )
    assert tokens.principal("s3cret-0123456789ab") is not None
    assert all(tokens.principal(c) is None for c in "s3cret-0123456789ab")


@given(st.text(max_size=40))
def test_any_header_text_is_a_token_or_none_never_an_error(text: str) -> None:
    tokens = Tokens(
        frozenset({"adm"}), {"tok-a-0123456789ab": "team-a"}, {"tok-w-0123456789ab": "w1"}
    )
    found = tokens.principal(text)
    assert (found is not None) == (text in {"adm", "tok-a-0123456789ab", "tok-w-0123456789ab"})


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


@pytest.mark.parametrize(
    "env",
    [
        {"CRONLOG_API_ADMIN_TOKENS": "x"},
        {"CRONLOG_API_TOKENS": "short-token=team-a"},
        {"CRONLOG_WORKER_TOKENS": "fifteen-chars-x=w1"},
    ],
)
def test_a_short_token_is_refused_without_being_shown(env: dict[str, str]) -> None:
    with pytest.raises(AuthConfigError, match="shorter than 16 characters") as refused:
        Tokens.from_env(env)
    token = next(iter(env.values())).split("=")[0]
    assert token not in str(refused.value)


def test_a_worker_token_names_one_worker() -> None:
    with pytest.raises(AuthConfigError, match="not accepted"):
        Tokens.from_env({"CRONLOG_WORKER_TOKENS": "worker-token-0123456789=*"})
    tokens = Tokens.from_env({"CRONLOG_WORKER_TOKENS": "worker-token-0123456789=w1"})
    assert tokens.principal("worker-token-0123456789") == Principal("worker", "w1")

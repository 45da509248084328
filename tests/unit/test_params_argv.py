"""Issue 53, item 7: a parameter value is its caller's text. Substituted as a whole argv
item (`["mytool", "--day", "{day}"]`) it is that one item, literal, whatever it holds;
read from CRONLOG_PARAMS it is data; only a command that writes it into shell code
(`sh -c "... {day} ..."`) or lets it stand as an option makes it more (README,
docs/architecture.md "Parameters"). Played here with hostile values through
`substitute` and `as_env` (what the ledger puts in a dispatch, streams/core/ledger/
kernel.py); tests/processes/test_params_exec.py runs real processes with them."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.core.params import as_env, as_mapping, substitute

HOSTILE = [
    "; rm -rf /",
    "-rf",
    "--output=/etc/passwd",
    "$(id)",
    "`id`",
    "a b\tc\nd",  # whitespace: never a split
    "' \" \\ $HOME * ? [a]",
    "{day}",  # a value that looks like a placeholder is not substituted again
    "{{",
    "",
]


def values(**given: object) -> tuple[tuple[str, str], ...]:
    return as_mapping({name: orjson.dumps(v).decode() for name, v in given.items()})


@pytest.mark.parametrize("value", HOSTILE)
def test_a_whole_item_placeholder_is_one_literal_item(value: str) -> None:
    argv = substitute(("mytool", "--day", "{day}", "--", "{day}"), values(day=value))
    assert argv == ("mytool", "--day", value, "--", value)


@given(
    st.text(
        alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"),
        max_size=200,
    )
)
def test_any_value_stays_one_item_and_verbatim(value: str) -> None:
    argv = substitute(("t", "{v}", "--v={v}"), values(v=value))
    assert argv == ("t", value, f"--v={value}")


@pytest.mark.parametrize("value", HOSTILE)
def test_cronlog_params_gives_the_value_back_exactly(value: str) -> None:
    assert json.loads(as_env(values(day=value, n=3))) == {"day": value, "n": 3}

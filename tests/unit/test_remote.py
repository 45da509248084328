"""Where the CLI's API mode finds the API and its token (connectors/remote.py): options
first, then the environment (read by the CLI, connectors/cli/access.py), then the profile;
the profile is its owner's alone."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from connectors.api.service import ServiceError
from connectors.cli.access import remote_for
from connectors.remote import Remote, find_remote, load_profile, profile_path, save_profile


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("CRONLOG_API_URL", raising=False)
    monkeypatch.delenv("CRONLOG_TOKEN", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def test_no_api_anywhere_is_the_direct_mode() -> None:
    assert find_remote(None, None, direct=False) is None
    assert remote_for(None, None, direct=False) is None


def test_options_win_over_the_environment_which_wins_over_the_profile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    save_profile("http://profile", "tok-profile")
    assert remote_for(None, None, False) == Remote(
        "http://profile", "tok-profile", str(profile_path())
    )
    monkeypatch.setenv("CRONLOG_API_URL", "http://env")
    monkeypatch.setenv("CRONLOG_TOKEN", "tok-env")
    assert remote_for(None, None, False) == Remote(
        "http://env", "tok-env", "options or environment"
    )
    # connectors/remote.py is given the values: it reads no CRONLOG_API_URL itself.
    assert find_remote(None, None, False) == Remote(
        "http://profile", "tok-profile", str(profile_path())
    )
    chosen = remote_for("http://option", "tok-option", False)
    assert chosen is not None
    assert (chosen.url, chosen.token) == ("http://option", "tok-option")
    assert remote_for("http://option", "tok-option", direct=True) is None


def test_a_url_without_a_token_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ServiceError, match=r"needs a token \(--token or CRONLOG_TOKEN\)"):
        find_remote("http://api", None, False)
    monkeypatch.setenv("CRONLOG_TOKEN", "tok")
    with pytest.raises(ServiceError, match="needs a URL"):
        remote_for(None, None, False)
    with pytest.raises(ServiceError, match=r"needs a URL \(--api or CRONLOG_API_URL\)"):
        find_remote(None, "tok", False)


def test_the_profile_is_written_mode_600_and_replaced_whole(tmp_path: Path) -> None:
    path = save_profile("http://a", "tok-a")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.chmod(0o644)  # loosened by hand: a new login writes a fresh file, 600 again
    save_profile("http://b", "tok-b")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    loaded = load_profile()
    assert loaded is not None
    assert (loaded.url, loaded.token) == ("http://b", "tok-b")


def test_a_broken_profile_says_what_to_do() -> None:
    path = profile_path()
    path.parent.mkdir(parents=True)
    path.write_text('{"api": "http://a"}')
    with pytest.raises(ServiceError, match="run `cronlog login`"):
        load_profile()
    path.write_text("not json")
    with pytest.raises(ServiceError, match="cannot be read"):
        load_profile()

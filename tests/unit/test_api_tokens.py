"""The API's tokens as commands (issue 55): tokens kept hashed, `cronlog tokens
create|list|revoke` on the file, and the API's reading of the file again when it
changes (connectors/api/auth.py, connectors/cli/tokens.py)."""

from __future__ import annotations

import os
import pwd
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from connectors.api import auth
from connectors.api.auth import AuthConfigError, Tokens, TokenSource, token_hash
from connectors.api.service import ADMIN, Principal
from connectors.cli import app


def test_a_hashed_token_is_known_by_its_hash_and_a_plain_one_as_before() -> None:
    tokens = Tokens(
        frozenset({token_hash("admin-secret-0123456789")}),
        {token_hash("payments-0123456789abc"): "payments", "plain-team-0123456789": "plain"},
    )
    assert tokens.principal("admin-secret-0123456789") == ADMIN
    assert tokens.principal("payments-0123456789abc") == Principal("owner", "payments")
    assert tokens.principal("plain-team-0123456789") == Principal("owner", "plain")
    # The hash itself is not a token: whoever reads the file cannot call the API with it.
    assert tokens.principal(token_hash("payments-0123456789abc")) is None
    assert tokens.principal("payments-0123456789ab") is None


def _cli(*args: str) -> tuple[int, str, str]:
    done = CliRunner().invoke(app, list(args))
    return done.exit_code, done.stdout, done.stderr


def test_tokens_made_listed_and_revoked_never_show_the_secret_again(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(yaml.safe_dump({"admin": ["plain-admin-0123456789"]}))
    code, out, _ = _cli("tokens", "create", "--owner", "payments", "--file", str(path))
    assert code == 0, out
    token, token_id = out.splitlines()[1], out.split()[1]
    assert len(token) >= auth.MIN_TOKEN_CHARS
    assert token not in path.read_text()
    assert path.stat().st_mode & 0o777 == 0o600
    assert Tokens.from_env({"CRONLOG_API_TOKENS_FILE": str(path)}).principal(token) == Principal(
        "owner", "payments"
    )
    code, out, _ = _cli("tokens", "list", "--file", str(path))
    assert code == 0
    assert token_id in out
    assert "payments" in out
    assert token not in out
    assert "plain-admin-0123456789" not in out  # a plain one is listed by its hash's id too
    code, out, _ = _cli("tokens", "revoke", token_id, "--file", str(path))
    assert code == 0, out
    assert Tokens.from_env({"CRONLOG_API_TOKENS_FILE": str(path)}).principal(token) is None
    code, out, err = _cli("tokens", "revoke", token_id, "--file", str(path))
    assert code == 1
    assert "no token" in out + err
    code, out, err = _cli("tokens", "create", "--owner", "bad name", "--file", str(path))
    assert code == 2


def test_the_api_reads_its_tokens_file_again_when_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(auth, "RELOAD_EVERY_S", 0.0)
    path = tmp_path / "tokens.yaml"
    path.write_text(yaml.safe_dump({"owners": {"team-a-0123456789ab": "team-a"}}))
    source = TokenSource({"CRONLOG_API_TOKENS_FILE": str(path)})
    assert source.principal("team-a-0123456789ab") == Principal("owner", "team-a")
    assert source.principal("team-b-0123456789ab") is None
    time.sleep(0.01)  # a new modification time, whatever the file system's resolution
    path.write_text(yaml.safe_dump({"owners": {token_hash("team-b-0123456789ab"): "team-b"}}))
    assert source.principal("team-b-0123456789ab") == Principal("owner", "team-b")
    assert source.principal("team-a-0123456789ab") is None  # revoked
    # A file that no longer reads keeps the tokens read before (and the log says why).
    path.write_text("owners: [not, a, mapping]\n")
    assert source.principal("team-b-0123456789ab") == Principal("owner", "team-b")
    with pytest.raises(AuthConfigError):
        Tokens.from_env({"CRONLOG_API_TOKENS_FILE": str(path)})


def test_a_file_the_api_would_not_read_is_not_written_and_a_file_keeps_its_owner(
    tmp_path: Path,
) -> None:
    """The hostile review: a revoke written into a file the API cannot read (a short
    token added by hand) left the revoked token working, since the API keeps the tokens
    it read before; and a service's file rewritten by root became root's, unreadable by
    the API. Now such a file is not written (exit 1, saying why), and a file keeps its
    owner."""
    path = tmp_path / "tokens.yaml"
    path.write_text(yaml.safe_dump({"owners": {"short": "team"}}))
    before = path.read_text()
    code, out, err = _cli("tokens", "create", "--owner", "payments", "--file", str(path))
    assert code == 1
    assert "shorter than 16" in out + err
    assert path.read_text() == before
    path.write_text(yaml.safe_dump({"owners": {}}))
    nobody = pwd.getpwnam("nobody")
    if os.geteuid() != 0:
        pytest.skip("changing a file's owner needs root")
    os.chown(path, nobody.pw_uid, nobody.pw_gid)
    code, out, _ = _cli("tokens", "create", "--owner", "payments", "--file", str(path))
    assert code == 0, out
    assert (path.stat().st_uid, path.stat().st_gid) == (nobody.pw_uid, nobody.pw_gid)
    assert path.stat().st_mode & 0o777 == 0o600


def test_without_a_file_named_or_found_tokens_are_not_made_somewhere_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CRONLOG_API_TOKENS_FILE", raising=False)
    monkeypatch.setenv("CRONLOG_STATE_DIR", str(tmp_path / "nowhere"))
    code, out, err = _cli("tokens", "create", "--owner", "payments")
    assert code == 2
    assert "name the file the API reads" in out + err
    assert not (tmp_path / "nowhere").exists()

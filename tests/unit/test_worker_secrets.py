"""How a worker resolves the secrets a job's env references."""

from __future__ import annotations

from pathlib import Path

import pytest

from connectors.worker.secrets import MissingSecret, Secrets, env_name
from streams.core.secret_grants import SecretGrants

MINE = SecretGrants.from_document({"db-pass": ["me"]})


def test_a_file_wins_over_the_environment_and_loses_one_trailing_newline(tmp_path: Path) -> None:
    (tmp_path / "db-pass").write_text("from-file\n\n")
    secrets = Secrets(tmp_path, {"CRONLOG_SECRET_DB_PASS": "from-env"}, grants=MINE)
    assert secrets.resolve((("DB", "db-pass"),), "me") == {"DB": "from-file\n"}
    assert Secrets(None, {"CRONLOG_SECRET_DB_PASS": "from-env"}).value("db-pass") == "from-env"
    assert env_name("api.key-2") == "CRONLOG_SECRET_API_KEY_2"


def test_a_missing_secret_names_itself_never_a_value(tmp_path: Path) -> None:
    (tmp_path / "other").write_text("hunter2")
    with pytest.raises(MissingSecret) as raised:
        Secrets(tmp_path, {}).value("nope")
    message = str(raised.value)
    assert "'nope'" in message
    assert "CRONLOG_SECRET_NOPE" in message
    assert "hunter2" not in message


@pytest.mark.parametrize("name", ["../etc/passwd", "/etc/passwd", ".hidden", "a/b", ""])
def test_a_name_is_never_a_path(tmp_path: Path, name: str) -> None:
    with pytest.raises(MissingSecret, match="not a valid secret name"):
        Secrets(tmp_path, {}).value(name)

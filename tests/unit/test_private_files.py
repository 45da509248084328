"""Issue 53, items 8 and 9: the secrets and the state a node keeps on local disk are
never within another local user's reach (connectors/private_files.py).

Item 8: `cronlog run` wrote `.state/api-tokens.yaml` 0644 and chmod-ed it 0600 after:
a user who opened it in between kept a descriptor and read the admin token. The secured
stack's password files (connectors/stack/secure.py) were chmod-ed, then rewritten in
place. Now each is a new file created 0600 and renamed into place.

Item 9: the ledger's store was a fixed `/tmp/cronlog-ledger`, used whoever owned it: a
user who made it first received every owner's job states. Now it defaults under the
node's state folder, is made 0700, and one another user owns, or that its group or
others may write, is refused."""

from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from connectors.cli.processes import _ledger_store
from connectors.cli.supervisor import token_file
from connectors.private_files import NotPrivate, private_dir, write_private
from connectors.stack.secure import _private as write_password_file


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def no_fixing_up(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, int, int]]]:
    """umask 000 and every chmod a no-op: a file is only as private as the call that
    created it. Yields what os.open created: (name, flags, its mode at creation)."""
    created: list[tuple[str, int, int]] = []
    real_open = os.open

    def spy_open(path: Any, flags: int, mode: int = 0o777, *args: Any, **kw: Any) -> int:
        fd = real_open(path, flags, mode, *args, **kw)
        if flags & os.O_CREAT:
            created.append((os.fspath(path), flags, stat.S_IMODE(os.fstat(fd).st_mode)))
        return fd

    monkeypatch.setattr(os, "open", spy_open)
    for name in ("chmod", "fchmod"):
        monkeypatch.setattr(os, name, lambda *a, **k: None)
    monkeypatch.setattr(Path, "chmod", lambda *a, **k: None)
    old = os.umask(0)
    try:
        yield created
    finally:
        os.umask(old)


def test_the_token_file_is_0600_from_its_creation_whatever_the_umask(
    tmp_path: Path, no_fixing_up: list[tuple[str, int, int]]
) -> None:
    path = token_file(tmp_path / "state")
    assert mode(path) == 0o600
    assert yaml.safe_load(path.read_text())["admin"]
    (created,) = no_fixing_up
    name, flags, at_creation = created
    assert Path(name).parent == path.parent
    assert name != str(path)  # a new file, renamed into place
    assert at_creation == 0o600
    for flag in (os.O_EXCL, os.O_NOFOLLOW, os.O_CREAT):
        assert flags & flag
    assert [p.name for p in path.parent.iterdir()] == ["api-tokens.yaml"]  # no temp left


def test_a_reader_of_an_older_token_file_never_sees_the_new_tokens(tmp_path: Path) -> None:
    """The attack on the rewrite: an earlier version's token file (0644, a `*` worker
    token) opened by another user before `cronlog run` rewrites it: the descriptor still
    reads the old file, never the new content; the file is 0600 after."""
    state = tmp_path / "state"
    state.mkdir()
    path = state / "api-tokens.yaml"
    path.write_text(yaml.safe_dump({"admin": ["old"], "workers": {"wtok": "*"}}))
    path.chmod(0o644)
    with open(path) as held:  # the other user's descriptor
        token_file(state)
        assert "local-http" not in held.read()
    assert yaml.safe_load(path.read_text())["workers"] == {"wtok": "local-http"}
    assert mode(path) == 0o600


def test_an_older_wide_token_file_left_as_it_is_is_made_0600(tmp_path: Path) -> None:
    path = tmp_path / "api-tokens.yaml"
    path.write_text(yaml.safe_dump({"admin": ["a"], "workers": {"w": "local-http"}}))
    path.chmod(0o644)
    token_file(tmp_path)
    assert mode(path) == 0o600


def test_the_secure_stacks_password_files_are_0600_from_their_creation(
    tmp_path: Path, no_fixing_up: list[tuple[str, int, int]]
) -> None:
    path = tmp_path / "users.json"
    write_password_file(path, '{"users": {"admin": "pw"}}')
    assert mode(path) == 0o600
    assert [at_creation for _, _, at_creation in no_fixing_up] == [0o600]


def test_a_reader_of_a_wide_properties_file_never_sees_the_new_password(tmp_path: Path) -> None:
    """A `<role>.properties` left 0644 (by hand, or an older version), opened by another
    user: `stack up --secure` rewrites it; the held descriptor reads the old content."""
    path = tmp_path / "worker.properties"
    path.write_text("sasl.password=old\n")
    path.chmod(0o644)
    with open(path) as held:
        write_password_file(path, "sasl.password=new-secret\n")
        assert "new-secret" not in held.read()
    assert path.read_text() == "sasl.password=new-secret\n"
    assert mode(path) == 0o600


def test_write_private_replaces_a_link_never_its_target(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("untouched")
    link = tmp_path / "secret"
    link.symlink_to(target)
    write_private(link, "s3cret")
    assert target.read_text() == "untouched"
    assert not link.is_symlink()
    assert link.read_text() == "s3cret"
    assert mode(link) == 0o600


# Item 9: the ledger's store.


def nobody() -> int:
    return pwd.getpwnam("nobody").pw_uid


def refused(option: str | None, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(typer.Exit) as exit_:
        _ledger_store(option)
    assert exit_.value.exit_code == 2
    return capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() != 0, reason="making a folder another user's needs root")
def test_a_store_folder_another_user_made_first_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attack: a local user makes the store folder before the node starts."""
    store = tmp_path / "cronlog-ledger"
    store.mkdir(mode=0o700)
    os.chown(store, nobody(), -1)
    error = refused(str(store), capsys)
    assert f"{store} belongs to uid {nobody()}" in error
    monkeypatch.setenv("CRONLOG_LEDGER_STORE", str(store))
    assert "belongs to uid" in refused(None, capsys)
    assert list(store.iterdir()) == []  # nothing of the ledger's went in


@pytest.mark.skipif(os.geteuid() != 0, reason="making a folder another user's needs root")
def test_a_link_to_another_users_folder_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, nobody(), -1)
    link = tmp_path / "store"
    link.symlink_to(theirs)
    assert "belongs to uid" in refused(str(link), capsys)


@pytest.mark.parametrize("wide", [0o777, 0o1777, 0o770, 0o702])
def test_a_store_folder_others_may_write_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], wide: int
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    store.chmod(wide)
    assert "writable by its group or others" in refused(str(store), capsys)


def test_the_default_store_is_in_the_state_folder_and_0700(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CRONLOG_LEDGER_STORE", raising=False)
    monkeypatch.setenv("CRONLOG_STATE_DIR", str(tmp_path / "state"))
    old = os.umask(0)
    try:
        store = _ledger_store(None)
    finally:
        os.umask(old)
    assert store == tmp_path / "state" / "ledger"
    assert mode(store) == 0o700
    assert _ledger_store("memory") is None


def test_an_own_readable_store_folder_is_made_0700(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    store.chmod(0o755)
    assert _ledger_store(str(store)) == store
    assert mode(store) == 0o700


def test_private_dir_refuses_a_file(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("")
    with pytest.raises((NotPrivate, FileExistsError)):
        private_dir(path, "the store")

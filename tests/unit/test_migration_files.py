from __future__ import annotations

from pathlib import Path

import pytest

from projections.migrate import MigrationError, load_migrations


def test_shipped_migrations_are_numbered_from_one_without_gaps() -> None:
    versions = [m.version for m in load_migrations()]
    assert versions == list(range(1, len(versions) + 1))


def test_badly_named_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "0001_ok.sql").write_text("SELECT 1;")
    (tmp_path / "2_missing_padding.sql").write_text("SELECT 1;")
    with pytest.raises(MigrationError, match="NNNN_name"):
        load_migrations(tmp_path)


def test_duplicate_versions_are_refused(tmp_path: Path) -> None:
    (tmp_path / "0001_a.sql").write_text("SELECT 1;")
    (tmp_path / "0001_b.sql").write_text("SELECT 2;")
    with pytest.raises(MigrationError, match="duplicate"):
        load_migrations(tmp_path)

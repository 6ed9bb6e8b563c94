from pathlib import Path

import pytest

from tools.demo.run_dirs import new_run_dir, old_runs, prune_runs


def _mk(root: Path, *names: str) -> None:
    for n in names:
        (root / n).mkdir(parents=True)
        (root / n / "f").write_text("x")


def test_keeps_the_newest_and_returns_the_rest_oldest_first(tmp_path: Path) -> None:
    _mk(tmp_path, "20261130-030314-9cf1", "20261129-230422-ccff", "20261130-024742-523e")
    assert [p.name for p in old_runs(tmp_path, keep=1)] == ["20261129-230422-ccff", "20261130-024742-523e"]
    assert old_runs(tmp_path, keep=3) == []
    assert len(old_runs(tmp_path, keep=0)) == 3


def test_other_folders_and_files_are_never_pruned(tmp_path: Path) -> None:
    _mk(tmp_path, "20261129-230422-ccff", "my-notes", "20261130-0303-9cf1", "20261130-030314-XYZ1")
    (tmp_path / "20261128-000000-aaaa.txt").write_text("a file")
    removed = prune_runs(tmp_path, keep=0)
    assert [p.name for p in removed] == ["20261129-230422-ccff"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "20261128-000000-aaaa.txt", "20261130-0303-9cf1", "20261130-030314-XYZ1", "my-notes"]


def test_missing_root_and_bad_keep(tmp_path: Path) -> None:
    assert old_runs(tmp_path / "absent", keep=2) == []
    with pytest.raises(ValueError, match="keep"):
        old_runs(tmp_path, keep=-1)


def test_a_new_run_folder_is_recognised_and_sorts_last(tmp_path: Path) -> None:
    _mk(tmp_path, "20000101-000000-0000")
    new = new_run_dir(tmp_path)
    new.mkdir()
    assert old_runs(tmp_path, keep=1) == [tmp_path / "20000101-000000-0000"]

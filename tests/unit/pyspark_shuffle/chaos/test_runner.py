"""What a chaos run counts as left on the default service's stores: files under an executor's
``pyshuffle`` directory, not Spark's own, and not the store's hidden identity files."""

from __future__ import annotations

from pathlib import Path

from pyspark_shuffle.chaos.runner import stored_files


def test_only_files_under_a_pyshuffle_directory_count(tmp_path: Path) -> None:
    partition = tmp_path / "spark-1" / "executor-1" / "blockmgr-1" / "pyshuffle" / "result-a"
    partition.mkdir(parents=True)
    (partition / "data").write_bytes(b"x")
    (partition.parent / ".store-id").write_bytes(b"x")
    (tmp_path / "spark-1" / "executor-1" / "blockmgr-1" / "shuffle_0_0_0.data").write_bytes(b"x")
    assert stored_files(tmp_path) == [str(partition / "data")]
    assert stored_files(tmp_path / "gone") == []  # a directory Spark deleted

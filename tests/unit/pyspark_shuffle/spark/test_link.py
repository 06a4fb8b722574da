"""The Connect side's tallies and shared values through a real blob store (local files), and
Spark's byte sizes: no Spark session needed."""

from __future__ import annotations

import operator
import pickle
from pathlib import Path

import pytest

from blob import BlobStore
from pyspark_shuffle.spark.link import _BlobShared, _StoreTally, byte_size
from pyspark_shuffle.tasks.map_reduce import add_counts
from shuffle_api import BlobNotFoundError, ConfigError, SerializationError
from shuffle_runtime.store import Store

SECRET = b"s" * 32


@pytest.mark.parametrize(
    ("text", "size"),
    [("134217728b", 134217728), ("128MB", 128 << 20), ("4m", 4 << 20), ("1024", 1024)],
)
def test_byte_sizes_read_as_spark_writes_them(text: str, size: int) -> None:
    assert byte_size(text) == size


def test_a_byte_size_spark_would_refuse_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="not a Spark byte size"):
        byte_size("lots")


def test_a_tally_merges_what_tasks_added_once_each(tmp_path: Path) -> None:
    driver = _StoreTally(str(tmp_path), ("connect-app", "reads"), (0, 0), add_counts, SECRET)
    task = pickle.loads(pickle.dumps(driver))  # as a task gets it
    task.add((3, 30))
    task.add((4, 40))
    assert driver.value == (7, 70)
    task.add((1, 10))
    assert driver.value == (8, 80)  # the files read before are not counted again
    assert driver.value == (8, 80)


def test_a_tally_refuses_a_file_its_tasks_did_not_sign(tmp_path: Path) -> None:
    tally = _StoreTally(str(tmp_path), ("connect-app", "rows"), 0, operator.add, SECRET)
    tally.add(5)
    forger = _StoreTally(str(tmp_path), ("connect-app", "rows"), 0, operator.add, b"x" * 32)
    forger.add(1_000)
    with pytest.raises(SerializationError, match="not signed with this application's secret"):
        _ = tally.value


def test_a_tally_with_nothing_added_is_its_zero(tmp_path: Path) -> None:
    tally = _StoreTally(str(tmp_path), ("connect-app", "none"), 0, operator.add, SECRET)
    assert tally.value == 0


def test_a_shared_value_is_read_from_its_blob_and_gone_when_destroyed(tmp_path: Path) -> None:
    store = BlobStore(str(tmp_path))
    key = store.put(pickle.dumps(("nonce", {"reducers": 3})))
    shared: _BlobShared[dict[str, int]] = _BlobShared(str(tmp_path), key, 1 << 20)
    assert pickle.loads(pickle.dumps(shared)).value == {"reducers": 3}
    shared.unpersist()  # a released result's tasks may still read it
    assert store.exists(key)
    shared.destroy()
    assert not store.exists(key)
    with pytest.raises(BlobNotFoundError):
        store.get(key)


def test_tally_files_live_under_the_links_directory(tmp_path: Path) -> None:
    tally = _StoreTally(str(tmp_path), ("connect-app", "t"), 0, operator.add, SECRET)
    tally.add(1)
    assert [path.parent.name for path in tmp_path.rglob("*.pickle")] == ["t"]
    assert tally.value == 1
    Store(str(tmp_path)).delete_tree(Store(str(tmp_path)).path("connect-app"))
    assert tally.value == 1  # what was merged stays merged

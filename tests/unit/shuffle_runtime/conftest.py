"""Real stores for the tests of ``shuffle_runtime.store`` and ``shuffle_runtime.format``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from shuffle_runtime.store import Store


@pytest.fixture(params=["local", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A real store: a local tmp_path directory, or a memory:// path unique to the test."""
    if request.param == "local":
        yield Store(str(tmp_path / "store"))
        return
    memory = Store(f"memory://pyshuffle-unit-{uuid.uuid4().hex}")
    yield memory
    memory.delete_tree(memory.path())


@pytest.fixture
def local_store(tmp_path: Path) -> Store:
    return Store(str(tmp_path / "store"))


@pytest.fixture(params=["mapped", "positioned", "memory", "s3"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Each way a store reads ranges: a memory map, positioned reads, fsspec (in memory, and
    ranged GETs of an object store: moto's S3 server standing in for S3)."""
    if request.param in ("mapped", "positioned"):
        yield Store(str(tmp_path / "store"), memory_map=request.param == "mapped")
        return
    if request.param == "s3":
        bucket = f"unit-{uuid.uuid4().hex}"
        request.getfixturevalue("s3_stand_in").make_bucket(bucket)
        root = f"s3://{bucket}/store"
    else:
        root = f"memory://pyshuffle-unit-{uuid.uuid4().hex}"
    fsspec_store = Store(root)
    yield fsspec_store
    fsspec_store.delete_tree(fsspec_store.path())

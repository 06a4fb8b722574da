"""netty_like passes the conformance suite, on a local directory and on memory://."""

from __future__ import annotations

from pathlib import Path

import fsspec
import pytest

from shuffle_api import Configuration, new_id
from shuffle_api.testing import ConformanceHarness, PipelinedPartitionConformance


def _files(url: str) -> list[str]:
    fs, root = fsspec.core.url_to_fs(url)
    if not fs.exists(root):
        return []
    return sorted(path for path in fs.find(root) if not fs.isdir(path))


class TestNettyLikeOnLocalDirectory(PipelinedPartitionConformance):
    @pytest.fixture
    def harness(self, tmp_path: Path) -> ConformanceHarness:
        url = str(tmp_path / "store")
        config = Configuration.load(
            {"netty-like.storage.url": url, "netty-like.sort-buffer.size": "4m"}, environ={}
        )
        return ConformanceHarness(config, stored_files=lambda: _files(url))


class TestNettyLikeOnMemoryStore(PipelinedPartitionConformance):
    @pytest.fixture
    def harness(self) -> ConformanceHarness:
        url = f"memory://conformance-{new_id()}"
        config = Configuration.load(
            {
                "netty-like.storage.url": url,
                "shuffle.compression.codec": "zstd",
                "netty-like.pipelined.subpartition-buffer": "256k",
            },
            environ={},
        )
        return ConformanceHarness(config, stored_files=lambda: _files(url))

"""netty_like passes the conformance suite, on a local directory, on memory:// and on an
object store (moto's S3 server standing in for S3), and with every read through its data port
over TLS."""

from __future__ import annotations

from pathlib import Path

import fsspec
import pytest

from shuffle_api import Configuration, new_id
from shuffle_api.testing import ConformanceHarness, PipelinedPartitionConformance
from tests.s3_stand_in import S3StandIn
from tests.tls_files import write_tls_files


def _files(url: str) -> list[str]:
    fs, root = fsspec.core.url_to_fs(url)
    fs.invalidate_cache()  # s3fs keeps listings
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
        return ConformanceHarness(config, stored_files=lambda: _files(url), merges=True)


class TestNettyLikeOverTls(PipelinedPartitionConformance):
    @pytest.fixture
    def harness(self, tmp_path: Path) -> ConformanceHarness:
        url = str(tmp_path / "store")
        files = write_tls_files(tmp_path / "tls")
        config = Configuration.load(
            {
                "netty-like.storage.url": url,
                "netty-like.read-from-shared-store": False,
                "netty-like.tls.cert-file": files.cert_file,
                "netty-like.tls.key-file": files.key_file,
                "netty-like.tls.ca-file": files.ca_file,
            },
            environ={},
        )
        return ConformanceHarness(config, stored_files=lambda: _files(url), merges=True)


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
        return ConformanceHarness(config, stored_files=lambda: _files(url), merges=True)


class TestNettyLikeOnObjectStore(PipelinedPartitionConformance):
    @pytest.fixture
    def harness(self, s3_stand_in: S3StandIn) -> ConformanceHarness:
        bucket = f"conformance-{new_id()}"
        s3_stand_in.make_bucket(bucket)
        url = f"s3://{bucket}/shuffle"
        config = Configuration.load({"netty-like.storage.url": url}, environ={})
        return ConformanceHarness(config, stored_files=lambda: _files(url), merges=True)

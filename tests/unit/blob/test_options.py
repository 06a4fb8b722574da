"""``blob.options``: where the blob store is, and the size of each process's blob cache."""

from __future__ import annotations

import pytest

from blob import BLOB_OPTIONS, blob_store_url
from blob.options import BLOB_CACHE_MAX_SIZE, BLOB_STORE_URL
from shuffle_api import ConfigError, Configuration
from shuffle_runtime.store import default_store_url


def test_blob_store_url_defaults_to_a_directory_beside_the_partition_store() -> None:
    configuration = Configuration.load(environ={})

    assert blob_store_url(configuration) == f"{default_store_url()}-blobs"


def test_blob_store_url_uses_the_configured_url() -> None:
    configuration = Configuration.load({"blob.store-url": "memory://shared-blobs"}, environ={})

    assert blob_store_url(configuration) == "memory://shared-blobs"


def test_blob_cache_max_size_defaults_to_100_mib_and_parses_units() -> None:
    assert Configuration.load(environ={}).get(BLOB_CACHE_MAX_SIZE) == 100 << 20
    configured = Configuration.load({"blob.cache.max-size": "64m"}, environ={})
    assert configured.get(BLOB_CACHE_MAX_SIZE) == 64 << 20


def test_blob_cache_max_size_must_be_positive() -> None:
    configuration = Configuration.load({"blob.cache.max-size": 0}, environ={})

    with pytest.raises(ConfigError, match=r"blob\.cache\.max-size"):
        configuration.get(BLOB_CACHE_MAX_SIZE)


def test_blob_options_validate_their_keys() -> None:
    configuration = Configuration.load(
        {"blob.store-url": "memory://x", "blob.cache.max-size": "1k"}, environ={}
    )

    configuration.validate(BLOB_OPTIONS)
    assert BLOB_OPTIONS == (BLOB_STORE_URL, BLOB_CACHE_MAX_SIZE)

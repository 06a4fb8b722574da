"""The coordinator's view of workers' tier stores: a URL a worker names is opened only if it is
a store every host shares (never a local path or a web address), and a store it cannot open
answers "not there" rather than failing the coordinator."""

from __future__ import annotations

from pathlib import Path

import pytest

from external_shuffle.daemon.coordinator.tier_stores import TierStores
from shuffle_api import IntermediateResultPartitionID, ResultPartitionID

PARTITION = ResultPartitionID(IntermediateResultPartitionID("result-a", 0), "attempt-a")


@pytest.mark.parametrize(
    "url",
    ["{tmp}/tier", "file://{tmp}/tier", "memory://tier", "http://127.0.0.1:1/tier", "nosuch://x"],
)
def test_a_tier_url_that_is_not_a_shared_store_is_refused_untouched(
    tmp_path: Path, url: str
) -> None:
    named = url.format(tmp=tmp_path)
    tiers = TierStores()
    assert tiers.statistics(named, PARTITION) is None
    tiers.delete(named, [PARTITION])  # refused: nothing raised, nothing made
    assert list(tmp_path.iterdir()) == []

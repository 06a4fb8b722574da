"""The partition the tests of ``shuffle_runtime.format`` write."""

from __future__ import annotations

import uuid

import pytest

from shuffle_api import IntermediateResultPartitionID, ResultPartitionID


@pytest.fixture
def partition() -> ResultPartitionID:
    return ResultPartitionID(IntermediateResultPartitionID("result-1", 3), uuid.uuid4().hex)

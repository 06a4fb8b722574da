"""A worker's commits since a coordinator last heard of them: each told once, and never more
than the limit kept."""

from __future__ import annotations

from external_shuffle.daemon.worker.commit_watch import CommitWatch
from external_shuffle.wire.messages import Commit
from shuffle_api import IntermediateResultPartitionID, ResultPartitionID


def _commit(index: int) -> Commit:
    partition = ResultPartitionID(IntermediateResultPartitionID("result", index), "attempt")
    return Commit(partition, "app-1")


def test_each_commit_is_taken_once() -> None:
    watch = CommitWatch(limit=10)
    watch.add(_commit(0))
    watch.add(_commit(1))
    assert watch.take() == [_commit(0), _commit(1)]
    assert watch.take() == []
    watch.add(_commit(2))
    assert watch.take() == [_commit(2)]


def test_past_its_limit_it_says_it_overflowed_and_starts_again() -> None:
    watch = CommitWatch(limit=3)
    for index in range(5):
        watch.add(_commit(index))
    assert watch.take() is None
    watch.add(_commit(9))
    assert watch.take() == [_commit(9)]

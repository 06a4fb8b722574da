"""``external_shuffle.daemon.worker.state``: a worker's state in-process, on a real local
store with the clock in the test's hands (pushes, commits, duplicates, abandoned uploads,
draining, application quotas, tiers, and what a restarted worker finds), and its memory
budget for pushed bytes: pushes wait for room (backpressure), one larger than the whole
budget is admitted alone, and a wait past the configured timeout fails clearly."""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from pathlib import Path

import pytest

from external_shuffle.daemon.worker.state import MOVING_FILE, MemoryBudget, WorkerState
from external_shuffle.options import WORKER_MEMORY_BUDGET_TIMEOUT
from external_shuffle.wire.errors import UnavailableError
from shuffle_api import (
    ChecksumMismatchError,
    ConfigError,
    Configuration,
    DataTooLargeError,
    InvalidIdentifierError,
    PartitionNotFoundError,
    PermissionDeniedError,
    QuotaExceededError,
    ResultPartitionID,
    ShuffleError,
    ShuffleServiceClosedError,
    SubpartitionRange,
    new_id,
)
from shuffle_runtime.format import copy_partition, is_readable, partition_directory
from shuffle_runtime.format.manifest import DATA_FILE
from shuffle_runtime.store import Store
from tests.reliability.raw_worker import (
    SUBPARTITIONS,
    BuiltPartition,
    build_partition,
    new_partition,
)

IDLE = 30.0


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(str(tmp_path / "store"))


def _state(store: Store, clock: Clock) -> WorkerState:
    return WorkerState(store, memory_budget=1 << 20, budget_timeout=5, clock=clock)


def _push(
    state: WorkerState, built: BuiltPartition, *, end: bool = True, application: str = ""
) -> None:
    upload = state.begin_push(built.partition, application)
    assert upload is not None
    for sequence, chunk in enumerate(built.chunks()):
        assert state.append(upload, sequence, memoryview(chunk))
    if end:
        state.end_push(upload)


def _commit(state: WorkerState, built: BuiltPartition) -> None:
    state.commit(built.partition, "app-1", built.index, built.manifest)


def test_a_pushed_and_committed_partition_is_held_counted_and_told_to_watchers(
    store: Store, clock: Clock
) -> None:
    state = _state(store, clock)
    watch = state.watch_commits()
    built = build_partition()
    _push(state, built)
    assert state.committed_partitions() == []
    _commit(state, built)
    _commit(state, built)  # a retried commit changes nothing
    assert state.committed_partitions() == [built.partition]
    committed = state.committed(built.partition)
    assert committed is not None and committed.stored_bytes == len(built.data)
    assert committed.statistics().rows_per_subpartition == built.statistics.rows_per_subpartition
    load = state.load()
    assert (load.partitions, load.stored_bytes) == (1, len(built.data))
    assert state.stored_bytes == len(built.data) and state.buffered_bytes == 0
    assert [commit.partition for commit in watch.take() or []] == [built.partition]
    # Pushed again (a retried task's duplicate stream): nothing to write.
    assert state.begin_push(built.partition) is None


def test_a_message_sent_twice_is_written_once_and_a_gap_is_refused(
    store: Store, clock: Clock
) -> None:
    state = _state(store, clock)
    built = build_partition()
    first, *others = built.chunks()
    upload = state.begin_push(built.partition)
    assert upload is not None
    assert state.append(upload, 0, memoryview(first))
    assert not state.append(upload, 0, memoryview(first))
    assert upload.duplicates == 1 and upload.size == len(first)
    if others:
        with pytest.raises(ShuffleError, match="skipped messages"):
            state.append(upload, 2, memoryview(others[0]))


def test_a_commit_that_disagrees_with_the_bytes_is_refused_and_they_stay(
    store: Store, clock: Clock
) -> None:
    state = _state(store, clock)
    built, other = build_partition(), build_partition(rows=100)
    _push(state, built)
    with pytest.raises(ShuffleError):
        state.commit(built.partition, "app-1", other.index, other.manifest)
    assert state.committed_partitions() == []
    _commit(state, built)  # the right index and manifest still commit it
    assert state.committed_partitions() == [built.partition]


def test_an_upload_is_reaped_only_when_no_stream_carried_it_for_the_idle_timeout(
    store: Store, clock: Clock
) -> None:
    state = _state(store, clock)
    open_stream, ended = build_partition(), build_partition()
    _push(state, open_stream, end=False)
    _push(state, ended)
    clock.now += IDLE - 1
    assert state.reap_uploads(IDLE) == 0
    clock.now += 2
    assert state.reap_uploads(IDLE) == 1  # the ended one; the other's stream is open
    assert not Path(partition_directory(store, ended.partition)).exists()
    _commit(state, open_stream)
    assert state.committed_partitions() == [open_stream.partition]


def test_a_draining_worker_takes_no_new_partition_but_finishes_those_under_way(
    store: Store, clock: Clock
) -> None:
    state = _state(store, clock)
    under_way, new = build_partition(), build_partition()
    _push(state, under_way)
    assert state.decommission(cancel=False, asked_by="an operator") == 0
    assert state.draining and state.load().decommissioning
    with pytest.raises(UnavailableError):
        state.begin_push(new.partition)
    assert state.begin_push(under_way.partition) is not None  # a retried push goes on
    _commit(state, under_way)
    assert state.decommission(cancel=True, asked_by="an operator") == 1
    assert not state.draining
    state.drain()  # SIGTERM: for good
    with pytest.raises(ShuffleServiceClosedError):
        state.decommission(cancel=True, asked_by="an operator")
    assert state.draining


def test_a_restarted_worker_is_the_same_worker_with_its_committed_partitions_only(
    store: Store, clock: Clock
) -> None:
    state = _state(store, clock)
    committed, cut_off = build_partition(), build_partition()
    _push(state, committed)
    _commit(state, committed)
    _push(state, cut_off)  # the process dies before its commit
    restarted = _state(store, clock)
    assert restarted.worker_id == state.worker_id
    assert restarted.committed_partitions() == [committed.partition]
    assert not Path(partition_directory(store, cut_off.partition)).exists()


def test_a_partition_deleted_behind_the_workers_back_is_forgotten(
    store: Store, clock: Clock
) -> None:
    state = _state(store, clock)
    built = build_partition()
    _push(state, built)
    _commit(state, built)
    shutil.rmtree(partition_directory(store, built.partition))
    assert state.committed(built.partition) is None
    assert state.committed_partitions() == []


def test_a_release_deletes_uploads_and_committed_partitions(store: Store, clock: Clock) -> None:
    state = _state(store, clock)
    committed, pushed = build_partition(), build_partition()
    _push(state, committed)
    _commit(state, committed)
    _push(state, pushed)
    assert state.release([committed.partition, pushed.partition, build_partition().partition]) == 2
    assert state.committed_partitions() == []
    for built in (committed, pushed):
        assert not Path(partition_directory(store, built.partition)).exists()


def test_an_application_quota_refuses_the_push_past_it_and_deletes_what_arrived(
    store: Store, clock: Clock
) -> None:
    kept, refused, other = (build_partition(rows=6_000) for _ in range(3))
    assert len(refused.chunks()) > 2
    quota = len(kept.data) + len(refused.data) // 2
    state = WorkerState(
        store, memory_budget=1 << 20, budget_timeout=5, application_quota=quota, clock=clock
    )
    _push(state, kept, application="app-a")
    state.commit(kept.partition, "app-a", kept.index, kept.manifest)
    upload = state.begin_push(refused.partition, "app-a")
    assert upload is not None
    with pytest.raises(InvalidIdentifierError, match="app-a"):
        state.begin_push(refused.partition, "app-b")  # another application's stream
    appended = 0
    with pytest.raises(QuotaExceededError, match=f"app-a .* quota of {quota}"):
        for sequence, chunk in enumerate(refused.chunks()):
            state.append(upload, sequence, memoryview(chunk))
            appended += 1
    assert 0 < appended < len(refused.chunks())
    # Nothing half written: the refused attempt is gone, what the application holds stays.
    assert not Path(partition_directory(store, refused.partition)).exists()
    assert state.committed_partitions() == [kept.partition]
    assert state.held_bytes() == {"app-a": len(kept.data)}
    # Each application has a quota of its own; a release gives the bytes back.
    _push(state, other, application="app-b")
    assert state.held_bytes() == {"app-a": len(kept.data), "app-b": len(other.data)}
    state.release([kept.partition])
    _push(state, refused, application="app-a")
    assert state.held_bytes() == {"app-a": len(refused.data), "app-b": len(other.data)}
    # Near the quota, a message sent again is a duplicate, not a refusal.
    upload = state.begin_push(refused.partition, "app-a")
    assert upload is not None
    assert not state.append(upload, 0, memoryview(refused.chunks()[0]))


def test_what_an_application_holds_follows_deletes_releases_and_restarts(
    store: Store, clock: Clock
) -> None:
    state = _state(store, clock)
    kept, lost, dropped = (build_partition() for _ in range(3))
    for built in (kept, lost):
        _push(state, built, application="app-a")
        state.commit(built.partition, "app-a", built.index, built.manifest)
    assert state.held_bytes() == {"app-a": len(kept.data) + len(lost.data)}
    shutil.rmtree(partition_directory(store, lost.partition))  # behind the worker's back
    assert state.committed(lost.partition) is None
    assert state.held_bytes() == {"app-a": len(kept.data)}
    # A stream that goes on writing an upload released under it keeps nothing.
    upload = state.begin_push(dropped.partition, "app-a")
    assert upload is not None
    state.release([dropped.partition])
    with pytest.raises(PartitionNotFoundError, match="released"):
        state.append(upload, 0, memoryview(dropped.chunks()[0]))
    assert not Path(partition_directory(store, dropped.partition)).exists()
    # A restarted worker knows whose each partition is.
    restarted = _state(store, clock)
    assert restarted.owner(kept.partition) == "app-a"
    assert restarted.held_bytes() == {"app-a": len(kept.data)}


def _tiered_state(store: Store, clock: Clock, tier: Store) -> WorkerState:
    return WorkerState(store, memory_budget=1 << 20, budget_timeout=5, tier=tier, clock=clock)


@pytest.fixture
def tier() -> Store:
    return Store(f"memory://tier-{new_id()}")


def test_past_the_high_water_mark_the_oldest_partitions_move_to_the_tier_and_are_served_there(
    store: Store, clock: Clock, tier: Store
) -> None:
    state = _tiered_state(store, clock, tier)
    watch = state.watch_commits()
    built = [build_partition(rows=400 * (i + 1)) for i in range(3)]
    for each in built:
        _push(state, each)
        _commit(state, each)
    watch.take()
    sizes = [len(each.data) for each in built]
    assert state.partitions_to_move(sum(sizes), 0) == []  # not past the mark
    # Past it: the oldest go until what is left is within the low mark.
    chosen = state.partitions_to_move(sum(sizes) - 1, sizes[2])
    assert chosen == [built[0].partition, built[1].partition]
    for partition in chosen:
        assert state.move_to_tier(partition) > 0
        assert state.move_to_tier(partition) == 0  # moved already
    assert [(c.partition, c.on_tier) for c in watch.take() or []] == [(p, True) for p in chosen]
    assert state.stored_bytes == sizes[2]
    assert state.partitions_on_tier() == chosen
    assert state.load().partitions_on_tier == 2
    assert state.partitions_to_move(sum(sizes) - 1, sizes[2]) == []
    for each in built[:2]:
        here = partition_directory(store, each.partition)
        assert sorted(os.listdir(here)) == [
            "application",
            "manifest.json",
            "moved",
        ]  # data, index went
        assert is_readable(tier, each.partition)
        every = SubpartitionRange(0, SUBPARTITIONS - 1)
        reader = state.open_reader(each.partition, every)
        assert sum(batch.num_rows for batch in reader.read(every)) == sum(
            each.statistics.rows_per_subpartition
        )
    restarted = _tiered_state(store, clock, tier)  # finds what moved, and where
    assert sorted(restarted.partitions_on_tier()) == sorted(chosen)
    assert sorted(restarted.committed_partitions()) == sorted(each.partition for each in built)
    assert restarted.release([built[0].partition]) == 1
    assert not is_readable(tier, built[0].partition)


def test_a_decommissioned_worker_moves_everything_and_counts_what_is_left(
    store: Store, clock: Clock, tier: Store
) -> None:
    state = _tiered_state(store, clock, tier)
    built = [build_partition(), build_partition()]
    for each in built:
        _push(state, each)
        _commit(state, each)
    assert state.partitions_to_move(0, 0) == []  # no high-water mark, no decommission
    assert state.decommission(cancel=False, asked_by="an operator") == 2
    assert state.partitions_to_move(0, 0) == [each.partition for each in built]
    state.move_to_tier(built[0].partition)
    assert state.decommission(cancel=False, asked_by="an operator") == 1


def test_a_restart_without_the_tier_its_partitions_moved_to_is_refused_naming_it(
    store: Store, clock: Clock, tier: Store, tmp_path: Path
) -> None:
    """Rows only the tier holds are not forgotten: a worker restarted without that tier (or
    with another) refuses to start and says which to give it; with it, it serves them."""
    state, built = _committed_on_tiered(store, clock, tier)
    state.move_to_tier(built.partition)
    for restarted_tier in (None, Store(str(tmp_path / "another-tier"))):
        with pytest.raises(ConfigError, match=f"tier-url={re.escape(tier.url)}"):
            WorkerState(
                store, memory_budget=1 << 20, budget_timeout=5, tier=restarted_tier, clock=clock
            )
    assert _tiered_state(store, clock, tier).partitions_on_tier() == [built.partition]


def test_a_partition_of_no_rows_moves_too(store: Store, clock: Clock, tier: Store) -> None:
    state = _tiered_state(store, clock, tier)
    empty = build_partition(rows=0)
    _push(state, empty)
    _commit(state, empty)
    assert state.move_to_tier(empty.partition) == 0  # no data bytes, but moved
    assert state.partitions_on_tier() == [empty.partition]
    assert is_readable(tier, empty.partition)


def test_a_tier_that_is_or_holds_the_store_is_refused(store: Store, clock: Clock) -> None:
    for tier_url in (store.url, store.url + "/below", str(Path(store.url).parent)):
        with pytest.raises(ConfigError, match="overlaps"):
            _tiered_state(store, clock, Store(tier_url))


def _committed_on_tiered(
    store: Store, clock: Clock, tier: Store
) -> tuple[WorkerState, BuiltPartition]:
    state = _tiered_state(store, clock, tier)
    built = build_partition()
    _push(state, built)
    _commit(state, built)
    return state, built


def test_a_restart_after_a_cut_off_move_keeps_the_partition_here_and_clears_the_tier(
    store: Store, clock: Clock, tier: Store
) -> None:
    _, built = _committed_on_tiered(store, clock, tier)
    # What a move cut off after its copy, before its marker, leaves: both copies, and the mark.
    copy_partition(store, tier, built.partition)
    directory = partition_directory(store, built.partition)
    Path(directory, MOVING_FILE).touch()
    restarted = _tiered_state(store, clock, tier)
    assert restarted.committed_partitions() == [built.partition]
    assert restarted.partitions_on_tier() == []
    assert not is_readable(tier, built.partition)
    assert not Path(directory, MOVING_FILE).exists()


def test_a_moved_partition_whose_manifest_here_is_gone_does_not_stop_a_restart(
    store: Store, clock: Clock, tier: Store
) -> None:
    state, built = _committed_on_tiered(store, clock, tier)
    state.move_to_tier(built.partition)
    Path(partition_directory(store, built.partition), "manifest.json").unlink()
    assert _tiered_state(store, clock, tier).committed_partitions() == []


def test_a_reservation_waits_until_earlier_ones_leave_room() -> None:
    budget = MemoryBudget(100, timeout=10.0)
    admitted = threading.Event()

    def second() -> None:
        with budget.reserve(60):
            admitted.set()

    with budget.reserve(60):
        waiting = threading.Thread(target=second)
        waiting.start()
        assert not admitted.wait(0.2)  # 60 + 60 > 100: it waits
        assert budget.used == 60
    assert admitted.wait(10)
    waiting.join(10)
    assert budget.used == 0


def test_a_reservation_larger_than_the_budget_is_admitted_alone() -> None:
    budget = MemoryBudget(100, timeout=10.0)
    with budget.reserve(500):
        assert budget.used == 500
    assert budget.used == 0


def test_a_budget_full_past_the_timeout_fails_naming_the_budget_and_the_wait() -> None:
    timeout = Configuration.load({WORKER_MEMORY_BUDGET_TIMEOUT.key: "0.2"}).get(
        WORKER_MEMORY_BUDGET_TIMEOUT
    )
    budget = MemoryBudget(100, timeout=timeout)
    with budget.reserve(80):
        started = time.monotonic()
        with (
            pytest.raises(DataTooLargeError, match=r"\(100 bytes\) stayed full for 0.2 s"),
            budget.reserve(40),
        ):
            pass
        assert 0.15 <= time.monotonic() - started < 5
    assert budget.used == 0


# --- merges -------------------------------------------------------------------------------------


def _committed_sources(
    state: WorkerState, count: int, application: str = "app-1"
) -> list[BuiltPartition]:
    built = [build_partition(rows=1_000) for _ in range(count)]
    for each in built:
        _push(state, each, application=application)
        state.commit(each.partition, application, each.index, each.manifest)
    return built


def _rows_of(state: WorkerState, partition: ResultPartitionID, subpartition: int) -> list[int]:
    one = SubpartitionRange.single(subpartition)
    return [row for batch in state.open_reader(partition, one).read(one) for row in batch["row"]]


def test_a_merge_commits_the_sources_runs_in_order_once(store: Store, clock: Clock) -> None:
    state = _state(store, clock)
    sources = _committed_sources(state, 3)
    watch = state.watch_commits()
    merged = new_partition()
    ids = [each.partition for each in sources]
    statistics = state.merge(merged, "app-1", ids, SUBPARTITIONS)
    for subpartition in range(SUBPARTITIONS):
        assert _rows_of(state, merged, subpartition) == [
            row for each in ids for row in _rows_of(state, each, subpartition)
        ]
        assert statistics.rows_per_subpartition[subpartition] == sum(
            each.statistics.rows_per_subpartition[subpartition] for each in sources
        )
    committed = state.committed(merged)
    assert committed is not None and committed.application_id == "app-1"
    assert [commit.partition for commit in watch.take() or []] == [merged]
    assert state.held_bytes() == {
        "app-1": sum(len(each.data) for each in sources) + committed.stored_bytes
    }
    # A retried merge writes nothing and answers the same.
    assert state.merge(merged, "app-1", ids, SUBPARTITIONS) == statistics
    assert state.release([merged]) == 1
    assert sorted(state.committed_partitions()) == sorted(ids)


@pytest.mark.parametrize("fault", ["missing", "another application's"])
def test_a_merge_of_a_source_not_held_for_it_writes_nothing(
    store: Store, clock: Clock, fault: str
) -> None:
    state = _state(store, clock)
    sources = _committed_sources(state, 2)
    other = _committed_sources(state, 1, application="app-2")[0].partition
    held = state.held_bytes()
    merged = new_partition()
    named = new_partition() if fault == "missing" else other
    error: type[ShuffleError] = (
        PartitionNotFoundError if fault == "missing" else PermissionDeniedError
    )
    with pytest.raises(error, match=str(named.partition_id)):
        state.merge(merged, "app-1", [sources[0].partition, named], SUBPARTITIONS)
    assert state.committed(merged) is None
    assert not store.exists(partition_directory(store, merged))
    assert state.held_bytes() == held


def test_a_corrupt_source_fails_the_merge_and_leaves_nothing(store: Store, clock: Clock) -> None:
    state = _state(store, clock)
    sources = _committed_sources(state, 2)
    data = Path(partition_directory(store, sources[1].partition)) / DATA_FILE
    content = bytearray(data.read_bytes())
    content[len(content) // 2] ^= 0xFF
    data.write_bytes(bytes(content))
    merged = new_partition()
    with pytest.raises(ChecksumMismatchError):
        state.merge(merged, "app-1", [each.partition for each in sources], SUBPARTITIONS)
    assert state.committed(merged) is None
    assert not store.exists(partition_directory(store, merged))


def test_a_merge_past_the_quota_or_on_a_draining_worker_is_refused(
    store: Store, clock: Clock
) -> None:
    state = _state(store, clock)
    sources = _committed_sources(state, 2)
    ids = [each.partition for each in sources]
    sources_bytes = sum(len(each.data) for each in sources)
    quota = WorkerState(
        store,
        memory_budget=1 << 20,
        budget_timeout=5,
        application_quota=sources_bytes + sources_bytes // 2,
        clock=clock,
    )  # the same store, restarted with a quota: the sources are held, half as much again not
    merged = new_partition()
    with pytest.raises(QuotaExceededError, match="the merge into"):
        quota.merge(merged, "app-1", ids, SUBPARTITIONS)
    assert quota.held_bytes() == {"app-1": sources_bytes}
    state.drain()
    with pytest.raises(UnavailableError):
        state.merge(merged, "app-1", ids, SUBPARTITIONS)
    assert not store.exists(partition_directory(store, merged))


def test_a_merge_naming_its_sources_twice_or_too_many_is_refused(
    store: Store, clock: Clock
) -> None:
    state = _state(store, clock)
    ids = [each.partition for each in _committed_sources(state, 2)]
    merged = new_partition()
    with pytest.raises(InvalidIdentifierError):
        state.merge(merged, "app-1", [ids[0], ids[0]], SUBPARTITIONS)
    with pytest.raises(InvalidIdentifierError):
        state.merge(merged, "app-1", [*ids, merged], SUBPARTITIONS)
    with pytest.raises(DataTooLargeError):
        state.merge(merged, "app-1", [new_partition() for _ in range(10_001)], SUBPARTITIONS)
    assert state.committed(merged) is None

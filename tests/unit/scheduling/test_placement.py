"""Placement strategies (scheduling.placement): a batch spreads evenly, heaviest first, over
the least-loaded targets; replicas are distinct; local input is preferred when asked."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from scheduling.placement import (
    PLACEMENT_STRATEGIES,
    LocalInputPreferredPlacement,
    NoPlacementTargetError,
    PlacementRequest,
    PlacementStrategy,
    PlacementTarget,
    TaskBalancedPlacement,
    new_placement_strategy,
)
from shuffle_api import ConfigError, InvalidOperationError


def targets(*ids: str, host: str = "h") -> list[PlacementTarget]:
    return [PlacementTarget(target_id, host) for target_id in ids]


def requests(count: int, *, weight: float = 1, replicas: int = 1) -> list[PlacementRequest]:
    return [PlacementRequest(f"r{i}", weight=weight, replicas=replicas) for i in range(count)]


def first_replica_counts(placed: dict[str, tuple[str, ...]]) -> Counter[str]:
    return Counter(chosen[0] for chosen in placed.values())


# --- task-balanced ------------------------------------------------------------------------------


def test_1000_equal_requests_on_7_targets_give_counts_that_differ_by_at_most_one() -> None:
    ids = [f"t{i}" for i in range(7)]
    placed = TaskBalancedPlacement().place(requests(1000), targets(*ids))
    counts = first_replica_counts(placed)
    assert set(counts) == set(ids)
    assert sum(counts.values()) == 1000
    # 1000 = 7 * 142 + 6: six targets take 143 and the last by id takes 142.
    assert sorted(counts.values()) == [142] + [143] * 6
    assert counts["t6"] == 142


def test_weighted_batch_is_placed_heaviest_first_on_the_least_loaded_target() -> None:
    weights = [7, 5, 4, 3, 3, 2]
    batch = [PlacementRequest(f"r{i}", weight=w) for i, w in enumerate(weights)]
    placed = TaskBalancedPlacement().place(batch, targets("a", "b", "c"))
    # By hand: 7->a (all empty, lowest id), 5->b, 4->c; 3->c (4 is least), 3->b (5);
    # 2->a (a and c both at 7; a holds fewer items).
    assert placed == {
        "r0": ("a",),
        "r1": ("b",),
        "r2": ("c",),
        "r3": ("c",),
        "r4": ("b",),
        "r5": ("a",),
    }


def test_batch_order_does_not_matter_heaviest_goes_first_whatever_its_position() -> None:
    weights = [2, 3, 7, 3, 5, 4]
    batch = [PlacementRequest(f"w{w}-{i}", weight=w) for i, w in enumerate(weights)]
    placed = TaskBalancedPlacement().place(batch, targets("a", "b", "c"))
    loads = Counter[str]()
    for request in batch:
        loads[placed[request.request_id][0]] += int(request.weight)
    assert loads == {"a": 9, "b": 8, "c": 7}
    assert placed["w7-2"] == ("a",)


def test_result_keeps_the_callers_request_order() -> None:
    batch = [PlacementRequest("light", weight=1), PlacementRequest("heavy", weight=9)]
    placed = TaskBalancedPlacement().place(batch, targets("a", "b"))
    assert list(placed) == ["light", "heavy"]
    assert placed == {"heavy": ("a",), "light": ("b",)}


def test_preloaded_target_gets_nothing_until_the_others_catch_up() -> None:
    pool = [PlacementTarget("a", "h", load=6), *targets("b", "c")]
    placed = TaskBalancedPlacement().place(requests(12), pool)
    assert first_replica_counts(placed) == {"b": 6, "c": 6}


def test_equal_loads_go_to_the_target_holding_fewer_items() -> None:
    pool = [PlacementTarget("a", "h", load=10, count=5), PlacementTarget("b", "h", load=10)]
    placed = TaskBalancedPlacement().place(requests(1), pool)
    assert placed == {"r0": ("b",)}


def test_replicas_go_to_distinct_targets_and_spread_evenly() -> None:
    placed = TaskBalancedPlacement().place(requests(30, replicas=2), targets("a", "b", "c"))
    assert all(len(set(chosen)) == 2 for chosen in placed.values())
    held = Counter(target for chosen in placed.values() for target in chosen)
    assert held == {"a": 20, "b": 20, "c": 20}


def test_fewer_targets_than_replicas_places_on_every_target_once() -> None:
    placed = TaskBalancedPlacement().place(requests(3, replicas=3), targets("a", "b"))
    assert all(sorted(chosen) == ["a", "b"] for chosen in placed.values())


@pytest.mark.parametrize("strategy", [TaskBalancedPlacement(), LocalInputPreferredPlacement()])
def test_no_target_raises_no_placement_target_error(strategy: PlacementStrategy) -> None:
    with pytest.raises(NoPlacementTargetError, match="no target"):
        strategy.place(requests(1), [])


def test_placement_is_deterministic_whatever_the_order_of_targets() -> None:
    pool = [
        PlacementTarget(f"t{i}", f"h{i % 3}", load=(i * 37) % 11, count=i % 4) for i in range(9)
    ]
    batch = [
        PlacementRequest(f"r{i}", f"h{i % 4}", weight=(i * 13) % 7, replicas=1 + i % 3)
        for i in range(200)
    ]
    for strategy in (TaskBalancedPlacement(), LocalInputPreferredPlacement()):
        expected = strategy.place(batch, pool)
        shuffled = list(pool)
        random.Random(7).shuffle(shuffled)
        assert strategy.place(batch, shuffled) == expected
        assert strategy.place(batch, pool) == expected


def test_invalid_requests_and_targets_are_rejected() -> None:
    with pytest.raises(InvalidOperationError, match="replicas must be >= 1"):
        PlacementRequest("r", replicas=0)
    with pytest.raises(InvalidOperationError, match="weight must be finite"):
        PlacementRequest("r", weight=-1)
    with pytest.raises(InvalidOperationError, match="requests named more than once"):
        TaskBalancedPlacement().place([PlacementRequest("r"), PlacementRequest("r")], targets("a"))
    with pytest.raises(InvalidOperationError, match="targets named more than once"):
        TaskBalancedPlacement().place(requests(1), targets("a", "a"))


# --- local-input-preferred ----------------------------------------------------------------------


def test_local_input_preferred_picks_the_least_loaded_target_on_the_requests_host() -> None:
    pool = [
        PlacementTarget("a", "h1", load=5),
        PlacementTarget("b", "h1", load=2),
        PlacementTarget("c", "h2", load=0),
    ]
    placed = LocalInputPreferredPlacement().place([PlacementRequest("r", "h1")], pool)
    assert placed == {"r": ("b",)}


def test_local_input_preferred_puts_other_replicas_on_other_hosts_first() -> None:
    pool = [
        PlacementTarget("a", "h1", load=0),
        PlacementTarget("b", "h1", load=1),
        PlacementTarget("c", "h2", load=9),
    ]
    strategy = LocalInputPreferredPlacement()
    assert strategy.place([PlacementRequest("r", "h1", replicas=2)], pool) == {"r": ("a", "c")}
    # Not enough targets elsewhere: the rest on the request's own host.
    assert strategy.place([PlacementRequest("r", "h1", replicas=3)], pool) == {"r": ("a", "c", "b")}


def test_local_input_preferred_without_a_local_target_is_task_balanced() -> None:
    pool = [
        PlacementTarget("a", "h1", load=3),
        PlacementTarget("b", "h1", load=1),
        PlacementTarget("c", "h2", load=2),
    ]
    batch = [PlacementRequest(f"r{i}", "elsewhere", weight=1 + i % 3) for i in range(20)]
    local = LocalInputPreferredPlacement().place(batch, pool)
    assert local == TaskBalancedPlacement().place(batch, pool)
    assert local["r2"] == ("b",)  # the heaviest request first, to the least loaded target


def test_local_input_preferred_spreads_a_batch_over_the_local_targets() -> None:
    pool = [*targets("a", "b", host="h1"), *targets("c", host="h2")]
    batch = [PlacementRequest(f"r{i}", "h1") for i in range(10)]
    placed = LocalInputPreferredPlacement().place(batch, pool)
    assert first_replica_counts(placed) == {"a": 5, "b": 5}


# --- by name ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("task-balanced", TaskBalancedPlacement),
        ("local-input-preferred", LocalInputPreferredPlacement),
        ("balanced", TaskBalancedPlacement),
        ("local-preferred", LocalInputPreferredPlacement),
    ],
)
def test_strategies_are_made_by_name_including_the_external_shuffle_names(
    name: str, kind: type[PlacementStrategy]
) -> None:
    assert type(new_placement_strategy(name)) is kind


def test_unknown_strategy_name_names_the_config_key_and_lists_the_choices() -> None:
    key = "external-shuffle.coordinator.placement"
    with pytest.raises(ConfigError) as raised:
        new_placement_strategy("round-robin", config_key=key)
    message = str(raised.value)
    assert key in message
    assert "'round-robin'" in message
    assert all(name in message for name in PLACEMENT_STRATEGIES)

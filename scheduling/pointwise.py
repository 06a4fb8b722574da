"""Who reads whom over a pointwise exchange of S producers and T consumers (Flink's
EdgeManagerBuildUtil): with S >= T consumer i reads partitions [floor(iS/T), floor((i+1)S/T) - 1];
with S < T partition p feeds consumers [ceil(pT/S), ceil((p+1)T/S) - 1], which split its
subpartitions among them."""

from __future__ import annotations

from shuffle_api import InvalidOperationError

__all__ = ["consumers_of_partition", "partitions_of_consumer"]


def _check(index: int, count: int, what: str) -> None:
    if not 0 <= index < count:
        raise InvalidOperationError(f"{what} {index} outside [0, {count})")


def _ceil_div(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


def partitions_of_consumer(consumer: int, producers: int, consumers: int) -> range:
    """The partitions consumer ``consumer`` reads."""
    _check(consumer, consumers, "consumer")
    if producers >= consumers:
        return range(consumer * producers // consumers, (consumer + 1) * producers // consumers)
    partition = consumer * producers // consumers
    return range(partition, partition + 1)


def consumers_of_partition(partition: int, producers: int, consumers: int) -> range:
    """The consumers that read partition ``partition``."""
    _check(partition, producers, "partition")
    if producers >= consumers:
        consumer = _ceil_div((partition + 1) * consumers, producers) - 1
        return range(consumer, consumer + 1)
    return range(
        _ceil_div(partition * consumers, producers),
        _ceil_div((partition + 1) * consumers, producers),
    )

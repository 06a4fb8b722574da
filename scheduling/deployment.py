"""Consumers' deployment descriptors that carry a reference, never a copy, of their inputs'
shuffle descriptors (after Flink's CachedShuffleDescriptors and blob offload).

Per consumed group the shuffle descriptors are serialized (protobuf) and zstd-compressed once,
and every consumer of the group shares that one ``bytes`` object. When ``len(group) x
consumers`` reaches the offload threshold the compressed list goes to the blob store and the
consumers carry only its key. A rerun producer or a released group makes the shared list stale:
:meth:`DescriptorCache.invalidate` drops it and deletes its blob.
"""

from __future__ import annotations

import functools
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import zstandard

from blob import BlobStore, process_blob_cache
from scheduling.groups import ConsumedPartitionGroup, ExchangeGroups, PartitionGroups
from scheduling.parallelism import split_evenly
from scheduling.skew import ConsumerPlan, InputSlice, ProducerRange
from shuffle_api import (
    InputGateDeploymentDescriptor,
    InvalidOperationError,
    ResultPartitionType,
    SerializationError,
    ShuffleDescriptor,
    ShuffleDescriptorGroup,
    SubpartitionRange,
    deserialize,
    serialize,
)

__all__ = [
    "ConsumerDeploymentDescriptor",
    "ConsumerReads",
    "DescriptorCache",
    "GateReference",
    "GroupInput",
    "InlineDescriptors",
    "OffloadedDescriptors",
    "SharedDescriptors",
    "consumer_deployments",
    "even_reads",
    "planned_reads",
    "resolve_gate",
]

# Flink's TaskManager keeps at most 100 decoded groups.
_DECODED_GROUPS = 100


@dataclass(frozen=True, slots=True)
class InlineDescriptors:
    """The compressed list itself; every consumer of the group holds the same object."""

    compressed: bytes


@dataclass(frozen=True, slots=True)
class OffloadedDescriptors:
    """The compressed list lives in the blob store at ``blob_store_url`` under ``blob_key``."""

    blob_key: str
    blob_store_url: str


SharedDescriptors = InlineDescriptors | OffloadedDescriptors


@dataclass(frozen=True, slots=True)
class GroupInput:
    """What every consumer of one consumed group reads from: one object per group, shared by
    the references of all its consumers."""

    result_id: str
    partition_type: ResultPartitionType
    descriptors: SharedDescriptors


@dataclass(frozen=True, slots=True)
class GateReference:
    """One input of a consumer: subpartitions ``subpartitions`` of ``group``'s partitions
    (only ``producers``, positions in the group's list, when a skewed subpartition is split
    among consumers; ``None``: all of them)."""

    group: GroupInput
    subpartitions: SubpartitionRange
    producers: ProducerRange | None = None


@dataclass(frozen=True, slots=True)
class ConsumerDeploymentDescriptor:
    """Consumer ``index`` of stage ``stage``: one reference per input, in input order."""

    stage: str
    index: int
    inputs: tuple[GateReference, ...]


class DescriptorCache:
    """Driver side: the shared compressed descriptor list of each consumed group."""

    def __init__(
        self,
        *,
        blob_store: BlobStore | None,
        offload_threshold: int,
    ) -> None:
        self._blob_store = blob_store
        self._offload_threshold = offload_threshold
        # Level 3: most of the ratio of the higher levels at a fraction of their time.
        self._compressor = zstandard.ZstdCompressor(level=3)
        # Groups hash by identity: each is one object of the job's PartitionGroups.
        self._shared: dict[ConsumedPartitionGroup, SharedDescriptors] = {}
        # Groups with the same descriptors share one content-addressed blob.
        self._groups_per_blob: Counter[str] = Counter()
        self._lock = threading.Lock()

    def shared(
        self,
        group: ConsumedPartitionGroup,
        descriptors_of: Callable[[ConsumedPartitionGroup], Sequence[ShuffleDescriptor]],
    ) -> SharedDescriptors:
        """The group's shared list, built on first use from ``descriptors_of(group)`` (one
        per partition of the group, in partition order)."""
        with self._lock:
            found = self._shared.get(group)
            if found is not None:
                return found
            descriptors = descriptors_of(group)
            if len(descriptors) != len(group.partitions):
                raise InvalidOperationError(
                    f"group {group.key} has {len(group.partitions)} partitions but"
                    f" {len(descriptors)} descriptors were given"
                )
            compressed = self._compressor.compress(
                serialize(ShuffleDescriptorGroup(tuple(descriptors)))
            )
            shared: SharedDescriptors = InlineDescriptors(compressed)
            if (
                self._blob_store is not None
                and len(group.partitions) * group.number_of_consumers >= self._offload_threshold
            ):
                shared = OffloadedDescriptors(
                    self._blob_store.put(compressed), self._blob_store.url
                )
                self._groups_per_blob[shared.blob_key] += 1
            self._shared[group] = shared
            return shared

    def invalidate(self, group: ConsumedPartitionGroup) -> None:
        """Forget the group's list (released, or a producer of it rerun) and delete its blob."""
        with self._lock:
            found = self._shared.pop(group, None)
            if not isinstance(found, OffloadedDescriptors):
                return
            self._groups_per_blob[found.blob_key] -= 1
            unused = self._groups_per_blob[found.blob_key] == 0
            if unused:
                del self._groups_per_blob[found.blob_key]
        if unused:
            assert self._blob_store is not None
            self._blob_store.delete(found.blob_key)

    def clear(self) -> None:
        with self._lock:
            groups = list(self._shared)
        for group in groups:
            self.invalidate(group)


ConsumerReads = Callable[[int, ExchangeGroups], Sequence[InputSlice]]
"""What every consumer reads of its input number ``input_index`` (``groups``: that input's
exchange), by consumer index; producers counted within the group the consumer reads."""


def even_reads(subpartitions: int) -> ConsumerReads:
    """Flink's default over partitions of ``subpartitions`` subpartitions: all-to-all consumer
    k of N reads ``[floor(kS/N), floor((k+1)S/N) - 1]`` of every partition; a pointwise
    consumer reads all of each of its partitions or, where several consumers share one
    partition, its share of the subpartitions."""

    def reads(input_index: int, groups: ExchangeGroups) -> Sequence[InputSlice]:
        # The consumers of a group split its subpartitions among them: all of one
        # exchange's consumers when all-to-all, one consumer or a few when pointwise.
        slices: list[InputSlice] = []
        for group, readers in zip(groups.consumed, groups.consumer_groups, strict=True):
            producers = ProducerRange(0, len(group.partitions) - 1)
            shares = split_evenly(subpartitions, len(readers.consumers))
            slices += (InputSlice(share, producers) for share in shares)
        return slices

    return reads


def planned_reads(plan: ConsumerPlan) -> ConsumerReads:
    """Consumer t reads what task t of an adaptive ``plan`` reads (all-to-all inputs)."""

    def reads(input_index: int, groups: ExchangeGroups) -> Sequence[InputSlice]:
        return [task.inputs[input_index] for task in plan.tasks]

    return reads


def consumer_deployments(
    partition_groups: PartitionGroups,
    stage: str,
    cache: DescriptorCache,
    descriptors_of: Callable[[ConsumedPartitionGroup], Sequence[ShuffleDescriptor]],
    reads: ConsumerReads,
) -> list[ConsumerDeploymentDescriptor]:
    """Every consumer vertex of ``stage`` with one reference per input exchange. The shared
    list of a group is built once, however many consumers read it."""
    parallelism = partition_groups.graph.stage(stage).parallelism
    references_per_input: list[list[GateReference]] = []
    for input_index, exchange in enumerate(partition_groups.graph.inputs_of(stage)):
        groups = partition_groups.of_exchange(exchange)
        slices = reads(input_index, groups)
        if len(slices) != parallelism:
            raise InvalidOperationError(
                f"{len(slices)} reads of input {exchange.result_id} for {parallelism} consumers"
            )
        references: list[GateReference] = []
        # Pairs come in consumer order, each over a run of consumers; walking them gives
        # every consumer its group with no per-consumer lookup.
        for group, readers in zip(groups.consumed, groups.consumer_groups, strict=True):
            shared = GroupInput(
                exchange.result_id, group.partition_type, cache.shared(group, descriptors_of)
            )
            whole = ProducerRange(0, len(group.partitions) - 1)
            references += [
                GateReference(
                    shared,
                    read.subpartitions,
                    None if read.producers == whole else read.producers,
                )
                for read in slices[readers.consumers.start : readers.consumers.stop]
            ]
        references_per_input.append(references)
    if not references_per_input:  # a stage that reads no exchange
        return [
            ConsumerDeploymentDescriptor(stage, consumer, ()) for consumer in range(parallelism)
        ]
    return [
        ConsumerDeploymentDescriptor(stage, consumer, inputs)
        for consumer, inputs in enumerate(zip(*references_per_input, strict=True))
    ]


@functools.lru_cache(maxsize=_DECODED_GROUPS)
def _decode(compressed: bytes) -> tuple[ShuffleDescriptor, ...]:
    try:
        serialized = zstandard.ZstdDecompressor().decompress(compressed)
    except zstandard.ZstdError as error:
        raise SerializationError(
            f"a shared descriptor list does not decompress: {error}"
        ) from error
    group = deserialize(serialized)
    if not isinstance(group, ShuffleDescriptorGroup):
        raise SerializationError(f"expected a shuffle descriptor group, got {type(group).__name__}")
    return group.shuffle_descriptors


def resolve_gate(
    reference: GateReference, *, blob_cache_bytes: int
) -> InputGateDeploymentDescriptor:
    """Consumer side: the input gate a reference names. A process decodes each shared list
    once; an offloaded one it reads once, from the store the driver put it in, through its
    blob cache of ``blob_cache_bytes``."""
    group = reference.group
    shared = group.descriptors
    if isinstance(shared, InlineDescriptors):
        compressed = shared.compressed
    else:
        blobs = process_blob_cache(shared.blob_store_url, blob_cache_bytes)
        compressed = blobs.get(shared.blob_key)
    descriptors = _decode(compressed)
    if reference.producers is not None:
        descriptors = descriptors[reference.producers.start : reference.producers.end + 1]
    return InputGateDeploymentDescriptor(
        group.result_id, group.partition_type, reference.subpartitions, descriptors
    )

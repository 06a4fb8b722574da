"""A reducer's read of an input in which merged partitions stand in for map outputs: a merged
partition found lost or corrupt as it is read is read from its sources instead, as Magnet's
reducers fall back to the unmerged blocks, so the reducer still gets every row once.

The rows of a merged partition are held until it has been read whole (up to
:data:`MAX_HELD_BYTES`), so that a failure part-way through it has passed none of them on:
the sources then give them all. A reducer's share of one merged partition is small where
merging pays (blocks of a few KiB); past the limit the rest is passed on as it is read, and a
failure after that fails the read as an unmerged one does."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Final

import pyarrow as pa

from shuffle_api import (
    InputGate,
    InputGateDeploymentDescriptor,
    PartitionCorruptedError,
    PartitionNotFoundError,
    ResultPartitionID,
    ShuffleDescriptor,
    ShuffleEnvironment,
    ShuffleIOOwner,
    SubpartitionRange,
)

__all__ = ["MAX_HELD_BYTES", "MergedFallbackGate", "MergedSources", "input_gates"]

_LOG = logging.getLogger(__name__)

MAX_HELD_BYTES: Final = 32 << 20
"""Bytes of a merged partition's rows a reducer holds before it passes them on."""

MergedSources = Mapping[ResultPartitionID, tuple[ShuffleDescriptor, ...]]
"""The sources of each merged partition, in the order their rows were merged."""


class MergedFallbackGate(InputGate):
    """Reads the partitions of ``descriptor`` in order: runs of map outputs through one gate
    of the service each, and each merged partition (a key of ``sources``) through a gate of
    its own, from its sources where it fails."""

    def __init__(
        self,
        environment: ShuffleEnvironment,
        owner: ShuffleIOOwner,
        descriptor: InputGateDeploymentDescriptor,
        sources: MergedSources,
    ) -> None:
        self._environment = environment
        self._owner = owner
        self._descriptor = descriptor
        self._sources = sources
        self._open: list[InputGate] = []

    @property
    def result_id(self) -> str:
        return self._descriptor.result_id

    @property
    def subpartitions(self) -> SubpartitionRange:
        return self._descriptor.consumed_subpartitions

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        unmerged: list[ShuffleDescriptor] = []
        for each in self._descriptor.shuffle_descriptors:
            if each.result_partition_id not in self._sources:
                unmerged.append(each)
                continue
            if unmerged:
                yield from self._read(unmerged)
                unmerged = []
            yield from self._read_merged(each)
        if unmerged:
            yield from self._read(unmerged)

    def _read(self, descriptors: Sequence[ShuffleDescriptor]) -> Iterator[pa.RecordBatch]:
        gate_descriptor = dataclasses.replace(
            self._descriptor, shuffle_descriptors=tuple(descriptors)
        )
        [gate] = self._environment.create_input_gates(self._owner, [gate_descriptor])
        self._open.append(gate)
        try:
            yield from gate
        finally:
            gate.close()
            if gate in self._open:
                self._open.remove(gate)

    def _read_merged(self, merged: ShuffleDescriptor) -> Iterator[pa.RecordBatch]:
        held: list[pa.RecordBatch] = []
        held_bytes = 0
        passed_on = False
        try:
            for batch in self._read([merged]):
                if passed_on:
                    yield batch
                    continue
                held.append(batch)
                held_bytes += batch.get_total_buffer_size()
                if held_bytes > MAX_HELD_BYTES:
                    passed_on = True
                    yield from held
                    held = []
        except (PartitionNotFoundError, PartitionCorruptedError) as error:
            if passed_on:
                raise
            sources = self._sources[merged.result_partition_id]
            _LOG.warning(
                "%s: merged partition %s read from its %d sources instead: %s",
                self._owner.name,
                merged.result_partition_id,
                len(sources),
                error,
            )
            yield from self._read(sources)
            return
        yield from held

    def close(self) -> None:
        for gate in list(self._open):
            gate.close()


def input_gates(
    environment: ShuffleEnvironment,
    owner: ShuffleIOOwner,
    descriptors: Sequence[InputGateDeploymentDescriptor],
    sources: MergedSources,
) -> list[InputGate]:
    """A gate for each of ``descriptors``: the service's own, or where it reads merged
    partitions, one that falls back to their sources."""
    merging = [
        any(each.result_partition_id in sources for each in descriptor.shuffle_descriptors)
        for descriptor in descriptors
    ]
    plain = iter(
        environment.create_input_gates(
            owner, [d for d, merges in zip(descriptors, merging, strict=True) if not merges]
        )
    )
    return [
        MergedFallbackGate(environment, owner, descriptor, sources) if merges else next(plain)
        for descriptor, merges in zip(descriptors, merging, strict=True)
    ]

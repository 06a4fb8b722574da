"""Descriptors <-> bytes, with protobuf messages from proto/pyshuffle/v1 (never pickle).

Every top-level value travels in a versioned ``Envelope``. An implementation's shuffle descriptor
is found by its ``kind``: registered classes first, then the known implementations, imported lazily
(the fsspec registry pattern), so this package imports no implementation.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Final

from google.protobuf.message import DecodeError

from shuffle_api.descriptors import (
    DistributionPattern,
    InputGateDeploymentDescriptor,
    PartitionDescriptor,
    PartitionInfo,
    ProducerDescriptor,
    ResultPartitionDeploymentDescriptor,
    ResultPartitionType,
    ShuffleDescriptor,
    ShuffleDescriptorGroup,
    SubpartitionRange,
    UnknownShuffleDescriptor,
)
from shuffle_api.errors import (
    ConfigError,
    SerializationError,
    ShuffleError,
    UnsupportedFormatVersionError,
)
from shuffle_api.ids import IntermediateResultPartitionID, ResultPartitionID
from shuffle_api.messages import pb
from shuffle_api.plugins import DESCRIPTOR_KINDS, load_plugin, plugins

if TYPE_CHECKING:
    from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

__all__ = [
    "FORMAT_VERSION",
    "Descriptor",
    "deserialize",
    "register_shuffle_descriptor_kind",
    "serialize",
]

FORMAT_VERSION: Final = 2
"""The newest envelope version this pyshuffle reads. Version 2 carries descriptor groups as
columns, which a version-1 reader would take for an empty group, so group envelopes say 2;
every other payload is unchanged and still says 1, so older readers keep reading them."""

_UNCHANGED_SINCE_VERSION: Final = 1

Descriptor = (
    PartitionDescriptor
    | ProducerDescriptor
    | ShuffleDescriptor
    | ResultPartitionDeploymentDescriptor
    | InputGateDeploymentDescriptor
    | PartitionInfo
    | ShuffleDescriptorGroup
)

_registry: dict[str, type[ShuffleDescriptor]] = {"unknown": UnknownShuffleDescriptor}
_registry_lock = threading.Lock()


def register_shuffle_descriptor_kind(cls: type[ShuffleDescriptor]) -> type[ShuffleDescriptor]:
    """Make ``cls`` decodable by its ``kind``; usable as a class decorator."""
    with _registry_lock:
        existing = _registry.get(cls.kind)
        if existing is not None and existing is not cls:
            raise ShuffleError(
                f"shuffle descriptor kind {cls.kind!r} is taken by"
                f" {existing.__module__}.{existing.__qualname__}"
            )
        _registry[cls.kind] = cls
    return cls


def _descriptor_class(kind: str) -> type[ShuffleDescriptor]:
    cls = _registry.get(kind)
    if cls is not None:
        return cls
    if kind not in plugins(DESCRIPTOR_KINDS):
        raise SerializationError(
            f"unknown shuffle descriptor kind {kind!r}; known kinds:"
            f" {sorted(set(_registry) | set(plugins(DESCRIPTOR_KINDS)))}"
        )
    try:
        loaded = load_plugin(DESCRIPTOR_KINDS, kind)
    except ConfigError as error:
        raise SerializationError(f"shuffle descriptor kind {kind!r}: {error}") from error
    if not (isinstance(loaded, type) and issubclass(loaded, ShuffleDescriptor)):
        raise SerializationError(
            f"shuffle descriptor kind {kind!r} is registered as {loaded!r}, not a ShuffleDescriptor"
        )
    return register_shuffle_descriptor_kind(loaded)


# --- value objects -> messages -------------------------------------------------------------


# Messages are filled in place (``add()`` / submessage fields): building each as its own
# message and copying it in costs twice as much, which shows on groups of 10,000 descriptors.


def _fill_partition_id(
    message: pb.IntermediateResultPartitionId, value: IntermediateResultPartitionID
) -> None:
    message.result_id = value.result_id
    message.partition_index = value.partition_index


def _fill_shuffle_descriptor(message: pb.ShuffleDescriptor, value: ShuffleDescriptor) -> None:
    partition = value.result_partition_id
    _fill_partition_id(message.result_partition_id.partition_id, partition.partition_id)
    message.result_partition_id.producer_attempt_id = partition.producer_attempt_id
    message.kind = value.kind
    message.details = value.details_to_bytes()


def _fill_shuffle_descriptors(
    messages: RepeatedCompositeFieldContainer[pb.ShuffleDescriptor],
    values: Iterable[ShuffleDescriptor],
) -> None:
    for value in values:
        _fill_shuffle_descriptor(messages.add(), value)


def _fill_group_columns(
    message: pb.ShuffleDescriptorGroup, values: Sequence[ShuffleDescriptor]
) -> None:
    # Whole lists per column: protobuf copies each in C.
    ids = [value.result_partition_id for value in values]
    message.result_ids.extend([id_.partition_id.result_id for id_ in ids])
    message.partition_indexes.extend([id_.partition_id.partition_index for id_ in ids])
    message.producer_attempt_ids.extend([id_.producer_attempt_id for id_ in ids])
    message.kinds.extend([value.kind for value in values])
    message.details.extend([value.details_to_bytes() for value in values])


def _partition_descriptor_to_pb(value: PartitionDescriptor) -> pb.PartitionDescriptor:
    message = pb.PartitionDescriptor(
        result_id=value.result_id,
        total_number_of_partitions=value.total_number_of_partitions,
        partition_type=value.partition_type.name,
        number_of_subpartitions=value.number_of_subpartitions,
        connection_index=value.connection_index,
        is_broadcast=value.is_broadcast,
        distribution_pattern=value.distribution_pattern.name,
        is_number_of_partition_consumers_undefined=value.is_number_of_partition_consumers_undefined,
    )
    _fill_partition_id(message.partition_id, value.partition_id)
    return message


def _to_envelope(value: Descriptor) -> pb.Envelope:
    envelope = pb.Envelope(format_version=_UNCHANGED_SINCE_VERSION)
    match value:
        case PartitionDescriptor():
            envelope.partition_descriptor.CopyFrom(_partition_descriptor_to_pb(value))
        case ProducerDescriptor():
            producer = envelope.producer_descriptor
            producer.producer_location = value.producer_location
            producer.producer_execution_id = value.producer_execution_id
            producer.address = value.address
            producer.data_port = value.data_port
        case ShuffleDescriptor():
            _fill_shuffle_descriptor(envelope.shuffle_descriptor, value)
        case ResultPartitionDeploymentDescriptor():
            message = envelope.result_partition_deployment_descriptor
            message.partition_descriptor.CopyFrom(
                _partition_descriptor_to_pb(value.partition_descriptor)
            )
            _fill_shuffle_descriptor(message.shuffle_descriptor, value.shuffle_descriptor)
        case InputGateDeploymentDescriptor():
            gate = envelope.input_gate_deployment_descriptor
            gate.CopyFrom(
                pb.InputGateDeploymentDescriptor(
                    result_id=value.result_id,
                    consumed_partition_type=value.consumed_partition_type.name,
                    consumed_subpartitions=pb.SubpartitionRange(
                        start=value.consumed_subpartitions.start,
                        end=value.consumed_subpartitions.end,
                    ),
                )
            )
            _fill_shuffle_descriptors(gate.shuffle_descriptors, value.shuffle_descriptors)
        case PartitionInfo():
            envelope.partition_info.result_id = value.result_id
            _fill_shuffle_descriptor(
                envelope.partition_info.shuffle_descriptor, value.shuffle_descriptor
            )
        case ShuffleDescriptorGroup():
            envelope.format_version = FORMAT_VERSION
            _fill_group_columns(envelope.shuffle_descriptor_group, value.shuffle_descriptors)
        case _:
            raise SerializationError(f"cannot serialize {type(value).__name__}")
    return envelope


def serialize(value: Descriptor) -> bytes:
    """The versioned protobuf bytes of a descriptor."""
    try:
        data: bytes = _to_envelope(value).SerializeToString()
    except (ValueError, TypeError) as error:
        raise SerializationError(f"cannot serialize {value!r}: {error}") from error
    return data


# --- messages -> value objects -------------------------------------------------------------


def _partition_id_from_pb(
    message: pb.IntermediateResultPartitionId,
) -> IntermediateResultPartitionID:
    return IntermediateResultPartitionID(message.result_id, message.partition_index)


def _rpid_from_pb(message: pb.ResultPartitionId) -> ResultPartitionID:
    return ResultPartitionID(
        _partition_id_from_pb(message.partition_id), message.producer_attempt_id
    )


def _type_from_pb(value: int) -> ResultPartitionType:
    name = pb.ResultPartitionType.Name(value)
    try:
        partition_type: ResultPartitionType = ResultPartitionType[name]
    except KeyError:
        raise SerializationError(f"unknown result partition type {name}") from None
    return partition_type


def _shuffle_descriptor_from_pb(message: pb.ShuffleDescriptor) -> ShuffleDescriptor:
    cls = _descriptor_class(message.kind)
    return cls.from_details(_rpid_from_pb(message.result_partition_id), message.details)


def _partition_descriptor_from_pb(message: pb.PartitionDescriptor) -> PartitionDescriptor:
    pattern = pb.DistributionPattern.Name(message.distribution_pattern)
    if pattern not in DistributionPattern.__members__:
        raise SerializationError(f"unknown distribution pattern {pattern}")
    return PartitionDescriptor(
        result_id=message.result_id,
        total_number_of_partitions=message.total_number_of_partitions,
        partition_id=_partition_id_from_pb(message.partition_id),
        partition_type=_type_from_pb(message.partition_type),
        number_of_subpartitions=message.number_of_subpartitions,
        connection_index=message.connection_index,
        is_broadcast=message.is_broadcast,
        distribution_pattern=DistributionPattern[pattern],
        is_number_of_partition_consumers_undefined=message.is_number_of_partition_consumers_undefined,
    )


def _group_from_pb(message: pb.ShuffleDescriptorGroup) -> ShuffleDescriptorGroup:
    columns = (
        message.result_ids,
        message.partition_indexes,
        message.producer_attempt_ids,
        message.kinds,
        message.details,
    )
    if message.shuffle_descriptors and message.result_ids:
        raise SerializationError(
            "a shuffle descriptor group holds both one message per descriptor and columns"
        )
    if len({len(column) for column in columns}) != 1:
        raise SerializationError(
            "a shuffle descriptor group's columns differ in length:"
            f" {[len(column) for column in columns]}"
        )
    from_columns = (
        _descriptor_class(kind).from_details(
            ResultPartitionID(IntermediateResultPartitionID(result_id, index), attempt), details
        )
        for result_id, index, attempt, kind, details in zip(*columns, strict=True)
    )
    return ShuffleDescriptorGroup(
        (*map(_shuffle_descriptor_from_pb, message.shuffle_descriptors), *from_columns)
    )


def _from_envelope(envelope: pb.Envelope) -> Descriptor:
    payload = envelope.WhichOneof("payload")
    match payload:
        case "partition_descriptor":
            return _partition_descriptor_from_pb(envelope.partition_descriptor)
        case "producer_descriptor":
            producer = envelope.producer_descriptor
            return ProducerDescriptor(
                producer_location=producer.producer_location,
                producer_execution_id=producer.producer_execution_id,
                address=producer.address,
                data_port=producer.data_port,
            )
        case "shuffle_descriptor":
            return _shuffle_descriptor_from_pb(envelope.shuffle_descriptor)
        case "result_partition_deployment_descriptor":
            rpdd = envelope.result_partition_deployment_descriptor
            return ResultPartitionDeploymentDescriptor(
                _partition_descriptor_from_pb(rpdd.partition_descriptor),
                _shuffle_descriptor_from_pb(rpdd.shuffle_descriptor),
            )
        case "input_gate_deployment_descriptor":
            gate = envelope.input_gate_deployment_descriptor
            return InputGateDeploymentDescriptor(
                result_id=gate.result_id,
                consumed_partition_type=_type_from_pb(gate.consumed_partition_type),
                consumed_subpartitions=SubpartitionRange(
                    gate.consumed_subpartitions.start, gate.consumed_subpartitions.end
                ),
                shuffle_descriptors=tuple(
                    _shuffle_descriptor_from_pb(d) for d in gate.shuffle_descriptors
                ),
            )
        case "partition_info":
            info = envelope.partition_info
            return PartitionInfo(
                info.result_id, _shuffle_descriptor_from_pb(info.shuffle_descriptor)
            )
        case "shuffle_descriptor_group":
            return _group_from_pb(envelope.shuffle_descriptor_group)
        case _:
            raise SerializationError("descriptor envelope holds no payload")


def deserialize(data: bytes) -> Descriptor:
    """Inverse of :func:`serialize`; raises :class:`SerializationError` on bad bytes."""
    envelope = pb.Envelope()
    try:
        envelope.ParseFromString(data)
    except DecodeError as error:
        raise SerializationError(
            f"bytes do not decode as a descriptor envelope: {error}"
        ) from error
    if envelope.format_version == 0 or envelope.format_version > FORMAT_VERSION:
        raise UnsupportedFormatVersionError(
            f"descriptor format version {envelope.format_version} is not supported"
            f" (this pyshuffle reads 1..{FORMAT_VERSION})"
        )
    try:
        return _from_envelope(envelope)
    except SerializationError:
        raise
    except (ValueError, TypeError) as error:  # InvalidIdentifierError included
        raise SerializationError(f"descriptor does not decode: {error}") from error

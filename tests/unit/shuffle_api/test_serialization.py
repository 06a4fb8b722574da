"""``shuffle_api.serialization``: descriptors <-> bytes: round trips, versioning, errors."""

from __future__ import annotations

import pickle

import pytest

from netty_like import NettyShuffleDescriptor
from shuffle_api import (
    LOCAL_ONLY_PORT,
    DistributionPattern,
    InputGateDeploymentDescriptor,
    IntermediateResultPartitionID,
    PartitionDescriptor,
    PartitionInfo,
    ProducerDescriptor,
    ResultPartitionDeploymentDescriptor,
    ResultPartitionType,
    SerializationError,
    ShuffleDescriptorGroup,
    SubpartitionRange,
    UnknownShuffleDescriptor,
    UnsupportedFormatVersionError,
    deserialize,
    serialize,
)
from shuffle_api.messages import pb
from shuffle_api.serialization import FORMAT_VERSION, Descriptor
from tests.unit.shuffle_api.serialized import RESULT, netty_descriptor, round_trip, rpid


def partition_descriptor(
    partition_type: ResultPartitionType = ResultPartitionType.BLOCKING,
    pattern: DistributionPattern = DistributionPattern.ALL_TO_ALL,
    index: int = 2,
) -> PartitionDescriptor:
    return PartitionDescriptor(
        result_id=RESULT,
        total_number_of_partitions=5,
        partition_id=IntermediateResultPartitionID(RESULT, index),
        partition_type=partition_type,
        number_of_subpartitions=7,
        connection_index=3,
        is_broadcast=True,
        distribution_pattern=pattern,
        is_number_of_partition_consumers_undefined=True,
    )


# --- round trips ---------------------------------------------------------------------------


@pytest.mark.parametrize("partition_type", list(ResultPartitionType))
@pytest.mark.parametrize("pattern", list(DistributionPattern))
def test_partition_descriptor_round_trips_with_every_type_and_pattern(
    partition_type: ResultPartitionType, pattern: DistributionPattern
) -> None:
    value = partition_descriptor(partition_type, pattern)

    decoded = round_trip(value)

    assert decoded == value
    assert isinstance(decoded, PartitionDescriptor)
    assert decoded.partition_type is partition_type
    assert decoded.distribution_pattern is pattern


def test_partition_descriptor_round_trips_with_default_flags() -> None:
    value = PartitionDescriptor(
        result_id=RESULT,
        total_number_of_partitions=1,
        partition_id=IntermediateResultPartitionID(RESULT, 0),
        partition_type=ResultPartitionType.PIPELINED,
        number_of_subpartitions=1,
    )

    assert round_trip(value) == value


def test_producer_descriptor_round_trips() -> None:
    value = ProducerDescriptor("executor-1", "execution-9", "10.0.0.7", 40123)

    assert round_trip(value) == value


def test_producer_descriptor_of_a_local_only_producer_round_trips() -> None:
    # Environments report LOCAL_ONLY_PORT (-1) when they serve no data port.
    value = ProducerDescriptor("executor-1", "execution-9", "10.0.0.7", LOCAL_ONLY_PORT)

    assert round_trip(value) == value


def test_unknown_shuffle_descriptor_round_trips() -> None:
    value = UnknownShuffleDescriptor(rpid(4, "attempt-7"))

    decoded = round_trip(value)

    assert decoded == value
    assert isinstance(decoded, UnknownShuffleDescriptor)
    assert decoded.is_unknown


@pytest.mark.parametrize(
    "shuffle_descriptor", [UnknownShuffleDescriptor(rpid(2)), netty_descriptor(2)]
)
def test_result_partition_deployment_descriptor_round_trips(
    shuffle_descriptor: UnknownShuffleDescriptor | NettyShuffleDescriptor,
) -> None:
    value = ResultPartitionDeploymentDescriptor(partition_descriptor(index=2), shuffle_descriptor)

    decoded = round_trip(value)

    assert decoded == value
    assert isinstance(decoded, ResultPartitionDeploymentDescriptor)
    assert type(decoded.shuffle_descriptor) is type(shuffle_descriptor)


def test_input_gate_deployment_descriptor_round_trips_mixed_known_and_unknown() -> None:
    descriptors = (
        netty_descriptor(0),
        UnknownShuffleDescriptor(rpid(1)),
        netty_descriptor(2, LOCAL_ONLY_PORT),
        UnknownShuffleDescriptor(rpid(3, "attempt-2")),
    )
    value = InputGateDeploymentDescriptor(
        result_id=RESULT,
        consumed_partition_type=ResultPartitionType.HYBRID_FULL,
        consumed_subpartitions=SubpartitionRange(2, 5),
        shuffle_descriptors=descriptors,
    )

    decoded = round_trip(value)

    assert decoded == value
    assert isinstance(decoded, InputGateDeploymentDescriptor)
    assert [type(d) for d in decoded.shuffle_descriptors] == [type(d) for d in descriptors]
    assert [d.is_unknown for d in decoded.shuffle_descriptors] == [False, True, False, True]


def test_input_gate_deployment_descriptor_round_trips_with_no_descriptors() -> None:
    value = InputGateDeploymentDescriptor(
        RESULT, ResultPartitionType.BLOCKING, SubpartitionRange.single(0), ()
    )

    assert round_trip(value) == value


def test_shuffle_descriptor_group_round_trips_in_order() -> None:
    value = ShuffleDescriptorGroup(
        (netty_descriptor(2), UnknownShuffleDescriptor(rpid(0)), netty_descriptor(1))
    )

    decoded = round_trip(value)

    assert decoded == value
    assert isinstance(decoded, ShuffleDescriptorGroup)


def test_a_group_is_written_as_columns_and_its_message_per_descriptor_form_still_reads() -> None:
    descriptors = (netty_descriptor(2), UnknownShuffleDescriptor(rpid(0)))
    written = pb.Envelope.FromString(serialize(ShuffleDescriptorGroup(descriptors)))
    # A version 1 reader would take the columns for an empty group: it must refuse instead.
    assert written.format_version == FORMAT_VERSION == 2
    group = written.shuffle_descriptor_group
    assert list(group.partition_indexes) == [2, 0]
    assert list(group.kinds) == ["netty_like", "unknown"]
    assert not group.shuffle_descriptors

    # The form written before the columns: one ShuffleDescriptor message each.
    older = pb.Envelope(format_version=1)
    for descriptor in descriptors:
        older.shuffle_descriptor_group.shuffle_descriptors.append(
            pb.Envelope.FromString(serialize(descriptor)).shuffle_descriptor
        )
    assert deserialize(older.SerializeToString()) == ShuffleDescriptorGroup(descriptors)


def test_a_group_with_both_forms_is_refused() -> None:
    envelope = pb.Envelope.FromString(serialize(ShuffleDescriptorGroup((netty_descriptor(1),))))
    envelope.shuffle_descriptor_group.shuffle_descriptors.append(
        pb.Envelope.FromString(serialize(netty_descriptor(2))).shuffle_descriptor
    )

    with pytest.raises(SerializationError, match="both one message per descriptor and columns"):
        deserialize(envelope.SerializeToString())


def test_a_group_whose_columns_differ_in_length_is_refused_by_name() -> None:
    envelope = pb.Envelope.FromString(serialize(ShuffleDescriptorGroup((netty_descriptor(1),))))
    envelope.shuffle_descriptor_group.partition_indexes.append(7)

    with pytest.raises(SerializationError, match="columns differ in length"):
        deserialize(envelope.SerializeToString())


def test_partition_info_round_trips() -> None:
    value = PartitionInfo(RESULT, netty_descriptor(3))

    assert round_trip(value) == value


# --- the bytes -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "payload"),
    [
        (partition_descriptor(), "partition_descriptor"),
        (ProducerDescriptor("executor-1", "execution-9", "h", 1), "producer_descriptor"),
        (netty_descriptor(0), "shuffle_descriptor"),
        (UnknownShuffleDescriptor(rpid(0)), "shuffle_descriptor"),
        (PartitionInfo(RESULT, netty_descriptor(0)), "partition_info"),
    ],
)
def test_serialized_bytes_are_a_versioned_protobuf_envelope_not_pickle(
    value: Descriptor, payload: str
) -> None:
    data = serialize(value)

    assert isinstance(data, bytes)
    assert not data.startswith(b"\x80")
    with pytest.raises(pickle.UnpicklingError):
        pickle.loads(data)
    envelope = pb.Envelope.FromString(data)
    # Version 1: these payloads are what version 1 readers know.
    assert envelope.format_version == 1
    assert envelope.WhichOneof("payload") == payload


def test_serialization_is_deterministic() -> None:
    value = InputGateDeploymentDescriptor(
        RESULT,
        ResultPartitionType.BLOCKING,
        SubpartitionRange(0, 1),
        (netty_descriptor(0), UnknownShuffleDescriptor(rpid(1))),
    )

    assert serialize(value) == serialize(value)


@pytest.mark.parametrize(
    "data",
    [b"\xff\xff\xff\xff", b"\x80\x04\x95", b"garbage bytes, not a descriptor", b"\x0a\x05ab"],
)
def test_garbage_bytes_raise_serialization_error(data: bytes) -> None:
    with pytest.raises(SerializationError):
        deserialize(data)


def test_empty_bytes_raise_serialization_error() -> None:
    with pytest.raises(SerializationError):
        deserialize(b"")


def test_envelope_of_a_newer_format_version_is_unsupported() -> None:
    envelope = pb.Envelope(
        format_version=FORMAT_VERSION + 1,
        producer_descriptor=pb.ProducerDescriptor(
            producer_location="executor-1",
            producer_execution_id="execution-9",
            address="h",
            data_port=1,
        ),
    )

    with pytest.raises(UnsupportedFormatVersionError) as caught:
        deserialize(envelope.SerializeToString())

    assert str(FORMAT_VERSION + 1) in str(caught.value)


def test_envelope_without_a_format_version_is_unsupported() -> None:
    envelope = pb.Envelope(
        producer_descriptor=pb.ProducerDescriptor(
            producer_location="executor-1", producer_execution_id="execution-9"
        )
    )

    with pytest.raises(UnsupportedFormatVersionError):
        deserialize(envelope.SerializeToString())


def test_envelope_without_a_payload_raises_serialization_error() -> None:
    envelope = pb.Envelope(format_version=FORMAT_VERSION)

    with pytest.raises(SerializationError, match="no payload"):
        deserialize(envelope.SerializeToString())


def test_unknown_shuffle_descriptor_kind_raises_serialization_error_naming_the_kind() -> None:
    envelope = pb.Envelope(
        format_version=FORMAT_VERSION,
        shuffle_descriptor=pb.ShuffleDescriptor(
            result_partition_id=pb.ResultPartitionId(
                partition_id=pb.IntermediateResultPartitionId(result_id=RESULT, partition_index=0),
                producer_attempt_id="attempt-0",
            ),
            kind="no-such-shuffle-kind",
            details=b"",
        ),
    )

    with pytest.raises(SerializationError) as caught:
        deserialize(envelope.SerializeToString())

    assert "'no-such-shuffle-kind'" in str(caught.value)


def test_unspecified_partition_type_raises_serialization_error() -> None:
    envelope = pb.Envelope.FromString(serialize(partition_descriptor()))
    envelope.partition_descriptor.partition_type = pb.RESULT_PARTITION_TYPE_UNSPECIFIED

    with pytest.raises(SerializationError, match="RESULT_PARTITION_TYPE_UNSPECIFIED"):
        deserialize(envelope.SerializeToString())


def test_unspecified_distribution_pattern_raises_serialization_error() -> None:
    envelope = pb.Envelope.FromString(serialize(partition_descriptor()))
    envelope.partition_descriptor.distribution_pattern = pb.DISTRIBUTION_PATTERN_UNSPECIFIED

    with pytest.raises(SerializationError, match="DISTRIBUTION_PATTERN_UNSPECIFIED"):
        deserialize(envelope.SerializeToString())


def test_every_partition_type_has_a_protobuf_counterpart() -> None:
    assert {t.name for t in ResultPartitionType} == {
        name
        for name, _ in pb.ResultPartitionType.items()
        if name != "RESULT_PARTITION_TYPE_UNSPECIFIED"
    }

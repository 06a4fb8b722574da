from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ResultPartitionType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESULT_PARTITION_TYPE_UNSPECIFIED: _ClassVar[ResultPartitionType]
    BLOCKING: _ClassVar[ResultPartitionType]
    BLOCKING_PERSISTENT: _ClassVar[ResultPartitionType]
    PIPELINED: _ClassVar[ResultPartitionType]
    PIPELINED_BOUNDED: _ClassVar[ResultPartitionType]
    HYBRID_FULL: _ClassVar[ResultPartitionType]

class DistributionPattern(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DISTRIBUTION_PATTERN_UNSPECIFIED: _ClassVar[DistributionPattern]
    ALL_TO_ALL: _ClassVar[DistributionPattern]
    POINTWISE: _ClassVar[DistributionPattern]
RESULT_PARTITION_TYPE_UNSPECIFIED: ResultPartitionType
BLOCKING: ResultPartitionType
BLOCKING_PERSISTENT: ResultPartitionType
PIPELINED: ResultPartitionType
PIPELINED_BOUNDED: ResultPartitionType
HYBRID_FULL: ResultPartitionType
DISTRIBUTION_PATTERN_UNSPECIFIED: DistributionPattern
ALL_TO_ALL: DistributionPattern
POINTWISE: DistributionPattern

class IntermediateResultPartitionId(_message.Message):
    __slots__ = ("result_id", "partition_index")
    RESULT_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_INDEX_FIELD_NUMBER: _ClassVar[int]
    result_id: str
    partition_index: int
    def __init__(self, result_id: _Optional[str] = ..., partition_index: _Optional[int] = ...) -> None: ...

class ResultPartitionId(_message.Message):
    __slots__ = ("partition_id", "producer_attempt_id")
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    partition_id: IntermediateResultPartitionId
    producer_attempt_id: str
    def __init__(self, partition_id: _Optional[_Union[IntermediateResultPartitionId, _Mapping]] = ..., producer_attempt_id: _Optional[str] = ...) -> None: ...

class SubpartitionRange(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class PartitionDescriptor(_message.Message):
    __slots__ = ("result_id", "total_number_of_partitions", "partition_id", "partition_type", "number_of_subpartitions", "connection_index", "is_broadcast", "distribution_pattern", "is_number_of_partition_consumers_undefined")
    RESULT_ID_FIELD_NUMBER: _ClassVar[int]
    TOTAL_NUMBER_OF_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_TYPE_FIELD_NUMBER: _ClassVar[int]
    NUMBER_OF_SUBPARTITIONS_FIELD_NUMBER: _ClassVar[int]
    CONNECTION_INDEX_FIELD_NUMBER: _ClassVar[int]
    IS_BROADCAST_FIELD_NUMBER: _ClassVar[int]
    DISTRIBUTION_PATTERN_FIELD_NUMBER: _ClassVar[int]
    IS_NUMBER_OF_PARTITION_CONSUMERS_UNDEFINED_FIELD_NUMBER: _ClassVar[int]
    result_id: str
    total_number_of_partitions: int
    partition_id: IntermediateResultPartitionId
    partition_type: ResultPartitionType
    number_of_subpartitions: int
    connection_index: int
    is_broadcast: bool
    distribution_pattern: DistributionPattern
    is_number_of_partition_consumers_undefined: bool
    def __init__(self, result_id: _Optional[str] = ..., total_number_of_partitions: _Optional[int] = ..., partition_id: _Optional[_Union[IntermediateResultPartitionId, _Mapping]] = ..., partition_type: _Optional[_Union[ResultPartitionType, str]] = ..., number_of_subpartitions: _Optional[int] = ..., connection_index: _Optional[int] = ..., is_broadcast: _Optional[bool] = ..., distribution_pattern: _Optional[_Union[DistributionPattern, str]] = ..., is_number_of_partition_consumers_undefined: _Optional[bool] = ...) -> None: ...

class ProducerDescriptor(_message.Message):
    __slots__ = ("producer_location", "producer_execution_id", "address", "data_port")
    PRODUCER_LOCATION_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EXECUTION_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DATA_PORT_FIELD_NUMBER: _ClassVar[int]
    producer_location: str
    producer_execution_id: str
    address: str
    data_port: int
    def __init__(self, producer_location: _Optional[str] = ..., producer_execution_id: _Optional[str] = ..., address: _Optional[str] = ..., data_port: _Optional[int] = ...) -> None: ...

class ShuffleDescriptor(_message.Message):
    __slots__ = ("result_partition_id", "kind", "details")
    RESULT_PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    result_partition_id: ResultPartitionId
    kind: str
    details: bytes
    def __init__(self, result_partition_id: _Optional[_Union[ResultPartitionId, _Mapping]] = ..., kind: _Optional[str] = ..., details: _Optional[bytes] = ...) -> None: ...

class ResultPartitionDeploymentDescriptor(_message.Message):
    __slots__ = ("partition_descriptor", "shuffle_descriptor")
    PARTITION_DESCRIPTOR_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_DESCRIPTOR_FIELD_NUMBER: _ClassVar[int]
    partition_descriptor: PartitionDescriptor
    shuffle_descriptor: ShuffleDescriptor
    def __init__(self, partition_descriptor: _Optional[_Union[PartitionDescriptor, _Mapping]] = ..., shuffle_descriptor: _Optional[_Union[ShuffleDescriptor, _Mapping]] = ...) -> None: ...

class InputGateDeploymentDescriptor(_message.Message):
    __slots__ = ("result_id", "consumed_partition_type", "consumed_subpartitions", "shuffle_descriptors")
    RESULT_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_PARTITION_TYPE_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_SUBPARTITIONS_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_DESCRIPTORS_FIELD_NUMBER: _ClassVar[int]
    result_id: str
    consumed_partition_type: ResultPartitionType
    consumed_subpartitions: SubpartitionRange
    shuffle_descriptors: _containers.RepeatedCompositeFieldContainer[ShuffleDescriptor]
    def __init__(self, result_id: _Optional[str] = ..., consumed_partition_type: _Optional[_Union[ResultPartitionType, str]] = ..., consumed_subpartitions: _Optional[_Union[SubpartitionRange, _Mapping]] = ..., shuffle_descriptors: _Optional[_Iterable[_Union[ShuffleDescriptor, _Mapping]]] = ...) -> None: ...

class PartitionInfo(_message.Message):
    __slots__ = ("result_id", "shuffle_descriptor")
    RESULT_ID_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_DESCRIPTOR_FIELD_NUMBER: _ClassVar[int]
    result_id: str
    shuffle_descriptor: ShuffleDescriptor
    def __init__(self, result_id: _Optional[str] = ..., shuffle_descriptor: _Optional[_Union[ShuffleDescriptor, _Mapping]] = ...) -> None: ...

class ShuffleDescriptorGroup(_message.Message):
    __slots__ = ("shuffle_descriptors", "result_ids", "partition_indexes", "producer_attempt_ids", "kinds", "details")
    SHUFFLE_DESCRIPTORS_FIELD_NUMBER: _ClassVar[int]
    RESULT_IDS_FIELD_NUMBER: _ClassVar[int]
    PARTITION_INDEXES_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ATTEMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    shuffle_descriptors: _containers.RepeatedCompositeFieldContainer[ShuffleDescriptor]
    result_ids: _containers.RepeatedScalarFieldContainer[str]
    partition_indexes: _containers.RepeatedScalarFieldContainer[int]
    producer_attempt_ids: _containers.RepeatedScalarFieldContainer[str]
    kinds: _containers.RepeatedScalarFieldContainer[str]
    details: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, shuffle_descriptors: _Optional[_Iterable[_Union[ShuffleDescriptor, _Mapping]]] = ..., result_ids: _Optional[_Iterable[str]] = ..., partition_indexes: _Optional[_Iterable[int]] = ..., producer_attempt_ids: _Optional[_Iterable[str]] = ..., kinds: _Optional[_Iterable[str]] = ..., details: _Optional[_Iterable[bytes]] = ...) -> None: ...

class Envelope(_message.Message):
    __slots__ = ("format_version", "partition_descriptor", "producer_descriptor", "shuffle_descriptor", "result_partition_deployment_descriptor", "input_gate_deployment_descriptor", "partition_info", "shuffle_descriptor_group")
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    PARTITION_DESCRIPTOR_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_DESCRIPTOR_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_DESCRIPTOR_FIELD_NUMBER: _ClassVar[int]
    RESULT_PARTITION_DEPLOYMENT_DESCRIPTOR_FIELD_NUMBER: _ClassVar[int]
    INPUT_GATE_DEPLOYMENT_DESCRIPTOR_FIELD_NUMBER: _ClassVar[int]
    PARTITION_INFO_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_DESCRIPTOR_GROUP_FIELD_NUMBER: _ClassVar[int]
    format_version: int
    partition_descriptor: PartitionDescriptor
    producer_descriptor: ProducerDescriptor
    shuffle_descriptor: ShuffleDescriptor
    result_partition_deployment_descriptor: ResultPartitionDeploymentDescriptor
    input_gate_deployment_descriptor: InputGateDeploymentDescriptor
    partition_info: PartitionInfo
    shuffle_descriptor_group: ShuffleDescriptorGroup
    def __init__(self, format_version: _Optional[int] = ..., partition_descriptor: _Optional[_Union[PartitionDescriptor, _Mapping]] = ..., producer_descriptor: _Optional[_Union[ProducerDescriptor, _Mapping]] = ..., shuffle_descriptor: _Optional[_Union[ShuffleDescriptor, _Mapping]] = ..., result_partition_deployment_descriptor: _Optional[_Union[ResultPartitionDeploymentDescriptor, _Mapping]] = ..., input_gate_deployment_descriptor: _Optional[_Union[InputGateDeploymentDescriptor, _Mapping]] = ..., partition_info: _Optional[_Union[PartitionInfo, _Mapping]] = ..., shuffle_descriptor_group: _Optional[_Union[ShuffleDescriptorGroup, _Mapping]] = ...) -> None: ...

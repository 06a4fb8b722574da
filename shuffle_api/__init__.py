"""pyshuffle's shuffle contract (after Flink's FLIP-31).

A :class:`ShuffleServiceFactory`, chosen by the config key ``shuffle-service-factory.class``,
creates one :class:`ShuffleMaster` per application (driver side) and one
:class:`ShuffleEnvironment` per process (task side). Data moves as ``pyarrow.RecordBatch``es.
"""

from shuffle_api.config import ConfigOption, Configuration
from shuffle_api.descriptors import (
    DistributionPattern,
    InputGateDeploymentDescriptor,
    PartitionDescriptor,
    PartitionInfo,
    ProducerDescriptor,
    ResultPartitionDeploymentDescriptor,
    ResultPartitionType,
    ShuffleDescriptor,
    SubpartitionRange,
    UnknownShuffleDescriptor,
)
from shuffle_api.environment import LOCAL_ONLY_PORT, ShuffleEnvironment, ShuffleIOOwner
from shuffle_api.errors import (
    ChecksumMismatchError,
    ConfigError,
    DataTooLargeError,
    InvalidIdentifierError,
    InvalidOperationError,
    PartitionAlreadyConsumedError,
    PartitionCorruptedError,
    PartitionError,
    PartitionNotFoundError,
    ProducerFailedError,
    SchemaMismatchError,
    SerializationError,
    ShuffleError,
    ShuffleServiceClosedError,
    StageFailedError,
    StorageError,
    TransportError,
    UnsupportedFormatVersionError,
)
from shuffle_api.factory import (
    KNOWN_FACTORIES,
    ShuffleEnvironmentContext,
    ShuffleMasterContext,
    ShuffleServiceFactory,
    load_shuffle_service_factory,
)
from shuffle_api.ids import IntermediateResultPartitionID, ResultPartitionID, new_id
from shuffle_api.io import BROADCAST, InputGate, PartitionStatistics, ResultPartitionWriter
from shuffle_api.master import (
    JobShuffleContext,
    PartitionWithMetrics,
    RecordingJobContext,
    ShuffleMaster,
)
from shuffle_api.serialization import deserialize, serialize

__all__ = [
    "BROADCAST",
    "KNOWN_FACTORIES",
    "LOCAL_ONLY_PORT",
    "ChecksumMismatchError",
    "ConfigError",
    "ConfigOption",
    "Configuration",
    "DataTooLargeError",
    "DistributionPattern",
    "InputGate",
    "InputGateDeploymentDescriptor",
    "IntermediateResultPartitionID",
    "InvalidIdentifierError",
    "InvalidOperationError",
    "JobShuffleContext",
    "PartitionAlreadyConsumedError",
    "PartitionCorruptedError",
    "PartitionDescriptor",
    "PartitionError",
    "PartitionInfo",
    "PartitionNotFoundError",
    "PartitionStatistics",
    "PartitionWithMetrics",
    "ProducerDescriptor",
    "ProducerFailedError",
    "RecordingJobContext",
    "ResultPartitionDeploymentDescriptor",
    "ResultPartitionID",
    "ResultPartitionType",
    "ResultPartitionWriter",
    "SchemaMismatchError",
    "SerializationError",
    "ShuffleDescriptor",
    "ShuffleEnvironment",
    "ShuffleEnvironmentContext",
    "ShuffleError",
    "ShuffleIOOwner",
    "ShuffleMaster",
    "ShuffleMasterContext",
    "ShuffleServiceClosedError",
    "ShuffleServiceFactory",
    "StageFailedError",
    "StorageError",
    "SubpartitionRange",
    "TransportError",
    "UnknownShuffleDescriptor",
    "UnsupportedFormatVersionError",
    "deserialize",
    "load_shuffle_service_factory",
    "new_id",
    "serialize",
]

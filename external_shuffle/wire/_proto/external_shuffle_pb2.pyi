from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PartitionKey(_message.Message):
    __slots__ = ("result_id", "partition_index", "producer_attempt_id")
    RESULT_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_INDEX_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    result_id: str
    partition_index: int
    producer_attempt_id: str
    def __init__(self, result_id: _Optional[str] = ..., partition_index: _Optional[int] = ..., producer_attempt_id: _Optional[str] = ...) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("worker_id", "host", "port", "store_url", "store_shared", "data_port", "tier_url", "hostname")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    STORE_URL_FIELD_NUMBER: _ClassVar[int]
    STORE_SHARED_FIELD_NUMBER: _ClassVar[int]
    DATA_PORT_FIELD_NUMBER: _ClassVar[int]
    TIER_URL_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    host: str
    port: int
    store_url: str
    store_shared: bool
    data_port: int
    tier_url: str
    hostname: str
    def __init__(self, worker_id: _Optional[str] = ..., host: _Optional[str] = ..., port: _Optional[int] = ..., store_url: _Optional[str] = ..., store_shared: _Optional[bool] = ..., data_port: _Optional[int] = ..., tier_url: _Optional[str] = ..., hostname: _Optional[str] = ...) -> None: ...

class WorkerLoad(_message.Message):
    __slots__ = ("stored_bytes", "partitions", "buffered_bytes", "decommissioning", "store_free_bytes", "partitions_on_tier", "application_bytes")
    class ApplicationBytesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    STORED_BYTES_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    BUFFERED_BYTES_FIELD_NUMBER: _ClassVar[int]
    DECOMMISSIONING_FIELD_NUMBER: _ClassVar[int]
    STORE_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_ON_TIER_FIELD_NUMBER: _ClassVar[int]
    APPLICATION_BYTES_FIELD_NUMBER: _ClassVar[int]
    stored_bytes: int
    partitions: int
    buffered_bytes: int
    decommissioning: bool
    store_free_bytes: int
    partitions_on_tier: int
    application_bytes: _containers.ScalarMap[str, int]
    def __init__(self, stored_bytes: _Optional[int] = ..., partitions: _Optional[int] = ..., buffered_bytes: _Optional[int] = ..., decommissioning: _Optional[bool] = ..., store_free_bytes: _Optional[int] = ..., partitions_on_tier: _Optional[int] = ..., application_bytes: _Optional[_Mapping[str, int]] = ...) -> None: ...

class PartitionLocation(_message.Message):
    __slots__ = ("partition", "replicas")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    partition: PartitionKey
    replicas: _containers.RepeatedCompositeFieldContainer[WorkerInfo]
    def __init__(self, partition: _Optional[_Union[PartitionKey, _Mapping]] = ..., replicas: _Optional[_Iterable[_Union[WorkerInfo, _Mapping]]] = ...) -> None: ...

class PartitionStatistics(_message.Message):
    __slots__ = ("rows_per_subpartition", "bytes_per_subpartition", "arrow_bytes_per_subpartition")
    ROWS_PER_SUBPARTITION_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_SUBPARTITION_FIELD_NUMBER: _ClassVar[int]
    ARROW_BYTES_PER_SUBPARTITION_FIELD_NUMBER: _ClassVar[int]
    rows_per_subpartition: _containers.RepeatedScalarFieldContainer[int]
    bytes_per_subpartition: _containers.RepeatedScalarFieldContainer[int]
    arrow_bytes_per_subpartition: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, rows_per_subpartition: _Optional[_Iterable[int]] = ..., bytes_per_subpartition: _Optional[_Iterable[int]] = ..., arrow_bytes_per_subpartition: _Optional[_Iterable[int]] = ...) -> None: ...

class RegisterWorkerRequest(_message.Message):
    __slots__ = ("worker", "load", "committed", "on_tier", "committed_for")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    ON_TIER_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FOR_FIELD_NUMBER: _ClassVar[int]
    worker: WorkerInfo
    load: WorkerLoad
    committed: _containers.RepeatedCompositeFieldContainer[PartitionKey]
    on_tier: _containers.RepeatedCompositeFieldContainer[PartitionKey]
    committed_for: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, worker: _Optional[_Union[WorkerInfo, _Mapping]] = ..., load: _Optional[_Union[WorkerLoad, _Mapping]] = ..., committed: _Optional[_Iterable[_Union[PartitionKey, _Mapping]]] = ..., on_tier: _Optional[_Iterable[_Union[PartitionKey, _Mapping]]] = ..., committed_for: _Optional[_Iterable[str]] = ...) -> None: ...

class RegisterWorkerResponse(_message.Message):
    __slots__ = ("obsolete",)
    OBSOLETE_FIELD_NUMBER: _ClassVar[int]
    obsolete: _containers.RepeatedCompositeFieldContainer[PartitionKey]
    def __init__(self, obsolete: _Optional[_Iterable[_Union[PartitionKey, _Mapping]]] = ...) -> None: ...

class WorkerHeartbeatRequest(_message.Message):
    __slots__ = ("worker_id", "load", "committed", "ended_heard")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    ENDED_HEARD_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    load: WorkerLoad
    committed: _containers.RepeatedCompositeFieldContainer[CommittedPartition]
    ended_heard: int
    def __init__(self, worker_id: _Optional[str] = ..., load: _Optional[_Union[WorkerLoad, _Mapping]] = ..., committed: _Optional[_Iterable[_Union[CommittedPartition, _Mapping]]] = ..., ended_heard: _Optional[int] = ...) -> None: ...

class CommittedPartition(_message.Message):
    __slots__ = ("partition", "application_id", "on_tier")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    APPLICATION_ID_FIELD_NUMBER: _ClassVar[int]
    ON_TIER_FIELD_NUMBER: _ClassVar[int]
    partition: PartitionKey
    application_id: str
    on_tier: bool
    def __init__(self, partition: _Optional[_Union[PartitionKey, _Mapping]] = ..., application_id: _Optional[str] = ..., on_tier: _Optional[bool] = ...) -> None: ...

class WorkerHeartbeatResponse(_message.Message):
    __slots__ = ("known", "release", "ended_applications", "ended_heard")
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    ENDED_APPLICATIONS_FIELD_NUMBER: _ClassVar[int]
    ENDED_HEARD_FIELD_NUMBER: _ClassVar[int]
    known: bool
    release: _containers.RepeatedCompositeFieldContainer[PartitionKey]
    ended_applications: _containers.RepeatedScalarFieldContainer[str]
    ended_heard: int
    def __init__(self, known: _Optional[bool] = ..., release: _Optional[_Iterable[_Union[PartitionKey, _Mapping]]] = ..., ended_applications: _Optional[_Iterable[str]] = ..., ended_heard: _Optional[int] = ...) -> None: ...

class ListWorkersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListWorkersResponse(_message.Message):
    __slots__ = ("workers",)
    class Entry(_message.Message):
        __slots__ = ("worker", "load", "alive", "seconds_since_heartbeat")
        WORKER_FIELD_NUMBER: _ClassVar[int]
        LOAD_FIELD_NUMBER: _ClassVar[int]
        ALIVE_FIELD_NUMBER: _ClassVar[int]
        SECONDS_SINCE_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
        worker: WorkerInfo
        load: WorkerLoad
        alive: bool
        seconds_since_heartbeat: float
        def __init__(self, worker: _Optional[_Union[WorkerInfo, _Mapping]] = ..., load: _Optional[_Union[WorkerLoad, _Mapping]] = ..., alive: _Optional[bool] = ..., seconds_since_heartbeat: _Optional[float] = ...) -> None: ...
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[ListWorkersResponse.Entry]
    def __init__(self, workers: _Optional[_Iterable[_Union[ListWorkersResponse.Entry, _Mapping]]] = ...) -> None: ...

class ReportUnreachableWorkerRequest(_message.Message):
    __slots__ = ("worker_id", "error")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    error: str
    def __init__(self, worker_id: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class ReportUnreachableWorkerResponse(_message.Message):
    __slots__ = ("declared_dead",)
    DECLARED_DEAD_FIELD_NUMBER: _ClassVar[int]
    declared_dead: bool
    def __init__(self, declared_dead: _Optional[bool] = ...) -> None: ...

class RegisterApplicationRequest(_message.Message):
    __slots__ = ("application_id", "identity")
    APPLICATION_ID_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    application_id: str
    identity: ApplicationIdentity
    def __init__(self, application_id: _Optional[str] = ..., identity: _Optional[_Union[ApplicationIdentity, _Mapping]] = ...) -> None: ...

class ApplicationIdentity(_message.Message):
    __slots__ = ("engine_id", "name", "user")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    engine_id: str
    name: str
    user: str
    def __init__(self, engine_id: _Optional[str] = ..., name: _Optional[str] = ..., user: _Optional[str] = ...) -> None: ...

class RegisterApplicationResponse(_message.Message):
    __slots__ = ("heartbeat_timeout_seconds", "credential")
    HEARTBEAT_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    heartbeat_timeout_seconds: float
    credential: str
    def __init__(self, heartbeat_timeout_seconds: _Optional[float] = ..., credential: _Optional[str] = ...) -> None: ...

class ApplicationHeartbeatRequest(_message.Message):
    __slots__ = ("application_id",)
    APPLICATION_ID_FIELD_NUMBER: _ClassVar[int]
    application_id: str
    def __init__(self, application_id: _Optional[str] = ...) -> None: ...

class LostPartition(_message.Message):
    __slots__ = ("job_id", "partition")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    partition: PartitionKey
    def __init__(self, job_id: _Optional[str] = ..., partition: _Optional[_Union[PartitionKey, _Mapping]] = ...) -> None: ...

class ApplicationHeartbeatResponse(_message.Message):
    __slots__ = ("known", "lost")
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    known: bool
    lost: _containers.RepeatedCompositeFieldContainer[LostPartition]
    def __init__(self, known: _Optional[bool] = ..., lost: _Optional[_Iterable[_Union[LostPartition, _Mapping]]] = ...) -> None: ...

class UnregisterApplicationRequest(_message.Message):
    __slots__ = ("application_id",)
    APPLICATION_ID_FIELD_NUMBER: _ClassVar[int]
    application_id: str
    def __init__(self, application_id: _Optional[str] = ...) -> None: ...

class UnregisterApplicationResponse(_message.Message):
    __slots__ = ("released_partitions",)
    RELEASED_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    released_partitions: int
    def __init__(self, released_partitions: _Optional[int] = ...) -> None: ...

class RegisterJobRequest(_message.Message):
    __slots__ = ("application_id", "job_id")
    APPLICATION_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    application_id: str
    job_id: str
    def __init__(self, application_id: _Optional[str] = ..., job_id: _Optional[str] = ...) -> None: ...

class RegisterJobResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UnregisterJobRequest(_message.Message):
    __slots__ = ("application_id", "job_id", "keep_persistent")
    APPLICATION_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    KEEP_PERSISTENT_FIELD_NUMBER: _ClassVar[int]
    application_id: str
    job_id: str
    keep_persistent: bool
    def __init__(self, application_id: _Optional[str] = ..., job_id: _Optional[str] = ..., keep_persistent: _Optional[bool] = ...) -> None: ...

class UnregisterJobResponse(_message.Message):
    __slots__ = ("released_partitions",)
    RELEASED_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    released_partitions: int
    def __init__(self, released_partitions: _Optional[int] = ...) -> None: ...

class RegisterPartitionRequest(_message.Message):
    __slots__ = ("application_id", "job_id", "partition", "number_of_subpartitions", "producer_host", "replicas", "persistent", "placed_on")
    APPLICATION_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    NUMBER_OF_SUBPARTITIONS_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_HOST_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    PERSISTENT_FIELD_NUMBER: _ClassVar[int]
    PLACED_ON_FIELD_NUMBER: _ClassVar[int]
    application_id: str
    job_id: str
    partition: PartitionKey
    number_of_subpartitions: int
    producer_host: str
    replicas: int
    persistent: bool
    placed_on: _containers.RepeatedCompositeFieldContainer[WorkerInfo]
    def __init__(self, application_id: _Optional[str] = ..., job_id: _Optional[str] = ..., partition: _Optional[_Union[PartitionKey, _Mapping]] = ..., number_of_subpartitions: _Optional[int] = ..., producer_host: _Optional[str] = ..., replicas: _Optional[int] = ..., persistent: _Optional[bool] = ..., placed_on: _Optional[_Iterable[_Union[WorkerInfo, _Mapping]]] = ...) -> None: ...

class RegisterPartitionResponse(_message.Message):
    __slots__ = ("location", "placement")
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    location: PartitionLocation
    placement: bytes
    def __init__(self, location: _Optional[_Union[PartitionLocation, _Mapping]] = ..., placement: _Optional[bytes] = ...) -> None: ...

class RegisterPartitionsRequest(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[RegisterPartitionRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[RegisterPartitionRequest, _Mapping]]] = ...) -> None: ...

class RegisterPartitionsResponse(_message.Message):
    __slots__ = ("responses",)
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    responses: _containers.RepeatedCompositeFieldContainer[RegisterPartitionResponse]
    def __init__(self, responses: _Optional[_Iterable[_Union[RegisterPartitionResponse, _Mapping]]] = ...) -> None: ...

class ReleasePartitionsRequest(_message.Message):
    __slots__ = ("application_id", "partitions")
    APPLICATION_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    application_id: str
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionKey]
    def __init__(self, application_id: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[PartitionKey, _Mapping]]] = ...) -> None: ...

class ReleasePartitionsResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: int
    def __init__(self, released: _Optional[int] = ...) -> None: ...

class GetPartitionStatusRequest(_message.Message):
    __slots__ = ("application_id", "job_id", "without_statistics")
    APPLICATION_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WITHOUT_STATISTICS_FIELD_NUMBER: _ClassVar[int]
    application_id: str
    job_id: str
    without_statistics: bool
    def __init__(self, application_id: _Optional[str] = ..., job_id: _Optional[str] = ..., without_statistics: _Optional[bool] = ...) -> None: ...

class PartitionStatus(_message.Message):
    __slots__ = ("location", "available", "statistics", "undecided")
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    STATISTICS_FIELD_NUMBER: _ClassVar[int]
    UNDECIDED_FIELD_NUMBER: _ClassVar[int]
    location: PartitionLocation
    available: bool
    statistics: PartitionStatistics
    undecided: bool
    def __init__(self, location: _Optional[_Union[PartitionLocation, _Mapping]] = ..., available: _Optional[bool] = ..., statistics: _Optional[_Union[PartitionStatistics, _Mapping]] = ..., undecided: _Optional[bool] = ...) -> None: ...

class GetPartitionStatusResponse(_message.Message):
    __slots__ = ("partitions",)
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionStatus]
    def __init__(self, partitions: _Optional[_Iterable[_Union[PartitionStatus, _Mapping]]] = ...) -> None: ...

class PushDataRequest(_message.Message):
    __slots__ = ("partition", "sequence", "data", "application_id", "placement", "commit")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    APPLICATION_ID_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    partition: PartitionKey
    sequence: int
    data: bytes
    application_id: str
    placement: bytes
    commit: PushCommit
    def __init__(self, partition: _Optional[_Union[PartitionKey, _Mapping]] = ..., sequence: _Optional[int] = ..., data: _Optional[bytes] = ..., application_id: _Optional[str] = ..., placement: _Optional[bytes] = ..., commit: _Optional[_Union[PushCommit, _Mapping]] = ...) -> None: ...

class PushCommit(_message.Message):
    __slots__ = ("index", "manifest")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    index: bytes
    manifest: bytes
    def __init__(self, index: _Optional[bytes] = ..., manifest: _Optional[bytes] = ...) -> None: ...

class PushDataResponse(_message.Message):
    __slots__ = ("received_bytes", "duplicates_dropped", "committed")
    RECEIVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_DROPPED_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    received_bytes: int
    duplicates_dropped: int
    committed: bool
    def __init__(self, received_bytes: _Optional[int] = ..., duplicates_dropped: _Optional[int] = ..., committed: _Optional[bool] = ...) -> None: ...

class CommitPartitionRequest(_message.Message):
    __slots__ = ("partition", "index", "manifest", "application_id", "placement")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    APPLICATION_ID_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    partition: PartitionKey
    index: bytes
    manifest: bytes
    application_id: str
    placement: bytes
    def __init__(self, partition: _Optional[_Union[PartitionKey, _Mapping]] = ..., index: _Optional[bytes] = ..., manifest: _Optional[bytes] = ..., application_id: _Optional[str] = ..., placement: _Optional[bytes] = ...) -> None: ...

class CommitPartitionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MergePartitionsRequest(_message.Message):
    __slots__ = ("merged", "sources", "number_of_subpartitions", "application_id", "placement")
    MERGED_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    NUMBER_OF_SUBPARTITIONS_FIELD_NUMBER: _ClassVar[int]
    APPLICATION_ID_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    merged: PartitionKey
    sources: _containers.RepeatedCompositeFieldContainer[PartitionKey]
    number_of_subpartitions: int
    application_id: str
    placement: bytes
    def __init__(self, merged: _Optional[_Union[PartitionKey, _Mapping]] = ..., sources: _Optional[_Iterable[_Union[PartitionKey, _Mapping]]] = ..., number_of_subpartitions: _Optional[int] = ..., application_id: _Optional[str] = ..., placement: _Optional[bytes] = ...) -> None: ...

class MergePartitionsResponse(_message.Message):
    __slots__ = ("statistics",)
    STATISTICS_FIELD_NUMBER: _ClassVar[int]
    statistics: PartitionStatistics
    def __init__(self, statistics: _Optional[_Union[PartitionStatistics, _Mapping]] = ...) -> None: ...

class FetchDataRequest(_message.Message):
    __slots__ = ("partition", "first_subpartition", "last_subpartition", "max_chunk_bytes")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    FIRST_SUBPARTITION_FIELD_NUMBER: _ClassVar[int]
    LAST_SUBPARTITION_FIELD_NUMBER: _ClassVar[int]
    MAX_CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    partition: PartitionKey
    first_subpartition: int
    last_subpartition: int
    max_chunk_bytes: int
    def __init__(self, partition: _Optional[_Union[PartitionKey, _Mapping]] = ..., first_subpartition: _Optional[int] = ..., last_subpartition: _Optional[int] = ..., max_chunk_bytes: _Optional[int] = ...) -> None: ...

class FetchDataResponse(_message.Message):
    __slots__ = ("manifest", "data", "run_checksum", "end_of_run")
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    RUN_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    END_OF_RUN_FIELD_NUMBER: _ClassVar[int]
    manifest: bytes
    data: bytes
    run_checksum: int
    end_of_run: bool
    def __init__(self, manifest: _Optional[bytes] = ..., data: _Optional[bytes] = ..., run_checksum: _Optional[int] = ..., end_of_run: _Optional[bool] = ...) -> None: ...

class FetchBatchRequest(_message.Message):
    __slots__ = ("fetches",)
    FETCHES_FIELD_NUMBER: _ClassVar[int]
    fetches: _containers.RepeatedCompositeFieldContainer[FetchDataRequest]
    def __init__(self, fetches: _Optional[_Iterable[_Union[FetchDataRequest, _Mapping]]] = ...) -> None: ...

class DataPortError(_message.Message):
    __slots__ = ("error_class", "partition", "message")
    ERROR_CLASS_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    error_class: str
    partition: PartitionKey
    message: str
    def __init__(self, error_class: _Optional[str] = ..., partition: _Optional[_Union[PartitionKey, _Mapping]] = ..., message: _Optional[str] = ...) -> None: ...

class WorkerReleasePartitionsRequest(_message.Message):
    __slots__ = ("partitions",)
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionKey]
    def __init__(self, partitions: _Optional[_Iterable[_Union[PartitionKey, _Mapping]]] = ...) -> None: ...

class WorkerReleasePartitionsResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: int
    def __init__(self, released: _Optional[int] = ...) -> None: ...

class WorkerPartitionStatusRequest(_message.Message):
    __slots__ = ("partitions", "without_statistics")
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    WITHOUT_STATISTICS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionKey]
    without_statistics: bool
    def __init__(self, partitions: _Optional[_Iterable[_Union[PartitionKey, _Mapping]]] = ..., without_statistics: _Optional[bool] = ...) -> None: ...

class WorkerPartitionStatusResponse(_message.Message):
    __slots__ = ("partitions",)
    class Entry(_message.Message):
        __slots__ = ("partition", "committed", "statistics")
        PARTITION_FIELD_NUMBER: _ClassVar[int]
        COMMITTED_FIELD_NUMBER: _ClassVar[int]
        STATISTICS_FIELD_NUMBER: _ClassVar[int]
        partition: PartitionKey
        committed: bool
        statistics: PartitionStatistics
        def __init__(self, partition: _Optional[_Union[PartitionKey, _Mapping]] = ..., committed: _Optional[bool] = ..., statistics: _Optional[_Union[PartitionStatistics, _Mapping]] = ...) -> None: ...
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[WorkerPartitionStatusResponse.Entry]
    def __init__(self, partitions: _Optional[_Iterable[_Union[WorkerPartitionStatusResponse.Entry, _Mapping]]] = ...) -> None: ...

class DecommissionWorkerRequest(_message.Message):
    __slots__ = ("worker_id", "cancel")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    cancel: bool
    def __init__(self, worker_id: _Optional[str] = ..., cancel: _Optional[bool] = ...) -> None: ...

class DecommissionRequest(_message.Message):
    __slots__ = ("cancel",)
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    cancel: bool
    def __init__(self, cancel: _Optional[bool] = ...) -> None: ...

class DecommissionResponse(_message.Message):
    __slots__ = ("partitions_remaining",)
    PARTITIONS_REMAINING_FIELD_NUMBER: _ClassVar[int]
    partitions_remaining: int
    def __init__(self, partitions_remaining: _Optional[int] = ...) -> None: ...

class ExternalShuffleDescriptorDetails(_message.Message):
    __slots__ = ("replicas", "placement")
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    replicas: _containers.RepeatedCompositeFieldContainer[WorkerInfo]
    placement: bytes
    def __init__(self, replicas: _Optional[_Iterable[_Union[WorkerInfo, _Mapping]]] = ..., placement: _Optional[bytes] = ...) -> None: ...

class ListApplicationsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListApplicationsResponse(_message.Message):
    __slots__ = ("applications",)
    class Entry(_message.Message):
        __slots__ = ("application_id", "seconds_since_heartbeat", "partitions", "identity", "stored_bytes")
        APPLICATION_ID_FIELD_NUMBER: _ClassVar[int]
        SECONDS_SINCE_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
        PARTITIONS_FIELD_NUMBER: _ClassVar[int]
        IDENTITY_FIELD_NUMBER: _ClassVar[int]
        STORED_BYTES_FIELD_NUMBER: _ClassVar[int]
        application_id: str
        seconds_since_heartbeat: float
        partitions: int
        identity: ApplicationIdentity
        stored_bytes: int
        def __init__(self, application_id: _Optional[str] = ..., seconds_since_heartbeat: _Optional[float] = ..., partitions: _Optional[int] = ..., identity: _Optional[_Union[ApplicationIdentity, _Mapping]] = ..., stored_bytes: _Optional[int] = ...) -> None: ...
    APPLICATIONS_FIELD_NUMBER: _ClassVar[int]
    applications: _containers.RepeatedCompositeFieldContainer[ListApplicationsResponse.Entry]
    def __init__(self, applications: _Optional[_Iterable[_Union[ListApplicationsResponse.Entry, _Mapping]]] = ...) -> None: ...

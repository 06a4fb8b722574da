"""What runs inside Spark's Python workers: the map task that writes a partition and the reduce
task that reads an input gate. Specs are built on the driver and travel with the task; the
shuffle environment is created once per worker process and outlives its tasks, so partitions
stay served after the task that wrote them is gone.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import pyarrow as pa
from pyspark import TaskContext

from blob import BLOB_CACHE_MAX_SIZE
from pyspark_shuffle.kernels.operations import ReduceOperation
from pyspark_shuffle.kernels.partitioners import Partitioner
from pyspark_shuffle.options import PYSPARK_SHUFFLE_OPTIONS, WORKER_MEMORY_POOL
from pyspark_shuffle.tasks.executor import this_executor
from pyspark_shuffle.tasks.merged_reads import MergedSources, input_gates
from pyspark_shuffle.tasks.python_worker import use_memory_pool
from scheduling.deployment import (
    ConsumerDeploymentDescriptor,
    resolve_gate,
)
from scheduling.map_sizes import MapSizes
from shuffle_api import (
    Configuration,
    InputGateDeploymentDescriptor,
    IntermediateResultPartitionID,
    PartitionDescriptor,
    PartitionStatistics,
    ProducerDescriptor,
    ResultPartitionDeploymentDescriptor,
    ResultPartitionID,
    ResultPartitionType,
    ShuffleDescriptor,
    ShuffleEnvironment,
    ShuffleEnvironmentContext,
    ShuffleIOOwner,
    UnknownShuffleDescriptor,
    deserialize,
    load_shuffle_service_factory,
    new_id,
    serialize,
)
from shuffle_api.options import CORE_OPTIONS, TARGET_BATCH_SIZE
from shuffle_runtime.batches import coalesce
from shuffle_runtime.ndarrays import bytes_array, longs

if TYPE_CHECKING:
    from pyspark_shuffle.spark.link import TaskAccumulator, TaskBroadcast

__all__ = [
    "MAP_OUTPUT_SCHEMA",
    "MERGED_OUTPUT_SCHEMA",
    "MapOutputs",
    "MapReport",
    "MapReports",
    "MapStageSpec",
    "MapTaskResult",
    "ReduceStageSpec",
    "add_counts",
    "merge_map_outputs",
    "merge_map_reports",
    "run_map_task",
    "run_merge_task",
    "run_reduce_task",
    "task_attempt_id",
    "task_environment",
]

MAP_OUTPUT_SCHEMA: Final = "map_index long, attempt string, producer binary"
"""The one metadata row each map task returns (Spark DDL). Spark's shuffle of these rows is
read by every reducer (see ``Exchange.held_map_outputs``), so a row names the attempt and
nothing more: a stage then shuffles O(M) bytes and its reducers read O(M) each, where
statistics (O(R) per row) would make it O(M x R) and O(M x R^2). The rest of what a map task
tells the driver is its :class:`MapReport`."""

_ENVIRONMENTS: dict[tuple[int, str, str], ShuffleEnvironment] = {}
_ENVIRONMENTS_LOCK = threading.Lock()


def task_environment(configuration: Configuration, secret: bytes) -> ShuffleEnvironment:
    """This process's started environment for ``configuration`` and the application's
    ``secret`` (created on first use), hosted by this Python worker's executor.

    Host-local options are read from this executor's own environment. Keyed by process id
    too: Spark forks Python workers, and a child must not reuse its parent's. The first one
    also sets the process's Arrow memory pool (``pyspark-shuffle.worker.memory-pool``).
    """
    key = (
        os.getpid(),
        repr((sorted(configuration.values.items()), configuration.environment)),
        hashlib.sha256(secret).hexdigest(),
    )
    with _ENVIRONMENTS_LOCK:
        environment = _ENVIRONMENTS.get(key)
        if environment is None:
            use_memory_pool(configuration.get(WORKER_MEMORY_POOL))
            factory = load_shuffle_service_factory(
                configuration, extra_options=PYSPARK_SHUFFLE_OPTIONS
            )
            options = (*CORE_OPTIONS, *factory.config_options(), *PYSPARK_SHUFFLE_OPTIONS)
            executor = this_executor()
            environment = factory.create_shuffle_environment(
                ShuffleEnvironmentContext(
                    configuration.on_host(options),
                    resource_id=f"spark-python-{os.getpid()}-{new_id()[:12]}",
                    host=executor.address,
                    secret=secret,
                    executor_pid=executor.jvm_pid,
                    local_directory=executor.local_directory,
                )
            )
            environment.start()
            _ENVIRONMENTS[key] = environment
    return environment


@dataclass(frozen=True, slots=True)
class MapStageSpec:
    """What every map task of one exchange needs."""

    configuration: Configuration
    result_id: str
    number_of_maps: int | None
    """``None`` until the map stage tells (a Spark Connect DataFrame's partitions)."""
    partitioner: Partitioner
    secret: bytes = field(repr=False)
    """The application's: the tasks' data ports prove it to each other."""

    def merged_partition_descriptor(self, group: int, groups: int) -> PartitionDescriptor:
        """Merged partition ``group`` of ``groups``: a partition of the same result, numbered
        after the map tasks' (their number known by then)."""
        maps = self.number_of_maps
        assert maps is not None, "a merge runs after the map stage"
        return PartitionDescriptor(
            self.result_id,
            maps + groups,
            IntermediateResultPartitionID(self.result_id, maps + group),
            ResultPartitionType.BLOCKING,
            self.partitioner.number_of_subpartitions,
        )

    def partition_descriptor(self, map_index: int) -> PartitionDescriptor:
        # Where the number is not known yet, the task's own descriptor names at least its own
        # index: the driver registers each partition with the whole number.
        return PartitionDescriptor(
            self.result_id,
            self.number_of_maps or map_index + 1,
            IntermediateResultPartitionID(self.result_id, map_index),
            ResultPartitionType.BLOCKING,
            self.partitioner.number_of_subpartitions,
        )


def task_attempt_id() -> str:
    """The running Spark task attempt, as the attempt id of what it writes or reads.

    Structured, not random (as Flink's ExecutionAttemptID): a producer's attempt id is in its
    shuffle descriptor, and the shared list of thousands of descriptors compresses only if
    the ids do. Unique where it must be: Spark numbers task attempts once per SparkContext,
    so a retried or speculative attempt and a rerun of a lost producer (a new Spark job) each
    get their own; the result id beside it in a partition id ends in a random per-exchange
    suffix, so applications that share an external shuffle cluster never meet.
    """
    task = TaskContext.get()
    assert task is not None, "Spark sets the TaskContext of every Python task"
    return f"task-{task.taskAttemptId()}"


@dataclass(frozen=True, slots=True)
class MapReport:
    """What one map task attempt wrote, for the driver: its sizes, compressed (see
    :class:`~scheduling.map_sizes.MapSizes`: O(1) for the driver to keep, where every
    subpartition's rows and bytes would be O(R)), and the Arrow schema of its batches
    (``None`` when it wrote no rows)."""

    sizes: bytes
    arrow_schema: bytes | None

    @classmethod
    def of(cls, statistics: PartitionStatistics, schema: pa.Schema | None) -> MapReport:
        return cls(
            MapSizes.of(statistics).encode(),
            None if schema is None else schema.serialize().to_pybytes(),
        )

    def map_sizes(self) -> MapSizes:
        return MapSizes.decode(self.sizes)

    def schema(self) -> pa.Schema | None:
        if self.arrow_schema is None:
            return None
        return pa.ipc.read_schema(pa.py_buffer(self.arrow_schema))


MapReports = dict[tuple[int, str], MapReport]
"""Map task attempts' reports, by map index and attempt id."""


def merge_map_reports(first: MapReports, second: MapReports) -> MapReports:
    """Map reports merged in place: the driver merges one per map task, and copying the
    whole dict each time would make M tasks cost O(M^2)."""
    first.update(second)
    return first


@dataclass(frozen=True, slots=True)
class MapTaskResult:
    """A map task's metadata row (``MAP_OUTPUT_SCHEMA``) and its report."""

    row: pa.RecordBatch
    report: MapReport
    statistics: PartitionStatistics


def run_map_task(
    spec: MapStageSpec, map_index: int, batches: Iterator[pa.RecordBatch]
) -> MapTaskResult:
    """Write ``batches`` as partition ``map_index`` under this task attempt's id; return the
    metadata row and the report. An error fails the writer, which leaves nothing behind."""
    environment = task_environment(spec.configuration, spec.secret)
    attempt = task_attempt_id()
    descriptor = spec.partition_descriptor(map_index)
    # Placement is the environment's: the master learns of the partition when the driver
    # registers this attempt, which is also why a retried attempt is never read twice.
    placeholder = UnknownShuffleDescriptor(ResultPartitionID(descriptor.partition_id, attempt))
    [writer] = environment.create_result_partition_writers(
        ShuffleIOOwner(f"map {map_index} of {spec.result_id}", attempt),
        [ResultPartitionDeploymentDescriptor(descriptor, placeholder)],
    )
    schema: pa.Schema | None = None
    # Spark hands over batches of spark.sql.execution.arrow.maxRecordsPerBatch rows (10k by
    # default), which split into tiny pieces per subpartition; each piece costs the writer a
    # fixed overhead, so write batches of the size the writer aims for instead (one copy).
    nonempty = (batch for batch in batches if batch.num_rows)
    with writer:
        for batch in coalesce(nonempty, spec.configuration.get(TARGET_BATCH_SIZE)):
            schema = schema or batch.schema
            writer.write(batch, spec.partitioner.subpartitions(batch))
        statistics = writer.finish()
    row = pa.record_batch(
        {
            "map_index": longs([map_index]),
            "attempt": bytes_array([attempt.encode()], pa.string()),
            "producer": bytes_array([serialize(environment.producer_descriptor(attempt))]),
        }
    )
    return MapTaskResult(row, MapReport.of(statistics, schema), statistics)


MERGED_OUTPUT_SCHEMA: Final = "merge_group long, producer binary"
"""The row a merge task returns for the partition it merged (Spark DDL)."""


def run_merge_task(
    spec: MapStageSpec, group: int, groups: int, sources: Sequence[bytes]
) -> pa.RecordBatch | None:
    """Merge the map outputs ``sources`` (serialized descriptors, in map order) into merged
    partition ``group`` of ``groups`` under this task attempt's id; its row, or ``None`` where
    this task's environment does not merge them (nothing written)."""
    environment = task_environment(spec.configuration, spec.secret)
    attempt = task_attempt_id()
    descriptor = spec.merged_partition_descriptor(group, groups)
    placeholder = UnknownShuffleDescriptor(ResultPartitionID(descriptor.partition_id, attempt))
    descriptors = []
    for encoded in sources:
        source = deserialize(encoded)
        assert isinstance(source, ShuffleDescriptor)
        descriptors.append(source)
    statistics = environment.merge_partitions(
        ShuffleIOOwner(f"merge {group} of {spec.result_id}", attempt),
        descriptors,
        ResultPartitionDeploymentDescriptor(descriptor, placeholder),
    )
    if statistics is None:
        return None
    return pa.record_batch(
        {
            "merge_group": longs([group]),
            "producer": bytes_array([serialize(environment.producer_descriptor(attempt))]),
        }
    )


@dataclass(frozen=True, slots=True)
class ReduceStageSpec:
    """What every reduce task needs. The deployments of all reducers are one shared value (a
    Spark broadcast, or a blob): a task carries only its handle, and each Python worker
    process loads the value once, so
    R reducers cost O(R) bytes, not O(R^2). Within it, the deployments share each input's one
    compressed descriptor list (pickled once) or name it by blob key, fetched once per Python
    worker process through its blob cache."""

    configuration: Configuration
    secret: bytes = field(repr=False)
    deployments: TaskBroadcast[tuple[ConsumerDeploymentDescriptor, ...]]
    schemas: tuple[pa.Schema, ...]
    operation: ReduceOperation
    read: TaskAccumulator[ReadCounts] | None = None
    """Rows and bytes the reducers read."""
    reruns_read: TaskAccumulator[MapOutputs] | None = None
    """Map outputs reducers read that Spark reran inside an action: the driver registers
    them afterwards (so it releases them, and counts them as reruns)."""
    merged_sources: TaskBroadcast[MergedSources] | None = None
    """The sources of the merged partitions reducers read, read where one fails."""


MapOutputs = frozenset[tuple[str, int, bytes]]
"""(result id, map index, serialized producer) of map outputs."""

ReadCounts = tuple[int, int]
"""Rows and bytes."""


def merge_map_outputs(first: MapOutputs, second: MapOutputs) -> MapOutputs:
    return first | second


def add_counts(first: ReadCounts, second: ReadCounts) -> ReadCounts:
    return first[0] + second[0], first[1] + second[1]


def _counted(batches: Iterator[pa.RecordBatch], spec: ReduceStageSpec) -> Iterator[pa.RecordBatch]:
    rows = size = 0
    for batch in batches:
        rows += batch.num_rows
        size += batch.nbytes
        yield batch
    if spec.read is not None:
        spec.read.add((rows, size))


def current_map_outputs(
    gate: InputGateDeploymentDescriptor,
    reran: Mapping[tuple[str, int], bytes],
    environment: ShuffleEnvironment,
    reruns: set[tuple[str, int, bytes]],
) -> InputGateDeploymentDescriptor:
    """The gate with each map output Spark reran inside this action (``reran``: producers of
    attempts the driver never registered, by result id and map index) described from its
    producer, where the service can (and added to ``reruns``)."""

    def current(descriptor: ShuffleDescriptor) -> ShuffleDescriptor:
        partition = descriptor.result_partition_id
        index = partition.partition_id.partition_index
        encoded = reran.get((gate.result_id, index))
        if encoded is None:
            return descriptor
        producer = deserialize(encoded)
        assert isinstance(producer, ProducerDescriptor)
        attempt = producer.producer_execution_id
        described = environment.describe_unregistered(
            ResultPartitionID(partition.partition_id, attempt), producer
        )
        if described is None:
            return descriptor
        reruns.add((gate.result_id, index, encoded))
        return described

    descriptors = [current(descriptor) for descriptor in gate.shuffle_descriptors]
    return dataclasses.replace(gate, shuffle_descriptors=tuple(descriptors))


def run_reduce_task(
    spec: ReduceStageSpec, reducer: int, reran: Mapping[tuple[str, int], bytes]
) -> Iterator[pa.RecordBatch]:
    """Read what reducer ``reducer`` reads of every input (the attempts Spark made, ``reran``,
    where it reran a map task inside the action); apply the operation."""
    environment = task_environment(spec.configuration, spec.secret)
    owner = ShuffleIOOwner(f"reducer {reducer}", task_attempt_id())
    references = spec.deployments.value[reducer].inputs
    cache_bytes = spec.configuration.get(BLOB_CACHE_MAX_SIZE)
    reruns: set[tuple[str, int, bytes]] = set()
    gates = input_gates(
        environment,
        owner,
        [
            current_map_outputs(
                resolve_gate(reference, blob_cache_bytes=cache_bytes),
                reran,
                environment,
                reruns,
            )
            for reference in references
        ],
        {} if spec.merged_sources is None else spec.merged_sources.value,
    )
    if reruns and spec.reruns_read is not None:
        spec.reruns_read.add(frozenset(reruns))
    # A reducer of many map outputs reads a small block of each: gathered into batches of
    # the target size, as Spark hands a task its rows, so that neither the operation nor the
    # JVM pays per block (Spark's Arrow path costs tens of microseconds a batch).
    target = spec.configuration.get(TARGET_BATCH_SIZE)
    try:
        yield from spec.operation.apply(
            [
                _counted(
                    coalesce(iter(gate), target, size=pa.RecordBatch.get_total_buffer_size), spec
                )
                for gate in gates
            ],
            spec.schemas,
        )
    finally:
        for gate in gates:
            gate.close()

"""The driver's side of one shuffle of one DataFrame: run the map stage, register each map
task's partition with the master, rerun the producers of lost partitions, describe the
partitions to reducers, release them."""

from __future__ import annotations

import dataclasses
import logging
import operator
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Final, TypeVar

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F  # noqa: N812 (Spark's own spelling)

from pyspark_shuffle.driver.inputs import MapInput
from pyspark_shuffle.driver.map_outputs import (
    ExchangeState,
    MapOutput,
    MapOutputRegistry,
    decode_producer,
)
from pyspark_shuffle.driver.merged_outputs import MergedOutput, MergedOutputs, merge_groups
from pyspark_shuffle.driver.progress import StageProgress, StageTallies, bar_stream
from pyspark_shuffle.driver.registry import RegisteredExchange
from pyspark_shuffle.kernels.partitioners import Partitioner
from pyspark_shuffle.kernels.planning import MapOutputBytes
from pyspark_shuffle.options import (
    MAX_RECOVERY_ATTEMPTS,
    MERGE_MAX_BLOCK_SIZE,
    MERGE_MIN_BLOCKS,
    MERGE_TASKS,
    PROGRESS_BAR,
    PROGRESS_INTERVAL,
    RERUN_IN_ACTIONS,
)
from pyspark_shuffle.spark.internals import HeldShuffle, SparkShuffleOutputs, held_shuffle
from pyspark_shuffle.spark.link import SparkLink, TaskAccumulator, TaskBroadcast
from pyspark_shuffle.tasks.map_reduce import (
    MAP_OUTPUT_SCHEMA,
    MERGED_OUTPUT_SCHEMA,
    MapOutputs,
    MapReport,
    MapReports,
    MapStageSpec,
    merge_map_outputs,
    merge_map_reports,
    run_map_task,
    run_merge_task,
)
from pyspark_shuffle.tasks.python_worker import task_starts
from shuffle_api import (
    Configuration,
    InvalidOperationError,
    ProducerDescriptor,
    RecordingJobContext,
    ResultPartitionID,
    ShuffleDescriptor,
    ShuffleMaster,
    StageCancelledError,
    StageFailedError,
    new_id,
    serialize,
)
from shuffle_runtime.ndarrays import bytes_array

__all__ = ["Exchange", "MapOutput", "stage_failure"]

T = TypeVar("T")

_LOG = logging.getLogger(__name__)

# The last line of a Python traceback: pyarrow's ArrowInvalid ends in neither word.
_PYTHON_ERROR = re.compile(r"^(\w+(?:\.\w+)*(?:Error|Exception|Invalid)): (.*)$", re.MULTILINE)


# How Spark says a job was cancelled: classic job groups, and Connect's interrupts.
_CANCELLED = re.compile(
    r"OPERATION_CANCELED|SPARK_JOB_CANCELLED|cancelled part of cancelled job group"
    r"|Job \d+ cancelled"
)


def stage_failure(description: str, error: Exception) -> StageFailedError:
    """A Spark job's failure as a typed error that names the task's own error first
    (:class:`StageCancelledError` where the job was cancelled)."""
    text = str(error)
    if _CANCELLED.search(text):
        return StageCancelledError(f"{description} was cancelled: {text.strip().splitlines()[0]}")
    found = _PYTHON_ERROR.findall(text)
    cause = f"{found[-1][0]}: {found[-1][1]}" if found else text.strip().splitlines()[0]
    return StageFailedError(f"{description} failed: {cause}")


@dataclass(frozen=True, slots=True)
class _Runs:
    """How many times each map task ran (first run and reruns) and for how long."""

    per_map: dict[int, int]
    seconds: float


_REPORTED_SCHEMA: Final = f"{MAP_OUTPUT_SCHEMA}, sizes binary, arrow_schema binary"
"""A map task's row with its :class:`MapReport`'s fields in it (where no Spark shuffle of the
rows is held)."""


def _rerun_in_actions(setting: str, spark_outputs: SparkShuffleOutputs) -> bool:
    """Whether map outputs on executors are held in a Spark shuffle (see
    ``RERUN_IN_ACTIONS``)."""
    return setting == "true" or (setting == "auto" and not spark_outputs.one_executor)


def _attempts_of(outputs: Mapping[int, MapOutput]) -> dict[int, str]:
    """The attempt of each map task's registered output."""
    return {index: output.attempt for index, output in outputs.items()}


def _producer_of(row: Row) -> ProducerDescriptor:
    return decode_producer(bytes(row["producer"]), "a map task")


class Exchange(RegisteredExchange):
    """One map input (a DataFrame, or a source its tasks read) shuffled by one partitioner
    through the service's master."""

    def __init__(
        self,
        link: SparkLink,
        *,
        master: ShuffleMaster,
        job: RecordingJobContext,
        configuration: Configuration,
        secret: bytes,
        spark_outputs: SparkShuffleOutputs | None,
        map_input: MapInput,
        partitioner: Partitioner,
        name: str,
        automatic_reducers: bool,
    ) -> None:
        self._link = link
        self._master = master
        self._job = job
        self._configuration = configuration
        self._spark_outputs = spark_outputs
        """Spark's map output tracker, where it is reachable (classic sessions)."""
        self.frame_schema = map_input.schema
        self.upstream = tuple(map_input.upstream)
        self.producer_stage = map_input.producer_stage
        self.name = name
        # Reducers from bytes written (neighbouring subpartitions coalesced), or one each.
        self.automatic_reducers = automatic_reducers
        self.result_id = f"{re.sub(r'[^A-Za-z0-9_.-]', '-', name)[:60]}-{new_id()[:12]}"
        # None under Spark Connect for a DataFrame's partitions: the map stage tells.
        number_of_maps = map_input.number_of_maps
        self.spec = MapStageSpec(configuration, self.result_id, number_of_maps, partitioner, secret)
        self._tallies: StageTallies | None = None  # for progress lines
        # Every copy a map task attempt wrote, registered or not: Spark may run map tasks
        # again (inside an action, or remaking a released exchange) beyond what the driver
        # registers, and each copy must be deleted in the end. Only where the map outputs'
        # rows are held in Spark's shuffle (classic sessions): otherwise the driver sees
        # every attempt's row, and no action reruns map tasks.
        self._written: TaskAccumulator[MapOutputs] | None = None
        # Map tasks' reports: counted on the side where the rows travel through Spark's
        # shuffle (which must stay O(M)), else in the rows themselves.
        self._reports: TaskAccumulator[MapReports] | None = None
        if spark_outputs is not None:
            self._tallies = StageTallies(
                link.tally(0, operator.add),
                link.tally(0, operator.add),
                link.tally(0, operator.add),
            )
            self._written = link.tally(frozenset(), merge_map_outputs)
            self._reports = link.tally({}, merge_map_reports)
        self._mapped = self._map_frame(map_input, None)
        self._map_input = map_input
        # Built by the first run of the map stage (see held_map_outputs).
        self._anchor: HeldShuffle | None = None
        self._held = spark_outputs is not None and _rerun_in_actions(
            configuration.get(RERUN_IN_ACTIONS), spark_outputs
        )
        self._map_outputs = MapOutputRegistry(name)
        self._merged = MergedOutputs()
        self._merge_tried = False
        self._schema: pa.Schema | None = None
        self._map_seconds = 0.0

    def _map_frame(self, map_input: MapInput, only: frozenset[int] | None) -> DataFrame:
        """The map tasks as a DataFrame of their rows; with ``only``, the tasks of other map
        indexes write nothing and yield no row."""
        spec = self.spec
        tallies, written, reports = self._tallies, self._written, self._reports

        def map_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            task_starts()
            task = TaskContext.get()
            assert task is not None
            map_index = task.partitionId()
            if only is not None and map_index not in only:
                return
            result = run_map_task(spec, map_index, batches)
            row = result.row
            if tallies is not None:
                tallies.tasks.add(1)
                tallies.rows.add(result.statistics.total_rows)
                tallies.size.add(result.statistics.total_bytes)
            producer = row.column("producer")[0].as_py()
            attempt = row.column("attempt")[0].as_py()
            if written is not None:
                written.add(frozenset({(spec.result_id, map_index, producer)}))
            if reports is not None:
                reports.add({(map_index, attempt): result.report})
            else:
                report = result.report
                for name, value in (
                    ("sizes", report.sizes),
                    ("arrow_schema", report.arrow_schema),
                ):
                    row = row.append_column(name, bytes_array([value]))
            yield row

        schema = MAP_OUTPUT_SCHEMA if self._reports is not None else _REPORTED_SCHEMA
        return map_input.map_in_arrow(map_partition, schema)

    @property
    def number_of_maps(self) -> int:
        """Its map tasks (known once the map stage ran, at the latest)."""
        if self.spec.number_of_maps is None:
            raise InvalidOperationError(f"{self.name}: its map stage has not run yet")
        return self.spec.number_of_maps

    @property
    def outputs(self) -> dict[int, MapOutput]:
        return self._map_outputs.outputs

    @property
    def runs(self) -> _Runs:
        return _Runs(self._map_outputs.registrations(), self._map_seconds)

    @property
    def released(self) -> bool:
        return self._map_outputs.state is not ExchangeState.OPEN

    @property
    def total_rows(self) -> int:
        """Rows its registered map outputs hold."""
        return sum(output.sizes.rows for output in self.outputs.values())

    @property
    def total_bytes(self) -> int:
        """Bytes its registered map outputs hold, as stored."""
        return sum(output.sizes.stored_bytes for output in self.outputs.values())

    def write(self) -> None:
        """Run the map stage: every input partition written once."""
        rows = self._collect()
        if self.spec.number_of_maps is None and not rows:
            self._map_input = self._map_input.with_one_task()
            self._mapped = self._map_frame(self._map_input, None)
            rows = self._collect()
        if self.spec.number_of_maps is None:
            indexes = sorted(int(row["map_index"]) for row in rows)
            if indexes != list(range(len(rows))):
                raise StageFailedError(
                    f"{self.name}: the map stage gave rows of map tasks {indexes[:8]}...,"
                    f" not one row for each of {len(rows)} tasks"
                )
            self.spec = dataclasses.replace(self.spec, number_of_maps=len(rows))
        self._register_rows(rows, None)
        if not any(
            output.descriptor.stores_local_resources_on() is not None
            for output in self.outputs.values()
        ):
            # The partitions outlive their producers' executors (the external service's, or
            # on an object store): losing an executor loses nothing, and Spark need not keep
            # it for this shuffle. Nor its shuffle of the rows, whose files would hold the
            # executors under dynamic allocation's shuffle tracking.
            self._held = False
            if self._anchor is not None and self._spark_outputs is not None:
                self._spark_outputs.drop(self._anchor)
            self._anchor = None

    def held_map_outputs(self) -> DataFrame | None:
        """Spark's shuffle of the map tasks' metadata rows into one partition (columns of
        ``MAP_OUTPUT_SCHEMA`` and ``result_id``), when the map outputs live on the executors
        that wrote them (else ``None``).

        A reduce stage that reads it depends on the map stage through Spark's own shuffle:
        if an executor dies with its map outputs, Spark reruns those map tasks (a fetch
        failure) inside the action, and the reducers find the new attempts in it."""
        return self._anchor.frame if self._held and self._anchor is not None else None

    @property
    def on_executors(self) -> bool:
        return self.held_map_outputs() is not None

    def spark_shuffle_bytes(self) -> int | None:
        """Bytes of Spark's shuffle of its map tasks' rows (see :meth:`held_map_outputs`)."""
        if self._spark_outputs is None:
            return None
        if self.held_map_outputs() is None or self._anchor is None:
            return 0
        return self._spark_outputs.bytes_written(self._anchor)

    def _collect(self) -> list[Row]:
        """The metadata rows of the map outputs Spark holds, running the map tasks whose
        outputs it does not hold (all of them the first time)."""

        def job() -> list[Row]:
            if not self._held:  # no Spark shuffle of the rows (Spark Connect, or none asked for)
                collected: list[Row] = self._mapped.collect()
                return collected
            if self._anchor is None:
                # The map stage's rows shuffled into one partition: the driver collects them.
                rows = self._mapped.withColumn("result_id", F.lit(self.result_id))
                self._anchor = held_shuffle(rows.repartition(1))
            held: list[Row] = self._anchor.frame.collect()
            return held

        return self._timed(self.spec.number_of_maps, job)

    def _timed(
        self, tasks: int | None, job: Callable[[], list[T]], stage: str = "map stage"
    ) -> list[T]:
        counted = "" if tasks is None else f" ({tasks} tasks)"
        description = f"{stage} of {self.name}{counted}"
        started = time.perf_counter()
        try:
            with StageProgress(
                self._link.spark,
                description,
                tallies=self._tallies,
                interval=self._configuration.get(PROGRESS_INTERVAL),
                tasks=tasks,
                bar=bar_stream(self._link.spark, self._configuration.get(PROGRESS_BAR)),
            ):
                rows = job()
        except Exception as error:  # Py4J and PySpark errors carry the task's error as text
            raise stage_failure(description, error) from error
        self._map_seconds += time.perf_counter() - started
        return rows

    def merge(self, reducers: int) -> None:
        """Before a reduce stage of ``reducers`` tasks that each read every map output: merge
        the map outputs per reducer where that many blocks, small on average, make it pay
        (see ``MERGE_MIN_BLOCKS``), once. Merge tasks that cannot merge theirs (a source
        their process reads from no store) leave them to be read one by one, as does a
        merge job that fails."""
        if self._merge_tried or self.released:
            return
        self._merge_tried = True
        if self.on_executors:
            # Spark reruns map tasks lost with an executor inside the action, and reducers
            # read the reruns; a merged partition lost with it would fail them instead.
            return
        maps = self.number_of_maps
        blocks = maps * reducers
        minimum = self._configuration.get(MERGE_MIN_BLOCKS)
        if not minimum or blocks < minimum:
            return
        if self.total_bytes > blocks * self._configuration.get(MERGE_MAX_BLOCK_SIZE):
            return
        tasks = self._configuration.get(MERGE_TASKS) or self._link.default_parallelism()
        outputs = self.outputs
        groups = merge_groups(
            [outputs[index].descriptor.merge_site() for index in range(maps)], tasks
        )
        attempts = _attempts_of(outputs)
        sources = self._link.share(
            tuple(
                tuple(serialize(outputs[index].descriptor) for index in group) for group in groups
            )
        )
        try:
            rows: list[Row] = self._timed(
                len(groups),
                lambda: self._merge_frame(sources, len(groups)).collect(),
                stage="merge",
            )
        except StageCancelledError:
            raise
        except StageFailedError as error:
            _LOG.warning(
                "%s: map outputs read unmerged, as their merge failed: %s", self.name, error
            )
            return
        finally:
            sources.unpersist()
        for row in rows:
            group = int(row["merge_group"])
            descriptor = self._master.register_partition_with_producer(
                self._job.job_id,
                self.spec.merged_partition_descriptor(group, len(groups)),
                decode_producer(bytes(row["producer"]), "a merge task"),
            ).result()
            merged = MergedOutput(
                descriptor, groups[group], tuple(attempts[index] for index in groups[group])
            )
            if not self._merged.add(merged, _attempts_of(self.outputs)):
                self._master.release_partition_externally(descriptor)
        if self.released:  # while merging: nothing reads them
            self._release_merged(self._merged.release())
        _LOG.info(
            "%s: %d map outputs merged into %d partitions (%d of %d merge tasks merged)",
            self.name,
            sum(len(groups[int(row["merge_group"])]) for row in rows),
            len(self._merged),
            len(rows),
            len(groups),
        )

    def _merge_frame(
        self, sources: TaskBroadcast[tuple[tuple[bytes, ...], ...]], groups: int
    ) -> DataFrame:
        """The merge tasks: task ``g`` merges the map outputs ``sources.value[g]``."""
        spec = self.spec

        def merge_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            task_starts()
            for batch in batches:
                for group in batch.column(0).to_pylist():
                    row = run_merge_task(spec, group, groups, sources.value[group])
                    if row is not None:
                        yield row

        frame = self._link.spark.range(0, groups, 1, groups)
        return frame.mapInArrow(merge_partition, MERGED_OUTPUT_SCHEMA)

    def _release_merged(self, merged: Sequence[MergedOutput]) -> None:
        self._master.release_partitions_externally([each.descriptor for each in merged])

    def read_descriptors(self) -> tuple[ShuffleDescriptor, ...]:
        """What a reducer that reads every map output reads: each merged partition in place
        of the map outputs it holds, and the rest."""
        return self._merged.read_order(self.descriptors())

    def merged_sources(
        self, read: Sequence[ShuffleDescriptor]
    ) -> dict[ResultPartitionID, tuple[ShuffleDescriptor, ...]]:
        """The sources of the merged partitions among ``read`` (what
        :meth:`read_descriptors` gave), for reducers to read where one fails."""
        kept = {each.result_partition_id for each in read}
        sources = self._merged.sources(self.descriptors())
        return {merged: each for merged, each in sources.items() if merged in kept}

    def _run_maps(self, map_indexes: Sequence[int]) -> None:
        """Run these map tasks again, as a job of their own, and register what they wrote."""
        wanted = list(map_indexes)
        rows: list[Row] = self._timed(
            len(wanted),
            lambda: self._link.run_partitions(self._maps_only, wanted),
        )
        self._register_rows(rows, None)

    def _maps_only(self, only: frozenset[int] | None) -> DataFrame:
        return self._mapped if only is None else self._map_frame(self._map_input, only)

    def _register_rows(self, rows: Sequence[Row], only: set[int] | None) -> None:
        """Register the map outputs in ``rows``; with ``only``, just those of these map tasks
        whose attempt is not the registered one."""
        if only is not None:
            outputs = self.outputs
            rows = [
                row
                for row in rows
                if int(row["map_index"]) in only
                and _producer_of(row).producer_execution_id
                != outputs[int(row["map_index"])].descriptor.result_partition_id.producer_attempt_id
            ]
        # All registrations in flight at once: with an external master each is a round trip
        # to the coordinator, and thousands of map tasks must not wait for them one by one.
        # Every one that succeeds is recorded (so released with the exchange) before the first
        # failure is raised.
        # All checked before any is registered: a registered partition the exchange does
        # not record would never be released.
        producers = [_producer_of(row) for row in rows]
        reports = [self._report_of(row) for row in rows]
        registrations: list[tuple[Row, MapReport, Future[ShuffleDescriptor] | Exception]] = []
        for row, producer, report in zip(rows, producers, reports, strict=True):
            try:
                registrations.append((row, report, self._submit_registration(row, producer)))
            except Exception as error:
                registrations.append((row, report, error))
        failures: list[Exception] = []
        for row, report, registration in registrations:
            try:
                if isinstance(registration, Exception):
                    raise registration
                self._register(row, report, registration.result())
            except Exception as error:
                failures.append(error)
        if failures:
            if len(failures) > 1:
                failures[0].add_note(f"{len(failures) - 1} more map outputs failed to register")
            raise failures[0]

    def adopt(self, map_index: int, producer_bytes: bytes) -> None:
        """Register map ``map_index``'s attempt that Spark reran inside an action (reducers
        read it), in place of the registered one, which went with its executor."""
        producer = decode_producer(producer_bytes, "a reduce task")
        previous = self._map_outputs.replaced_by(map_index, producer.producer_execution_id)
        if previous is None:  # registered before; or released, and release_copies deletes it
            return
        descriptor = self._master.register_partition_with_producer(
            self._job.job_id, self.spec.partition_descriptor(map_index), producer
        ).result()
        self._replace(dataclasses.replace(previous, descriptor=descriptor))

    def _submit_registration(
        self, row: Row, producer: ProducerDescriptor
    ) -> Future[ShuffleDescriptor]:
        return self._master.register_partition_with_producer(
            self._job.job_id, self.spec.partition_descriptor(int(row["map_index"])), producer
        )

    def _report_of(self, row: Row) -> MapReport:
        if self._reports is None:
            schema = row["arrow_schema"]
            return MapReport(bytes(row["sizes"]), None if schema is None else bytes(schema))
        # Spark merges a task's accumulator updates before the job that ran it ends.
        report = self._reports.value.get((int(row["map_index"]), str(row["attempt"])))
        if report is None:
            raise StageFailedError(
                f"{self.name}: map task {row['map_index']} attempt {row['attempt']} sent no report"
            )
        return report

    def _register(self, row: Row, report: MapReport, descriptor: ShuffleDescriptor) -> None:
        map_index = int(row["map_index"])
        schema = report.schema()
        if schema is not None and self._schema is None:
            self._schema = schema
        self._replace(MapOutput(map_index, descriptor, report.map_sizes()))

    def _replace(self, output: MapOutput) -> None:
        """Make ``output`` the registered attempt of its map task; release the one before."""
        previous = self._map_outputs.register(output)
        if previous is not None:
            self._master.release_partition_externally(previous.descriptor)
            if len(self._merged):  # a rerun's output is read from its own partition
                self._release_merged(self._merged.stale(_attempts_of(self.outputs)))

    def lost_maps(self) -> list[int]:
        """Map tasks whose partition the service reported lost or no longer has."""
        metrics = self._master.partitions_with_metrics(self._job.job_id, statistics=False).result()
        unavailable = {m.shuffle_descriptor.result_partition_id for m in metrics if not m.available}
        unavailable.update(self._job.lost)
        # A lost merged partition is not made again: its sources are read.
        self._release_merged(self._merged.lost(unavailable))
        return self._map_outputs.lost(unavailable)

    def recover(self) -> list[int]:
        """Rerun only the producers of lost partitions; return their map indexes.

        First through Spark's shuffle of the map outputs: Spark reruns the map tasks whose
        outputs went with their executor (and those it reran inside an earlier action are
        registered now); the rest, whose outputs Spark still holds, run again as a job of
        their own."""
        rerun: list[int] = []
        for _ in range(self._configuration.get(MAX_RECOVERY_ATTEMPTS) + 1):
            lost = self.lost_maps()
            if not lost:
                return rerun
            if self.held_map_outputs() is not None:
                self._register_rows(self._collect(), set(lost))
            still_lost = self.lost_maps()
            if still_lost:
                self._run_maps(still_lost)
            rerun += lost
        raise StageFailedError(
            f"{self.name}: partitions of map tasks {self.lost_maps()} are still lost after"
            f" {self._configuration.get(MAX_RECOVERY_ATTEMPTS)} reruns"
        )

    def known_attempts(self) -> list[tuple[int, str]]:
        """Every attempt of each map task the driver ever registered: Spark's shuffle of the
        map outputs may name any of these (the registered one, or one it replaced), and
        reducers read the registered one; any other is a rerun Spark made in an action."""
        return self._map_outputs.known_attempts()

    def schema(self, fallback: pa.Schema) -> pa.Schema:
        """The Arrow schema the map tasks wrote (``fallback`` when they wrote no rows)."""
        return self._schema if self._schema is not None else fallback

    def descriptors(self) -> tuple[ShuffleDescriptor, ...]:
        """The registered attempt of every map task, by map index."""
        outputs = self.outputs
        return tuple(outputs[index].descriptor for index in range(self.number_of_maps))

    def written_bytes(self) -> MapOutputBytes:
        """What map task m wrote to subpartition s, as plans weigh it (see
        :class:`~pyspark_shuffle.kernels.planning.MapOutputBytes`)."""
        outputs = self.outputs
        return MapOutputBytes([outputs[index].sizes for index in range(self.number_of_maps)])

    def release(self, *, forget_in_spark: bool = False) -> bool:
        """Delete its partitions, and every other copy its map tasks wrote. With
        ``forget_in_spark``, Spark forgets its map outputs first, so that a rerun of a later
        stage fused from it remakes them rather than reading deleted ones; else reading it
        again fails, naming the partitions it no longer finds. False, and nothing deleted,
        when Spark could not be told."""
        if forget_in_spark and not self._forget_in_spark():
            return False
        # At once: with an external master, a call for thousands of map outputs, not one each.
        self._master.release_partitions_externally(
            [output.descriptor for output in self._map_outputs.release(forget=forget_in_spark)]
        )
        self._release_merged(self._merged.release())
        self.release_copies()
        return True

    def release_copies(self) -> None:
        """Delete the copies map tasks wrote that were never registered: Spark reran them
        (a rerun that remade this exchange once released, a reducer's read of a released
        result, an attempt no reducer read). Spark then forgets the exchange's map outputs
        again, if it was told to once. Run on a released exchange after any Spark job."""
        if not self.released or self._written is None:
            return
        strays = self._map_outputs.strays(self._written.value)
        if strays and self._map_outputs.state is ExchangeState.FORGOTTEN:
            self._forget_in_spark()
        for stray in strays:
            descriptor = self._master.register_partition_with_producer(
                self._job.job_id, self.spec.partition_descriptor(stray.map_index), stray.producer
            ).result()
            self._master.release_partition_externally(descriptor)
            self._map_outputs.swept(stray)

    def _forget_in_spark(self) -> bool:
        return (
            self.held_map_outputs() is None
            or self._anchor is None
            or self._spark_outputs is None
            or self._spark_outputs.forget(self._anchor)
        )

"""Options of the PySpark integration (keys under ``pyspark-shuffle.``).

In Spark conf every pyshuffle key is prefixed with ``spark.pyshuffle.``.
"""

from __future__ import annotations

from typing import Any, Final

from blob import BLOB_OPTIONS
from scheduling.options import SCHEDULING_OPTIONS
from shuffle_api.config import (
    ConfigOption,
    bool_option,
    choice_option,
    float_option,
    int_option,
    memory_option,
)
from shuffle_api.plugins import OptionCatalog, OptionRole

__all__ = [
    "DROPIN_MIN_INPUT_SIZE",
    "JOIN_BROADCAST_THRESHOLD",
    "KEEP_RESULTS",
    "MAP_TARGET_SIZE",
    "MAX_RECOVERY_ATTEMPTS",
    "MAX_SUBPARTITIONS",
    "MERGE_MAX_BLOCK_SIZE",
    "MERGE_MIN_BLOCKS",
    "MERGE_TASKS",
    "PROGRESS_BAR",
    "PROGRESS_INTERVAL",
    "PYSPARK_SHUFFLE_CATALOG",
    "PYSPARK_SHUFFLE_OPTIONS",
    "RANGE_SAMPLE_SIZE",
    "REDUCER_MIN_COUNT",
    "REDUCER_TARGET_SIZE",
    "RERUN_IN_ACTIONS",
    "SPARK_CONF_PREFIX",
    "WORKER_MEMORY_POOL",
]

SPARK_CONF_PREFIX: Final = "spark.pyshuffle."

MAX_SUBPARTITIONS = int_option(
    "pyspark-shuffle.max-subpartitions",
    64,
    "Subpartitions each map task writes when the number of reducers is automatic: the most"
    " reducers a shuffle can have, skew splits aside.",
    minimum=1,
)
REDUCER_TARGET_SIZE = memory_option(
    "pyspark-shuffle.reducer.target-size",
    64 << 20,
    "Bytes a reducer should read when the number of reducers is automatic: neighbouring"
    " subpartitions are coalesced up to it.",
    minimum=1,
)
REDUCER_MIN_COUNT = int_option(
    "pyspark-shuffle.reducer.min-count",
    0,
    "The fewest reducers when their number is automatic (when there are that many"
    " subpartitions); 0: Spark's defaultParallelism, so every core gets a reducer, and the"
    " count rounded up to whole waves of it.",
    minimum=0,
)
MAP_TARGET_SIZE = memory_option(
    "pyspark-shuffle.map.target-size",
    64 << 20,
    "Bytes a map task should write (by Spark's estimate of a DataFrame's size; under Spark"
    " Connect, as its explain prints it): a DataFrame of many small partitions is read by"
    " fewer map tasks, each reading neighbouring partitions, and never fewer than twice"
    " Spark's default parallelism (a Python task costs the JVM about as much as a few"
    " megabytes of rows); 0: one map task per partition.",
    minimum=0,
)
RANGE_SAMPLE_SIZE = int_option(
    "pyspark-shuffle.range.sample-size",
    100_000,
    "Rows of keys sampled from the input to choose range boundaries for a sort.",
    minimum=1,
)
JOIN_BROADCAST_THRESHOLD = memory_option(
    "pyspark-shuffle.join.broadcast-threshold",
    10 << 20,
    "A join side (the one Spark may broadcast for the join type) whose map stage wrote at most"
    " this many bytes is broadcast: read whole by every task of the other side, which is not"
    " shuffled (Spark's spark.sql.autoBroadcastJoinThreshold); 0: only when join() asks.",
    minimum=0,
)
KEEP_RESULTS = bool_option(
    "pyspark-shuffle.keep-results",
    True,
    "A result whose tasks run more than a read (a group-apply, a map, a join, a sort) is kept"
    " the first time a later operation reads it: its tasks write their rows once to an"
    " exchange of its own, which that operation and every later one read (so each function"
    " runs once per row). false: each reader runs its tasks again (fused), which saves that"
    " write when a result has one reader.",
)
PROGRESS_INTERVAL = float_option(
    "pyspark-shuffle.progress.interval",
    5.0,
    "Seconds between progress lines of a running map stage on the driver's stderr; 0: none.",
    minimum=0.0,
)
PROGRESS_BAR = choice_option(
    "pyspark-shuffle.progress.bar",
    "auto",
    "A one-line bar of a running map stage on the driver's stderr, redrawn in place once the"
    " stage has run half a second, as Spark's console progress draws its stages"
    " ([pyshuffle map 3: ====>   (12 + 2) / 40]). auto: where the driver's output shows on a"
    " terminal (spark-submit's too, when Spark logs no INFO lines there) or in a Jupyter/IPython"
    " kernel, unless spark.ui.showConsoleProgress is false or Spark draws its own bar there,"
    " which shows the same stages (a classic session's when that setting is true, as PySpark"
    " sets it for a session it starts itself; a Spark Connect shell's); true: always; false:"
    " never.",
    ("auto", "true", "false"),
)
MAX_RECOVERY_ATTEMPTS = int_option(
    "pyspark-shuffle.recovery.max-attempts",
    3,
    "Times the driver reruns the producers of lost partitions before it gives up.",
    minimum=0,
)
WORKER_MEMORY_POOL = choice_option(
    "pyspark-shuffle.worker.memory-pool",
    "jemalloc",
    "Arrow memory pool of a Python worker from its first pyshuffle task on: jemalloc gives"
    " what is freed back to the system within a second, where pyarrow's default (mimalloc)"
    " keeps tens of megabytes a writer freed; system (malloc), mimalloc, or default"
    " (pyarrow's, untouched). A pool this pyarrow lacks falls back to system.",
    ("jemalloc", "mimalloc", "system", "default"),
)

RERUN_IN_ACTIONS = choice_option(
    "pyspark-shuffle.rerun-in-actions",
    "auto",
    "Map outputs that live on executors are also held as a small Spark shuffle that every"
    " reducer reads, so that Spark reruns map tasks lost with an executor inside the action"
    " that reads them (classic sessions). Every reducer then fetches a block of every map"
    " task: M x R fetches, what Spark's own shuffle of the rows costs (17 s of 39 s at 1,000"
    " x 1,000 on local[2]). auto: except in local mode, whose one executor is the"
    " application; true: always; false: never (lost map outputs are rerun before the next"
    " operation that reads them, or by recover()).",
    ("auto", "true", "false"),
)
MERGE_MIN_BLOCKS = int_option(
    "pyspark-shuffle.merge.min-blocks",
    100_000,
    "Where a reduce stage would read at least this many blocks of an exchange (map tasks x"
    " reducers, every reducer reading every map task's output), small on average (see"
    " merge.max-block-size), a merge job first merges the map outputs per reducer, so that a"
    " reducer reads one block of each merge task's map outputs (docs/format.md: a"
    " merge costs about 1.5 us a block and a merged read 1.3 us, where an unmerged read"
    " costs 10 us); 0: never.",
    minimum=0,
)
MERGE_MAX_BLOCK_SIZE = memory_option(
    "pyspark-shuffle.merge.max-block-size",
    8 << 10,
    "Mean bytes of a block above which map outputs are not merged: a merge copies every byte"
    " once more (read and written, about 1 ns a byte on a local disk's page cache), which"
    " costs more than the 7 us a block it saves there where blocks are larger; on an object"
    " store, where a block saved is a request saved, raise it.",
    minimum=0,
)
MERGE_TASKS = int_option(
    "pyspark-shuffle.merge.tasks",
    0,
    "Merge tasks, each merging a run of neighbouring map outputs into one partition, so"
    " that a reducer reads this many blocks of a merged exchange (a request each on an object"
    " store); 0: Spark's default parallelism, a merge task a core.",
    minimum=0,
)
DROPIN_MIN_INPUT_SIZE = memory_option(
    "pyspark-shuffle.dropin.min-input-size",
    1 << 20,
    "Unchanged code under enable(spark): a call whose input (both sides of a"
    " cogroup) Spark estimates at fewer bytes runs through Spark, where a call costs less"
    " than pyshuffle's two stages (measured in benchmarks/dropin.py: about 0.4 s more a call"
    " on local[2], more than pyshuffle saves under ~100k rows); an input of unknown size goes"
    " through pyshuffle; 0: every call it can carry.",
    minimum=0,
)

PYSPARK_SHUFFLE_OPTIONS: Final[tuple[ConfigOption[Any], ...]] = (
    MAX_SUBPARTITIONS,
    REDUCER_TARGET_SIZE,
    REDUCER_MIN_COUNT,
    MAP_TARGET_SIZE,
    RANGE_SAMPLE_SIZE,
    JOIN_BROADCAST_THRESHOLD,
    KEEP_RESULTS,
    PROGRESS_INTERVAL,
    PROGRESS_BAR,
    MAX_RECOVERY_ATTEMPTS,
    WORKER_MEMORY_POOL,
    DROPIN_MIN_INPUT_SIZE,
    RERUN_IN_ACTIONS,
    MERGE_MIN_BLOCKS,
    MERGE_MAX_BLOCK_SIZE,
    MERGE_TASKS,
    *SCHEDULING_OPTIONS,
    *BLOB_OPTIONS,
)

PYSPARK_SHUFFLE_CATALOG = OptionCatalog(
    "PySpark, scheduling, blob", OptionRole.ENGINE, PYSPARK_SHUFFLE_OPTIONS
)

"""How pyshuffle talks to one Spark session: the one seam between the driver side and Spark.

Two sides. The classic one (a session with a SparkContext in this process, reached through
Py4J) shares values with broadcasts and counts with accumulators. The Connect one (a Spark
Connect client: ``SparkSession.builder.remote(...)``) has DataFrame operations and the
Connect API only, so values go through the blob store (every executor reaches it, as it does
for offloaded descriptor lists): a shared value is one blob that each Python worker process
loads once, a tally is a small file per addition that the driver sums.
"""

from __future__ import annotations

import abc
import copy
import getpass
import hashlib
import hmac
import logging
import os
import pickle
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pyspark.accumulators import AccumulatorParam
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F  # noqa: N812 (Spark's own spelling)

from blob import BlobStore, process_blob_cache
from pyspark_shuffle.spark.compat import CONNECT_SINCE, MISSING_SETTING_ERRORS, SPARK_VERSION
from pyspark_shuffle.spark.internals import context_running
from shuffle_api import (
    ApplicationIdentity,
    ConfigError,
    SerializationError,
    StorageError,
    new_id,
)
from shuffle_api.config import parse_memory_size
from shuffle_runtime.store import Store

if TYPE_CHECKING:
    from pyspark import Broadcast
    from pyspark.accumulators import Accumulator

__all__ = [
    "SparkLink",
    "TaskAccumulator",
    "TaskBroadcast",
    "application_identity",
    "byte_size",
    "is_connect",
    "session_flag",
    "spark_link",
    "spark_settings",
]

_LOG = logging.getLogger(__name__)

T = TypeVar("T")

_SHARED_LOADED = 8
"""Broadcast values each Python worker keeps unpickled (a few stages read at once)."""


def is_connect(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect client's session (no SparkContext here)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def session_flag(spark: SparkSession, key: str) -> bool:
    """A boolean SQL setting as Spark's own code reads it: set, or else Spark's default for it
    (a default given to ``conf.get`` would hide that: ``convertToArrowArraySafely`` is true by
    default on Spark 4.3); false where this release has no such key."""
    try:
        value = spark.conf.get(key)
    except MISSING_SETTING_ERRORS:  # a key this release lacks
        return False
    return str(value).strip().lower() == "true"


def spark_settings(spark: SparkSession) -> dict[str, str]:
    """Every Spark conf setting the session sees: the SparkContext's (classic), and over it
    the session's runtime conf (``spark.conf.set``; listed by Spark 4 and by Connect)."""
    settings: dict[str, str] = {}
    if not is_connect(spark):
        settings.update(spark.sparkContext.getConf().getAll())
    runtime_conf = getattr(spark.conf, "getAll", None)  # a property in PySpark 4
    if isinstance(runtime_conf, dict):
        settings.update(runtime_conf)
    return settings


def byte_size(text: str) -> int:
    """A Spark byte-size setting ("134217728b", "128MB", "4m", "1024") in bytes."""
    try:
        return parse_memory_size(text)
    except ValueError as error:
        raise ConfigError(f"{text!r} is not a Spark byte size (say 128m or 134217728b)") from error


class TaskBroadcast(abc.ABC, Generic[T]):
    """A value every task of a stage reads, shipped once per Python worker, not per task."""

    @property
    @abc.abstractmethod
    def value(self) -> T:
        """The value (in a task, or in the driver)."""

    @abc.abstractmethod
    def unpersist(self) -> None:
        """The executors may drop their copies; a task that still reads it loads it again."""

    @abc.abstractmethod
    def destroy(self) -> None:
        """Gone everywhere; no task may read it after."""


class TaskAccumulator(abc.ABC, Generic[T]):
    """Values that tasks add and the driver reads merged (an accumulator)."""

    @abc.abstractmethod
    def add(self, value: T) -> None:
        """In a task: add ``value``."""

    @property
    @abc.abstractmethod
    def value(self) -> T:
        """In the driver: everything added so far, merged."""


class SparkLink(abc.ABC):
    """What pyshuffle's driver side asks of one Spark session."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark

    @property
    @abc.abstractmethod
    def connect(self) -> bool:
        """Whether this is the Connect side (what is left out there is documented)."""

    @abc.abstractmethod
    def default_parallelism(self) -> int:
        """Spark's default parallelism (the cores of the executors, mostly)."""

    @abc.abstractmethod
    def share(self, value: T) -> TaskBroadcast[T]:
        """``value`` shared with tasks (pickled)."""

    @abc.abstractmethod
    def tally(self, zero: T, merge: Callable[[T, T], T]) -> TaskAccumulator[T]:
        """A tally starting at ``zero``; ``merge`` (a module-level function: it travels with
        the tasks) adds a value to a total and may change the total in place."""

    @abc.abstractmethod
    def run_partitions(
        self, frame_of: Callable[[frozenset[int] | None], DataFrame], partitions: list[int]
    ) -> list[Row]:
        """The rows of these partitions of ``frame_of(None)``; ``frame_of(only)`` is the same
        DataFrame whose tasks other than ``only`` yield nothing."""

    @abc.abstractmethod
    def running(self) -> bool:
        """False once the session stopped (its broadcasts went with it)."""

    def sql_bytes(self, key: str) -> int:
        """A byte-size SQL setting (``spark.sql.files.maxPartitionBytes``, say)."""
        return byte_size(str(self.spark.conf.get(key)))

    @abc.abstractmethod
    def close(self) -> None:
        """Remove what this link left anywhere (its blobs, on the Connect side)."""


class _MergeParam(AccumulatorParam[T]):
    """An accumulator's param from a zero and a merge function."""

    def __init__(self, zero: T, merge: Callable[[T, T], T]) -> None:
        self._zero = zero
        self._merge = merge

    def zero(self, value: T) -> T:
        return copy.deepcopy(self._zero)  # merge may change it in place

    def addInPlace(self, first: T, second: T) -> T:  # noqa: N802 (Spark's name)
        return self._merge(first, second)


class _Broadcast(TaskBroadcast[T]):
    def __init__(self, broadcast: Broadcast[T]) -> None:
        self._broadcast = broadcast

    @property
    def value(self) -> T:
        return self._broadcast.value

    def unpersist(self) -> None:
        self._broadcast.unpersist()

    def destroy(self) -> None:
        self._broadcast.destroy()


class _Accumulator(TaskAccumulator[T]):
    def __init__(self, accumulator: Accumulator[T]) -> None:
        self._accumulator = accumulator

    def add(self, value: T) -> None:
        self._accumulator.add(value)

    @property
    def value(self) -> T:
        return self._accumulator.value


class ClassicLink(SparkLink):
    """A session with its SparkContext in this process."""

    @property
    def connect(self) -> bool:
        return False

    def default_parallelism(self) -> int:
        # Asked each time: executors register after the session starts, and come and go.
        return max(1, int(self.spark.sparkContext.defaultParallelism))

    def share(self, value: T) -> TaskBroadcast[T]:
        return _Broadcast(self.spark.sparkContext.broadcast(value))

    def tally(self, zero: T, merge: Callable[[T, T], T]) -> TaskAccumulator[T]:
        param = _MergeParam(zero, merge)
        return _Accumulator(self.spark.sparkContext.accumulator(param.zero(zero), param))

    def run_partitions(
        self, frame_of: Callable[[frozenset[int] | None], DataFrame], partitions: list[int]
    ) -> list[Row]:
        context = self.spark.sparkContext
        rows: list[Row] = context.runJob(frame_of(None).rdd, list, partitions=partitions)
        return rows

    def running(self) -> bool:
        return context_running(self.spark)

    def close(self) -> None:
        """Nothing to remove: Spark drops broadcasts and accumulators."""


class _Loaded:
    """Broadcast values this Python worker unpickled, by blob key (the last few)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.values: OrderedDict[str, Any] = OrderedDict()

    def reset(self) -> None:
        # Spark forks Python workers: a child starts afresh (a parent thread may hold the
        # lock at the fork).
        self.lock = threading.Lock()
        self.values = OrderedDict()


_LOADED = _Loaded()
os.register_at_fork(after_in_child=_LOADED.reset)


class _BlobShared(TaskBroadcast[T]):
    """A pickled value in the blob store: tasks load it once per Python worker."""

    def __init__(self, url: str, key: str, cache_bytes: int) -> None:
        self._url = url
        self._key = key
        self._cache_bytes = cache_bytes

    @property
    def value(self) -> T:
        with _LOADED.lock:
            if self._key in _LOADED.values:
                _LOADED.values.move_to_end(self._key)
                loaded: T = _LOADED.values[self._key]
                return loaded
        cache = process_blob_cache(self._url, self._cache_bytes)
        value: T = pickle.loads(cache.get(self._key))[1]
        with _LOADED.lock:
            _LOADED.values[self._key] = value
            while len(_LOADED.values) > _SHARED_LOADED:
                _LOADED.values.popitem(last=False)
        return value

    def unpersist(self) -> None:
        """Kept: a released result read again must reach its tasks, which then name the
        partitions they no longer find (deleted with the link)."""

    def destroy(self) -> None:
        BlobStore(self._url).delete(self._key)


class _StoreTally(TaskAccumulator[T]):
    """Each addition a small file under ``directory``; the driver merges the files once.
    Each file is signed with the application's secret before it is unpickled: whoever else
    writes to the blob store cannot have the driver unpickle what they wrote."""

    def __init__(
        self,
        url: str,
        directory: tuple[str, str],
        zero: T,
        merge: Callable[[T, T], T],
        secret: bytes,
    ) -> None:
        self._url = url
        self._directory = directory
        self._secret = secret
        self._zero = zero
        self._merge = merge
        self._total: T | None = None
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        # What a task needs: where to add, not what the driver merged.
        return {**self.__dict__, "_total": None, "_seen": set(), "_lock": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    def add(self, value: T) -> None:
        store = Store(self._url)
        name = f"{new_id()}.pickle"
        data = pickle.dumps(value)
        signature = hmac.new(self._secret, data, hashlib.sha256).digest()
        store.put_atomic(store.path(*self._directory, name), signature + data)

    @property
    def value(self) -> T:
        store = Store(self._url)
        directory = store.path(*self._directory)
        try:
            # Listed afresh: object stores' file systems cache listings.
            names = sorted(store.filesystem.ls(directory, detail=False, refresh=True))
        except FileNotFoundError:
            names = []
        with self._lock:
            if self._total is None:
                self._total = copy.deepcopy(self._zero)
            for name in names:
                if name in self._seen or not name.endswith(".pickle"):
                    continue  # a file still being written ends in another suffix
                self._total = self._merge(self._total, self._load(store.read_bytes(name), name))
                self._seen.add(name)
            return self._total

    def _load(self, signed: bytes, name: str) -> T:
        signature, data = (
            signed[: hashlib.sha256().digest_size],
            signed[hashlib.sha256().digest_size :],
        )
        expected = hmac.new(self._secret, data, hashlib.sha256).digest()
        if not hmac.compare_digest(signature, expected):
            raise SerializationError(
                f"{name} in the blob store is not signed with this application's secret:"
                " something other than its tasks wrote it"
            )
        value: T = pickle.loads(data)
        return value


class ConnectLink(SparkLink):
    """A Spark Connect client's session: no SparkContext, no Py4J."""

    def __init__(
        self, spark: SparkSession, blob_url: str, blob_cache_bytes: int, secret: bytes
    ) -> None:
        super().__init__(spark)
        self._default_parallelism: int | None = None
        self._secret = secret
        self._blob_url = blob_url
        self._cache_bytes = blob_cache_bytes
        self._directory = f"connect-{new_id()[:16]}"
        self._blob_keys: list[str] = []

    @property
    def connect(self) -> bool:
        return True

    def default_parallelism(self) -> int:
        # Asked once (a Spark job): a range without a partition count has Spark's default
        # parallelism of partitions.
        if self._default_parallelism is None:
            tasks = self.spark.range(0, 1 << 16).select(F.spark_partition_id().alias("task"))
            [row] = tasks.agg(F.max("task")).collect()
            self._default_parallelism = max(1, int(row[0]) + 1)
        return self._default_parallelism

    def share(self, value: T) -> TaskBroadcast[T]:
        # A nonce first: equal values shared twice are two blobs, destroyed apart.
        key = BlobStore(self._blob_url).put(pickle.dumps((new_id(), value)))
        self._blob_keys.append(key)
        return _BlobShared(self._blob_url, key, self._cache_bytes)

    def tally(self, zero: T, merge: Callable[[T, T], T]) -> TaskAccumulator[T]:
        directory = (self._directory, new_id()[:16])
        return _StoreTally(self._blob_url, directory, zero, merge, self._secret)

    def run_partitions(
        self, frame_of: Callable[[frozenset[int] | None], DataFrame], partitions: list[int]
    ) -> list[Row]:
        rows: list[Row] = frame_of(frozenset(partitions)).collect()
        return rows

    def running(self) -> bool:
        return not bool(getattr(self.spark, "is_stopped", False))

    def close(self) -> None:
        store = BlobStore(self._blob_url)
        for key in self._blob_keys:
            store.delete(key)
        self._blob_keys.clear()
        tallies = Store(self._blob_url)
        try:
            tallies.delete_tree(tallies.path(self._directory))
        except StorageError as error:
            _LOG.warning("tallies of a Connect session left in %s: %s", self._blob_url, error)


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a container's uid with no passwd entry
        return ""


def application_identity(spark: SparkSession) -> ApplicationIdentity:
    """Spark's id, name and user of the application ``spark`` belongs to, for a shared
    service's operators (a Connect client's user is its own OS user, as Connect's default)."""
    if is_connect(spark):
        return ApplicationIdentity(
            spark.conf.get("spark.app.id", "") or "",
            spark.conf.get("spark.app.name", "") or "",
            _os_user(),
        )
    context = spark.sparkContext
    return ApplicationIdentity(context.applicationId, context.appName or "", context.sparkUser())


def spark_link(
    spark: SparkSession, *, blob_url: str, blob_cache_bytes: int, secret: bytes
) -> SparkLink:
    """The link for ``spark``: Connect's for a Connect client's session, else classic
    (``secret``: the application's, which signs what tasks leave in the blob store)."""
    if is_connect(spark):
        if SPARK_VERSION < CONNECT_SINCE:
            since, this = (".".join(map(str, each)) for each in (CONNECT_SINCE, SPARK_VERSION))
            raise ConfigError(
                f"pyshuffle runs on Spark Connect from PySpark {since}; this is PySpark {this}:"
                " use a classic session"
            )
        return ConnectLink(spark, blob_url, blob_cache_bytes, secret)
    return ClassicLink(spark)

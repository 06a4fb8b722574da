"""The drop-in switch: after ``enable(spark)``, the session's unchanged grouped and cogrouped
map calls (``groupBy(...).applyInPandas``, ``.applyInArrow``, and both on ``cogroup``) and
grouped-aggregate pandas UDFs (``groupBy(...).agg(udf(column), ...)``) run through
:class:`~pyspark_shuffle.SparkShuffle`'s public operations.

Each call is first made as Spark makes it: PySpark's own method checks the function and the
schema, so a call Spark refuses fails with Spark's error, at the same point, and its result
gives the schema Spark would produce. Then the switch decides: a call it can carry runs through
pyshuffle; any other (a rollup, an ordinal key, an iterator form, a setting pyshuffle does not
mirror, a type it refuses) returns Spark's own result untouched. Every decision is logged at
INFO and kept in :attr:`DropIn.calls`.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

from pyspark.sql import Column, DataFrame, SparkSession

from pyspark_shuffle.driver.session import SparkShuffle
from pyspark_shuffle.options import DROPIN_MIN_INPUT_SIZE
from pyspark_shuffle.spark.grouped_api import (
    ALIASES,
    GROUP_BY,
    GROUPED_AGG_ARROW,
    GROUPED_AGG_PANDAS,
    GROUPED_MAP,
    Grouping,
    MethodPatches,
    cogrouped,
    grouping_of,
    iterator_form,
    keep_udf_call,
    key_names,
    note_grouping,
    note_udf_call,
    session_of,
    udf_call_of,
    wrapped_classes,
)
from pyspark_shuffle.spark.internals import arrow_aggregates_supported, estimated_bytes
from pyspark_shuffle.spark.link import is_connect, session_flag
from pyspark_shuffle.tasks.arrow_functions import ArrowCogroupFunction, ArrowGroupFunction
from pyspark_shuffle.tasks.group_aggregates import GroupAggregate, GroupAggregation
from pyspark_shuffle.tasks.pandas_functions import PandasFunction, PandasSettings
from shuffle_api import ConfigError, InvalidOperationError, ShuffleError

__all__ = ["DropIn", "DropInCall", "disable", "enable"]

_LOG = logging.getLogger(__name__)

PYSHUFFLE: Final = "pyshuffle"
SPARK: Final = "spark"

_KEPT_CALLS: Final = 10_000
"""Decisions a switch keeps (the newest): a long-lived session makes calls without end."""

# Settings under which Spark's Python workers do what pyshuffle's tasks do not (log to a
# table, profile, hand over large string types, convert as before 4.0): such calls stay
# Spark's. Each is off by default.
_SPARK_ONLY_SETTINGS: Final = (
    "spark.sql.execution.arrow.useLargeVarTypes",
    "spark.sql.pyspark.worker.logging.enabled",
    "spark.python.profile",
    "spark.python.profile.memory",
    "spark.sql.legacy.execution.pythonUDF.pandas.conversion.enabled",
)
_PROFILER: Final = "spark.sql.pyspark.udf.profiler"


@dataclass(frozen=True, slots=True)
class DropInCall:
    """One call the switch saw: the API (``applyInPandas``, ``cogroup.applyInArrow``...),
    the path it took (``"pyshuffle"`` or ``"spark"``) and why."""

    api: str
    path: str
    reason: str


class _NotCarriedError(Exception):
    """Why a call is left to Spark."""


class DropIn:
    """The switch of one session. Made by :func:`enable`; a context manager whose exit is
    :func:`disable`. Results it made stay readable after ``disable``; their shuffle data is
    released with them, by :meth:`close`, or at the interpreter's exit."""

    def __init__(
        self, spark: SparkSession, shuffle: SparkShuffle, made_with: tuple[object, ...]
    ) -> None:
        self.spark = spark
        self.made_with = made_with
        """The configuration :func:`enable` was given."""
        self.shuffle = shuffle
        """The :class:`SparkShuffle` the routed calls run through (its ``statistics`` of a
        routed call's result, say)."""
        self.routing = True
        self._calls: collections.deque[DropInCall] = collections.deque(maxlen=_KEPT_CALLS)
        self._lock = threading.Lock()

    @property
    def calls(self) -> tuple[DropInCall, ...]:
        """The decisions made, oldest first (the newest ten thousand)."""
        with self._lock:
            return tuple(self._calls)

    # -- decisions ------------------------------------------------------------------------

    def group_map(
        self, grouped: Any, function: Callable[..., Any], api: str, spark_result: DataFrame
    ) -> DataFrame:
        """``grouped.<api>(function, schema)``: through pyshuffle where it can carry it, else
        ``spark_result`` (Spark's own, made already)."""
        arrow = api.endswith("Arrow")
        try:
            grouping, resolved = self._keys(grouped)
            self._check_function(function, arrow=arrow)
            self._check_size(grouping.frame)
            frame, keys, key_only = _keyed(grouping.frame, resolved)
            schema = spark_result.schema
            settings = PandasSettings.of(self.spark)
            carried = (
                ArrowGroupFunction.of(function, keys, schema, settings, key_only)
                if arrow
                else PandasFunction(function, key_only)
            )
            result = self._through_pyshuffle(
                lambda: self.shuffle.group_apply(frame, keys, carried, schema)
            )
        except _NotCarriedError as refusal:
            return self._left_to_spark(api, str(refusal), spark_result)
        self._record(DropInCall(api, PYSHUFFLE, f"grouped by {_described(resolved)}"))
        return result

    def cogroup_map(
        self, operations: Any, function: Callable[..., Any], api: str, spark_result: DataFrame
    ) -> DataFrame:
        """``operations.<api>(function, schema)`` of a ``cogroup``: as :meth:`group_map`."""
        arrow = api.endswith("Arrow")
        left, right = cogrouped(operations)
        try:
            (left_grouping, left_resolved), (right_grouping, right_resolved) = (
                self._keys(left),
                self._keys(right),
            )
            if len(left_resolved) != len(right_resolved):
                raise _NotCarriedError("the sides are grouped by different numbers of keys")
            self._check_size(left_grouping.frame, right_grouping.frame)
            left_keyed, right_keyed = _paired(
                left_grouping.frame, left_resolved, right_grouping.frame, right_resolved
            )
            left_frame, keys, key_only = _keyed(left_grouping.frame, left_keyed)
            right_frame, _, _ = _keyed(right_grouping.frame, right_keyed)
            schema = spark_result.schema
            settings = PandasSettings.of(self.spark)
            carried = (
                ArrowCogroupFunction.of(function, keys, schema, settings, key_only)
                if arrow
                else PandasFunction(function, key_only)
            )
            result = self._through_pyshuffle(
                lambda: self.shuffle.cogroup_apply(left_frame, right_frame, keys, carried, schema)
            )
        except _NotCarriedError as refusal:
            return self._left_to_spark(api, str(refusal), spark_result)
        self._record(DropInCall(api, PYSHUFFLE, f"cogrouped by {_described(left_resolved)}"))
        return result

    def aggregate(
        self, grouped: Any, columns: tuple[Any, ...], spark_result: DataFrame
    ) -> DataFrame:
        """``grouped.agg(*columns)``: through pyshuffle where every column is a call of a
        grouped-aggregate UDF on columns of the frame (aliased or not; all pandas, or all
        Arrow where the release runs them as 4.3 does), else ``spark_result`` (silently where
        no column calls a UDF: not a call for this switch)."""
        if not any(udf_call_of(column) for column in columns if not isinstance(column, dict)):
            return spark_result
        try:
            grouping, resolved = self._keys(grouped)
            keys = tuple(key for key in resolved if isinstance(key, str))
            if len(keys) < len(resolved):
                raise _NotCarriedError("a key is an expression, not a column of the frame")
            arrow, aggregates = self._aggregates(grouping.frame, columns)
            schema = spark_result.schema
            settings = PandasSettings.of(self.spark)
            aggregation = GroupAggregation(keys, aggregates, schema, settings, arrow=arrow)
            # Only the columns the UDFs read are shuffled, as Spark sends only those to Python.
            read = [*keys, *(name for each in aggregates for name in each.arguments)]
            needed = list(dict.fromkeys(read))
            frame = grouping.frame
            if len(needed) < len(frame.columns):
                frame = frame.select(*needed)
            self._check_size(frame)
            result = self._through_pyshuffle(
                lambda: self.shuffle.group_apply_sorted(frame, keys, aggregation, schema)
            )
        except _NotCarriedError as refusal:
            return self._left_to_spark("agg", str(refusal), spark_result)
        self._record(DropInCall("agg", PYSHUFFLE, f"grouped by {', '.join(keys)}"))
        return result

    def _aggregates(
        self, frame: DataFrame, columns: tuple[Any, ...]
    ) -> tuple[bool, tuple[GroupAggregate, ...]]:
        """Whether the aggregates are Arrow UDFs (else pandas ones), and each of them."""
        calls = [None if isinstance(column, dict) else udf_call_of(column) for column in columns]
        kinds = {None if call is None else call.eval_type for call in calls}
        if not kinds <= {GROUPED_AGG_PANDAS, GROUPED_AGG_ARROW}:
            raise _NotCarriedError(
                "an aggregate is not a grouped-aggregate pandas or Arrow UDF (a built-in one,"
                " an expression of one, an iterator UDF)"
            )
        if len(kinds) > 1:
            raise _NotCarriedError("pandas and Arrow aggregate UDFs in one agg")
        arrow = kinds == {GROUPED_AGG_ARROW}
        if arrow and not arrow_aggregates_supported():
            raise _NotCarriedError("Arrow aggregate UDFs before Spark 4.3")
        aggregates = []
        case_sensitive = session_flag(self.spark, "spark.sql.caseSensitive")
        for call in calls:
            assert call is not None  # every kind is a UDF's
            if call.keywords:
                raise _NotCarriedError("an aggregate UDF is called with keyword arguments")
            names = key_names(frame, call.arguments, case_sensitive=case_sensitive)
            if not names:
                raise _NotCarriedError(
                    "an aggregate UDF's argument is not a column of the frame (an expression,"
                    " a literal, or none)"
                )
            aggregates.append(GroupAggregate(call.function, names))
        return arrow, tuple(aggregates)

    def _keys(self, grouped: Any) -> tuple[Grouping, tuple[str | Column, ...]]:
        """The plain grouping behind ``grouped`` and each key: the name of a column of the
        frame, or a Column of the frame that computes it (an expression, a nested field)."""
        grouping = grouping_of(grouped)
        if grouping is None:
            raise _NotCarriedError(
                "not a plain groupBy (a rollup, cube, pivot or grouping set, or a classic"
                " groupBy made before pyshuffle was enabled)"
            )
        if not grouping.keys:
            raise _NotCarriedError("groupBy() without keys: the whole frame is one group")
        frame = grouping.frame
        if frame.isStreaming:
            raise _NotCarriedError("a streaming DataFrame")
        if len(set(frame.columns)) != len(frame.columns):
            raise _NotCarriedError("the frame has duplicate column names")
        self._check_settings()
        case_sensitive = session_flag(self.spark, "spark.sql.caseSensitive")
        return grouping, tuple(_resolved(frame, key, case_sensitive) for key in grouping.keys)

    def _check_settings(self) -> None:
        for key in _SPARK_ONLY_SETTINGS:
            if session_flag(self.spark, key):
                raise _NotCarriedError(f"{key} is true")
        if self.spark.conf.get(_PROFILER, None):
            raise _NotCarriedError(f"{_PROFILER} is set")

    def _check_size(self, *frames: DataFrame) -> None:
        """Refuses a call whose input Spark estimates under the smallest that pays."""
        smallest = self.shuffle.configuration.get(DROPIN_MIN_INPUT_SIZE)
        if smallest == 0:
            return
        sizes = [estimated_bytes(frame) for frame in frames]
        known = [size for size in sizes if size is not None]
        if len(known) == len(sizes) and sum(known) < smallest:
            raise _NotCarriedError(
                f"a small input: Spark estimates {sum(known):,} bytes, under"
                f" {DROPIN_MIN_INPUT_SIZE.key} ({smallest:,})"
            )

    @staticmethod
    def _check_function(function: Callable[..., Any], *, arrow: bool) -> None:
        if iterator_form(function, arrow=arrow):
            raise _NotCarriedError("the function's type hints choose Spark's iterator form")

    @staticmethod
    def _through_pyshuffle(operation: Callable[[], DataFrame]) -> DataFrame:
        try:
            return operation()
        except InvalidOperationError as refusal:  # a type or shape pyshuffle does not carry
            raise _NotCarriedError(f"pyshuffle refused it: {refusal}") from refusal
        except ShuffleError as error:  # the service failed: the call still gets an answer
            _LOG.warning("pyshuffle failed to start a call, left to Spark: %s", error)
            raise _NotCarriedError(f"pyshuffle failed: {error}") from error

    def _left_to_spark(self, api: str, reason: str, spark_result: DataFrame) -> DataFrame:
        self._record(DropInCall(api, SPARK, reason))
        return spark_result

    def _record(self, call: DropInCall) -> None:
        _LOG.info("%s through %s: %s", call.api, call.path, call.reason)
        with self._lock:
            self._calls.append(call)

    # -- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Disable the switch and release every shuffle it made (results it made can no
        longer be read); a later :func:`enable` makes a new one."""
        with _LOCK:
            if _SWITCHES.get(id(self.spark)) is self:
                del _SWITCHES[id(self.spark)]
            _remove_patches_if_unused()
        self.routing = False
        self.shuffle.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        disable(self.spark)


_KEY_COLUMN: Final = "__pyshuffle_key_{}"
"""The name of the column that carries the values of a key expression (by its position)."""


def _resolved(frame: DataFrame, key: Any, case_sensitive: bool) -> str | Column:
    """``key`` of ``frame.groupBy``: a column's name, or the Column that computes it."""
    names = key_names(frame, [key], case_sensitive=case_sensitive)
    if names:
        return names[0]
    if isinstance(key, str):  # a nested field, a quoted name
        return frame[key]
    if isinstance(key, Column) or type(key).__name__ == "Column":
        column: Column = key  # classic or Connect's
        return column
    raise _NotCarriedError(f"a key is not a column or an expression of the frame ({key!r})")


def _paired(
    left: DataFrame,
    left_keys: tuple[str | Column, ...],
    right: DataFrame,
    right_keys: tuple[str | Column, ...],
) -> tuple[tuple[str | Column, ...], tuple[str | Column, ...]]:
    """The two sides' keys to cogroup by position, as Spark does: a name where both sides
    name the same column, else each side's Column (carried under one name on both)."""
    pairs = [
        (ours, theirs)
        if isinstance(ours, str) and ours == theirs
        else (
            left[ours] if isinstance(ours, str) else ours,
            right[theirs] if isinstance(theirs, str) else theirs,
        )
        for ours, theirs in zip(left_keys, right_keys, strict=True)
    ]
    return tuple(ours for ours, _ in pairs), tuple(theirs for _, theirs in pairs)


def _keyed(
    frame: DataFrame, keys: tuple[str | Column, ...]
) -> tuple[DataFrame, tuple[str, ...], tuple[str, ...]]:
    """``frame`` with a column for each key expression, the key columns' names, and those
    of the added ones (which only carry a key: the function never sees them)."""
    names = [
        key if isinstance(key, str) else _KEY_COLUMN.format(index) for index, key in enumerate(keys)
    ]
    key_only = tuple(
        name for name, key in zip(names, keys, strict=True) if not isinstance(key, str)
    )
    if not key_only:
        return frame, tuple(names), ()
    if set(key_only) & set(frame.columns):
        raise _NotCarriedError("the frame has a column named as pyshuffle's key columns")
    try:
        for name, key in zip(names, keys, strict=True):
            if not isinstance(key, str):
                frame = frame.withColumn(name, key)
        _ = frame.schema  # analysed now: a key Spark cannot resolve is Spark's to report
    except Exception as error:
        raise _NotCarriedError(f"a key expression pyshuffle cannot add: {error}") from error
    return frame, tuple(names), key_only


def _described(keys: tuple[str | Column, ...]) -> str:
    return ", ".join(key if isinstance(key, str) else str(key) for key in keys)


# Switches by session: one per session, kept after disable (its results stay readable and a
# second enable reuses its service), dropped when its session has stopped.
_SWITCHES: dict[int, DropIn] = {}
_PATCHES = MethodPatches()
_LOCK = threading.Lock()


def enable(
    spark: SparkSession,
    config: Mapping[str, object] | None = None,
    *,
    config_file: str | Path | None = None,
) -> DropIn:
    """Run ``spark``'s grouped and cogrouped map calls through pyshuffle from now on (the
    service configured as for ``SparkShuffle(spark, config, config_file=...)``). Enabling an
    enabled session returns its switch; with another configuration, :class:`ConfigError`."""
    made_with = (dict(config or {}), None if config_file is None else str(config_file))
    with _LOCK:
        _drop_stopped()
        switch = _SWITCHES.get(id(spark))
        if switch is None:
            shuffle = SparkShuffle(spark, config, config_file=config_file)
            switch = DropIn(spark, shuffle, made_with)
            _SWITCHES[id(spark)] = switch
        elif made_with != switch.made_with and (config or config_file):
            raise ConfigError(
                "pyshuffle is already enabled on this session with another configuration:"
                " close() its switch first (which releases what it made)"
            )
        switch.routing = True
        _install(connect=is_connect(spark))
    _LOG.info("pyshuffle enabled for grouped and cogrouped map calls")
    return switch


def disable(spark: SparkSession) -> None:
    """Leave ``spark``'s calls to Spark from now on (what was routed stays readable)."""
    with _LOCK:
        switch = _SWITCHES.get(id(spark))
        if switch is not None:
            switch.routing = False
        _remove_patches_if_unused()


def _remove_patches_if_unused() -> None:
    if not any(each.routing for each in _SWITCHES.values()):
        _PATCHES.remove_all()


def _drop_stopped() -> None:
    for key, switch in list(_SWITCHES.items()):
        if not switch.shuffle.session_running():
            switch.shuffle.close()
            del _SWITCHES[key]


def _routing(session: SparkSession) -> DropIn | None:
    switch = _SWITCHES.get(id(session))
    if switch is None or switch.spark is not session or not switch.routing:
        return None
    return switch


def _install(*, connect: bool) -> None:
    classes = wrapped_classes(connect)
    if classes.frame is not None:
        for name in GROUP_BY:
            _PATCHES.install(classes.frame, name, _noting_group_by)
    _PATCHES.install(classes.udf, "__call__", _noting_udf_call)
    for name in ALIASES:
        _PATCHES.install(classes.column, name, _keeping_udf_call)
    _PATCHES.install(classes.grouped, "agg", _routed_aggregate)
    for name in GROUPED_MAP:
        _PATCHES.install(classes.grouped, name, functools.partial(_routed_group_map, api=name))
        _PATCHES.install(
            classes.cogrouped, name, functools.partial(_routed_cogroup_map, api=f"cogroup.{name}")
        )


def _noting_group_by(original: Callable[..., Any]) -> Callable[..., Any]:
    def group_by(frame: DataFrame, *columns: Any) -> Any:
        grouped = original(frame, *columns)
        note_grouping(grouped, frame, columns)
        return grouped

    return group_by


def _noting_udf_call(original: Callable[..., Any]) -> Callable[..., Any]:
    def call(udf: Any, *arguments: Any, **keywords: Any) -> Any:
        column = original(udf, *arguments, **keywords)
        note_udf_call(column, udf, arguments, bool(keywords))
        return column

    return call


def _keeping_udf_call(original: Callable[..., Any]) -> Callable[..., Any]:
    def renamed(column: Any, *names: Any, **keywords: Any) -> Any:
        alias = original(column, *names, **keywords)
        keep_udf_call(alias, column)
        return alias

    return renamed


def _routed_aggregate(original: Callable[..., DataFrame]) -> Callable[..., DataFrame]:
    def agg(grouped: Any, *columns: Any) -> DataFrame:
        spark_result = original(grouped, *columns)
        switch = _routing(session_of(grouped))
        if switch is None:
            return spark_result
        return switch.aggregate(grouped, columns, spark_result)

    return agg


def _routed_group_map(original: Callable[..., DataFrame], *, api: str) -> Callable[..., DataFrame]:
    def apply(grouped: Any, func: Callable[..., Any], schema: Any) -> DataFrame:
        spark_result = original(grouped, func, schema)
        switch = _routing(session_of(grouped))
        if switch is None:
            return spark_result
        return switch.group_map(grouped, func, api, spark_result)

    return apply


def _routed_cogroup_map(
    original: Callable[..., DataFrame], *, api: str
) -> Callable[..., DataFrame]:
    def apply(operations: Any, func: Callable[..., Any], schema: Any) -> DataFrame:
        spark_result = original(operations, func, schema)
        switch = _routing(session_of(cogrouped(operations)[0]))
        if switch is None:
            return spark_result
        return switch.cogroup_map(operations, func, api, spark_result)

    return apply

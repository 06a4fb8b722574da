"""PySpark's grouped-map API as the drop-in switch sees it: the classes whose methods it wraps
(classic and Connect), what a ``GroupedData`` groups by, and which form of a function Spark
will call.

Tested on PySpark 4.3.0 and 3.5 (classic; Connect from 4.0):

- Classic ``GroupedData`` keeps its keys in the JVM only, so :data:`GROUP_BY` of the classic
  DataFrame (``pyspark.sql.classic.dataframe`` from 4.0, ``pyspark.sql.dataframe`` in 3.5) is
  wrapped too, to note on the object it returns what it was called with. ``rollup``, ``cube``,
  ``pivot`` and grouping sets return objects without the note.
- Connect's ``GroupedData`` keeps them in ``_grouping_cols``, its kind in ``_group_type``.
- Both ``PandasCogroupedOps`` keep their two ``GroupedData`` in ``_gd1`` and ``_gd2``.
- A Column that names a column reads ``Column<'name'>`` (both sides, 3.5 to 4.3); any
  expression reads otherwise.
- The iterator forms (4.1+) are told by type hints, by PySpark's own
  ``infer_group_*_eval_type_from_func``.
- A call of a pandas UDF is a Column that keeps nothing of the UDF on the Python side in
  classic sessions, so ``UserDefinedFunction.__call__`` (``pyspark.sql.udf`` and
  ``pyspark.sql.connect.udf``: ``func``, ``returnType``, ``evalType``, 3.5 to 4.3) is wrapped to
  note the call on the Column it returns, and ``Column.alias`` (and ``name``) to keep the note.
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql.types import DataType

from pyspark_shuffle.spark.compat import SPARK_VERSION

__all__ = [
    "ALIASES",
    "GROUPED_AGG_ARROW",
    "GROUPED_AGG_PANDAS",
    "GROUPED_MAP",
    "GROUP_BY",
    "Grouping",
    "MethodPatches",
    "UdfCall",
    "cogrouped",
    "column_name",
    "grouping_of",
    "iterator_form",
    "keep_udf_call",
    "key_names",
    "note_grouping",
    "note_udf_call",
    "session_of",
    "udf_call_of",
    "wrapped_classes",
]

GROUP_BY: Final = ("groupBy", "groupby")
"""The classic DataFrame's methods that make a plain grouping (``groupby`` is an alias)."""

GROUPED_MAP: Final = ("applyInPandas", "applyInArrow")
"""The methods wrapped on ``GroupedData`` and on ``PandasCogroupedOps`` (where this PySpark
has them: ``applyInArrow`` from 4.0)."""

ALIASES: Final = ("alias", "name")
"""Column methods that rename: the note of a UDF call is kept through them."""

GROUPED_AGG_PANDAS: Final = 202
"""``PythonEvalType.SQL_GROUPED_AGG_PANDAS_UDF`` (3.5 to 4.3)."""
GROUPED_AGG_ARROW: Final = 252
"""``PythonEvalType.SQL_GROUPED_AGG_ARROW_UDF`` (4.1 to 4.3)."""

# Set on a classic GroupedData by the wrapped groupBy: the columns it was called with.
_NOTE: Final = "_pyshuffle_grouping"
# Set on the Column a UDF call returns: the call.
_UDF_NOTE: Final = "_pyshuffle_udf_call"

_NAMED: Final = re.compile(r"Column<'(?P<name>[^'`.()\s]+|`[^`]+`)'>")


@dataclass(frozen=True, slots=True)
class Grouping:
    """What a plain ``groupBy`` groups: the DataFrame, and the keys as given (names, Columns,
    ordinals)."""

    frame: DataFrame
    keys: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class UdfCall:
    """A UDF called on columns: its function, declared return type and eval type (a
    ``PythonEvalType``), the positional arguments as given, and whether keyword arguments
    were given too (their order is then the function's to decide)."""

    function: Callable[..., Any]
    return_type: DataType
    eval_type: int
    arguments: tuple[Any, ...]
    keywords: bool


@dataclass(frozen=True, slots=True)
class WrappedClasses:
    """The classes of one kind of session whose methods the switch wraps."""

    frame: type | None
    """Whose ``groupBy`` is wrapped to note its keys (classic only)."""
    grouped: type
    cogrouped: type
    udf: type
    column: type


def _class(module: str, name: str) -> type:
    found: type = getattr(importlib.import_module(module), name)
    return found


@functools.cache
def wrapped_classes(connect: bool) -> WrappedClasses:
    """The classes of a Connect or a classic session on this PySpark. Connect's are imported
    only here: a classic session never loads them (nor gRPC)."""
    if connect:
        return WrappedClasses(
            frame=None,
            grouped=_class("pyspark.sql.connect.group", "GroupedData"),
            cogrouped=_class("pyspark.sql.connect.group", "PandasCogroupedOps"),
            udf=_class("pyspark.sql.connect.udf", "UserDefinedFunction"),
            column=_class("pyspark.sql.connect.column", "Column"),
        )
    frame_module = (
        "pyspark.sql.classic.dataframe" if SPARK_VERSION >= (4, 0) else "pyspark.sql.dataframe"
    )
    column_module = (
        "pyspark.sql.classic.column" if SPARK_VERSION >= (4, 0) else "pyspark.sql.column"
    )
    return WrappedClasses(
        frame=_class(frame_module, "DataFrame"),
        grouped=_class("pyspark.sql.group", "GroupedData"),
        cogrouped=_class("pyspark.sql.pandas.group_ops", "PandasCogroupedOps"),
        udf=_class("pyspark.sql.udf", "UserDefinedFunction"),
        column=_class(column_module, "Column"),
    )


class MethodPatches:
    """Wrappers put on classes' methods, and the originals to put back. Not thread-safe: the
    switch installs and removes under its own lock."""

    def __init__(self) -> None:
        # (owner, name) -> the original, and whether owner itself defined it (else inherited)
        self._originals: dict[tuple[type, str], tuple[Any, bool]] = {}

    def install(
        self, owner: type, name: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]
    ) -> None:
        """``owner.name`` replaced by ``wrap(original)``, once (a method this PySpark lacks is
        left alone)."""
        if (owner, name) in self._originals or not hasattr(owner, name):
            return
        own = name in owner.__dict__
        original = getattr(owner, name)
        self._originals[owner, name] = (original, own)
        setattr(owner, name, functools.wraps(original)(wrap(original)))

    def remove_all(self) -> None:
        """Every wrapped method as it was (an inherited one inherited again)."""
        for (owner, name), (original, own) in self._originals.items():
            if own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)
        self._originals.clear()

    def __bool__(self) -> bool:
        return bool(self._originals)


def note_grouping(grouped: Any, frame: DataFrame, columns: Sequence[Any]) -> None:
    """Note on a classic ``GroupedData`` that ``frame.groupBy(*columns)`` made it."""
    setattr(grouped, _NOTE, Grouping(frame, _flattened(columns)))


def _flattened(columns: Sequence[Any]) -> tuple[Any, ...]:
    # groupBy(["a", "b"]) is groupBy("a", "b").
    if len(columns) == 1 and isinstance(columns[0], list | tuple):
        return tuple(columns[0])
    return tuple(columns)


def grouping_of(grouped: Any) -> Grouping | None:
    """The plain ``groupBy`` behind ``grouped``, or None (a rollup, cube, pivot or grouping
    set; a classic one made before the switch was on)."""
    noted: Grouping | None = _note(grouped, _NOTE)
    if noted is not None:
        return noted
    if getattr(grouped, "_group_type", None) == "groupby":  # Connect's
        return Grouping(grouped._df, tuple(grouped._grouping_cols))
    return None


def cogrouped(operations: Any) -> tuple[Any, Any]:
    """The two ``GroupedData`` of a ``PandasCogroupedOps``."""
    return operations._gd1, operations._gd2


def session_of(grouped: Any) -> SparkSession:
    session: SparkSession = grouped._df.sparkSession
    return session


def note_udf_call(column: Any, udf: Any, arguments: Sequence[Any], keywords: bool) -> None:
    """Note on ``column`` that it is ``udf(*arguments)``, with keyword arguments or not."""
    call = UdfCall(udf.func, udf.returnType, int(udf.evalType), tuple(arguments), keywords)
    setattr(column, _UDF_NOTE, call)


def _note(owner: Any, name: str) -> Any:
    # From the object's own attributes: a classic Column answers any other name with a
    # Column (a field access), never "missing".
    return getattr(owner, "__dict__", {}).get(name)


def keep_udf_call(renamed: Any, column: Any) -> None:
    """Carry the note of ``column`` over to ``renamed`` (an alias of it)."""
    call = _note(column, _UDF_NOTE)
    if call is not None:
        setattr(renamed, _UDF_NOTE, call)


def udf_call_of(column: Any) -> UdfCall | None:
    """The UDF call ``column`` is (aliased or not), or None."""
    call: UdfCall | None = _note(column, _UDF_NOTE)
    return call


def column_name(key: Any) -> str | None:
    """The name a key gives, or None for what is not a plain name (an expression, an
    ordinal, a nested field)."""
    if isinstance(key, str):
        return None if "." in key or "`" in key else key
    if isinstance(key, Column) or type(key).__name__ == "Column":
        match = _NAMED.fullmatch(str(key))
        return match["name"].strip("`") if match else None
    return None


def key_names(
    frame: DataFrame, keys: Sequence[Any], *, case_sensitive: bool
) -> tuple[str, ...] | None:
    """The frame's columns that ``keys`` name, as Spark resolves them (by case too, unless
    ``spark.sql.caseSensitive``), or None where a key is not one column of the frame."""
    columns = frame.columns
    names = []
    for key in keys:
        name = column_name(key)
        if name is None:
            return None
        if name in columns:
            names.append(name)
            continue
        if case_sensitive:
            return None
        alike = [column for column in columns if column.lower() == name.lower()]
        if len(alike) != 1:
            return None
        names.append(alike[0])
    return tuple(names)


def iterator_form(function: Callable[..., Any], *, arrow: bool) -> bool:
    """Whether Spark calls ``function`` in its iterator form (told by type hints, 4.1+). Where
    the hints cannot be read, Spark warns and takes the plain form, as this does."""
    if SPARK_VERSION < (4, 1):
        return False
    typehints = importlib.import_module("pyspark.sql.pandas.typehints")
    name = (
        "infer_group_arrow_eval_type_from_func"
        if arrow
        else "infer_group_pandas_eval_type_from_func"
    )
    infer = getattr(typehints, name, None)
    if infer is None:  # a release that names it otherwise: hinted functions are not carried
        return bool(getattr(function, "__annotations__", None))
    try:
        eval_type = infer(function)
    except Exception:  # Spark's own rule: unreadable hints mean the plain form
        return False
    plain = 209 if arrow else 201  # SQL_GROUPED_MAP_ARROW_UDF, SQL_GROUPED_MAP_PANDAS_UDF
    return eval_type is not None and eval_type != plain

"""What differs between the Spark releases pyshuffle supports, in one place: each entry names
the releases it is tested on (``make spark-versions``: 3.5 and 4.0 beside the pinned newest)
and what it falls back to.

- Spark Connect sessions: from 4.0 (:data:`CONNECT_SINCE`); refused before, naming the
  release.
- A SQL setting this release lacks: ``conf.get`` raises a ``PySparkException`` from 4.0, a
  bare ``Py4JJavaError`` on classic 3.5 (:data:`MISSING_SETTING_ERRORS`).
- ``DataFrame.toArrow``: Spark 4's; on 3.5 its private ``_collect_as_arrow``
  (:func:`collected_arrow`).
- ``to_arrow_schema``: PySpark 4 takes the session's time zone and large-types setting;
  PySpark 3.5 takes the schema alone and gives timestamps in UTC (tested: 3.5.9, 4.0, 4.3).
"""

from __future__ import annotations

import inspect
from typing import Final

import pyarrow as pa
import pyspark
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

__all__ = [
    "CONNECT_SINCE",
    "MISSING_SETTING_ERRORS",
    "SPARK_VERSION",
    "collected_arrow",
    "spark_arrow_schema",
]

SPARK_VERSION: Final = tuple(int(part) for part in pyspark.__version__.split(".")[:2])
"""The installed PySpark's (major, minor)."""

CONNECT_SINCE: Final = (4, 0)
"""pyshuffle under Spark Connect: tested from 4.0 (3.5's client wants NumPy 1, see
pyproject.toml's ``connect`` extra)."""

MISSING_SETTING_ERRORS: tuple[type[Exception], ...]
"""What ``spark.conf.get`` raises for a key the running release does not know."""
try:
    from py4j.protocol import Py4JJavaError
except ImportError:  # pyspark-client (Connect only) ships without Py4J
    MISSING_SETTING_ERRORS = (PySparkException,)
else:
    MISSING_SETTING_ERRORS = (PySparkException, Py4JJavaError)

_TAKES_TIMEZONE: Final = "timezone" in inspect.signature(to_arrow_schema).parameters


def _in_timezone(data_type: pa.DataType, timezone: str) -> pa.DataType:
    """``data_type`` with every zoned timestamp in it (nested too) in ``timezone``."""
    if pa.types.is_timestamp(data_type) and data_type.tz is not None:
        return pa.timestamp(data_type.unit, tz=timezone)
    if pa.types.is_struct(data_type):
        return pa.struct(
            [field.with_type(_in_timezone(field.type, timezone)) for field in data_type]
        )
    if pa.types.is_map(data_type):
        return pa.map_(
            _in_timezone(data_type.key_type, timezone), _in_timezone(data_type.item_type, timezone)
        )
    if pa.types.is_list(data_type):
        return pa.list_(
            data_type.value_field.with_type(_in_timezone(data_type.value_type, timezone))
        )
    return data_type


def spark_arrow_schema(
    schema: StructType, *, timezone: str, prefers_large_types: bool
) -> pa.Schema:
    """The Arrow schema PySpark makes of ``schema`` (``prefers_large_types``: PySpark 4 only,
    whose ``spark.sql.execution.arrow.useLargeVarTypes`` 3.5 lacks)."""
    if _TAKES_TIMEZONE:
        arrow: pa.Schema = to_arrow_schema(
            schema, timezone=timezone, prefers_large_types=prefers_large_types
        )
        return arrow
    plain: pa.Schema = to_arrow_schema(schema)
    return pa.schema(
        [field.with_type(_in_timezone(field.type, timezone)) for field in plain],
        metadata=plain.metadata,
    )


def collected_arrow(frame: DataFrame) -> pa.Table:
    """``frame`` collected by Spark as an Arrow table, in its order."""
    if SPARK_VERSION >= (4, 0):
        table: pa.Table = frame.toArrow()
        return table
    return pa.Table.from_batches(frame._collect_as_arrow())  # type: ignore[operator]

"""A grouped map's pandas conversions where the installed PySpark has none to call: before 4.2
(no ``pyspark.sql.conversion``), and the column check should ``pyspark.worker`` ever lose
``verify_pandas_result`` (present from 3.5 to 4.3).

What these do is what PySpark 3.5 to 4.1 do in their pandas serializers, for the types a
grouped map's frame usually holds: numbers, strings, binary, booleans, decimals, dates
(``datetime.date`` objects), timestamps (naive, in the session's time zone, in nanoseconds),
arrays (numpy arrays), structs and maps (dicts). Timestamps nested in arrays or structs are
left as Arrow gives them. Errors read as those releases' do.
"""

from __future__ import annotations

import decimal
from typing import Any

import pandas as pd
import pyarrow as pa
from pyspark.errors import PySparkRuntimeError, PySparkTypeError, PySparkValueError
from pyspark.sql.types import StructType

from pyspark_shuffle.spark.compat import spark_arrow_schema

__all__ = ["check_result", "to_arrow_batch", "to_pandas_frame"]

# Appended by PySpark to a conversion's ValueError when the safe check is on.
_SAFE_CHECK_HINT = (
    " It can be caused by overflows or other unsafe conversions warned by Arrow. Arrow safe"
    " type check can be disabled by using SQL config"
    " `spark.sql.execution.pandas.convertToArrowArraySafely`."
)


def _to_series(column: pa.ChunkedArray, name: str, timezone: str, nanoseconds: bool) -> pd.Series:
    # Dates as datetime.date objects: datetime64[ns] would overflow on far dates.
    series = column.to_pandas(date_as_object=True, coerce_temporal_nanoseconds=nanoseconds)
    if pa.types.is_timestamp(column.type) and column.type.tz is not None:
        series = series.dt.tz_convert(timezone).dt.tz_localize(None)
    elif pa.types.is_timestamp(column.type):
        series = series.astype("datetime64[ns]")
    elif pa.types.is_map(column.type):
        series = series.map(lambda pairs: None if pairs is None else dict(pairs))
    return series.rename(name)


def to_pandas_frame(table: pa.Table, timezone: str, *, nanoseconds: bool) -> pd.DataFrame:
    """``table`` as the frame a grouped map's function gets (``nanoseconds``: as Spark 4.0
    and 4.1, every timestamp in nanoseconds; 3.5 leaves those with a time zone in Arrow's
    unit)."""
    return pd.concat(
        [
            _to_series(column, name, timezone, nanoseconds)
            for name, column in zip(table.column_names, table.columns, strict=True)
        ],
        axis=1,
    )


def check_result(result: Any, schema: StructType, by_name: bool) -> None:
    """Spark 4.2's checks of a grouped map's result: a frame; by name (where ``by_name`` and
    a column label is a string) the same set of names, else as many columns as ``schema``;
    a frame of no rows and no columns passes."""
    if not isinstance(result, pd.DataFrame):
        raise PySparkTypeError(
            errorClass="UDF_RETURN_TYPE",
            messageParameters={"expected": "pandas.DataFrame", "actual": type(result).__name__},
        )
    if result.empty and len(result.columns) == 0:
        return
    expected = schema.names
    if by_name and any(isinstance(label, str) for label in result.columns):
        missing = sorted(set(expected) - set(result.columns))
        extra = sorted(set(result.columns) - set(expected), key=str)
        if missing or extra:
            raise PySparkRuntimeError(
                errorClass="RESULT_COLUMN_NAMES_MISMATCH",
                messageParameters={
                    "missing": f" Missing: {', '.join(missing)}." if missing else "",
                    "extra": f" Unexpected: {', '.join(map(str, extra))}." if extra else "",
                },
            )
    elif len(result.columns) != len(expected):
        raise PySparkRuntimeError(
            errorClass="RESULT_COLUMN_SCHEMA_MISMATCH",
            messageParameters={"expected": str(len(expected)), "actual": str(len(result.columns))},
        )


def _prepared(
    series: pd.Series, arrow_type: pa.DataType, timezone: str, int_to_decimal: bool
) -> pd.Series:
    if isinstance(series.dtype, pd.CategoricalDtype):
        series = series.astype(series.dtype.categories.dtype)
    if pa.types.is_timestamp(arrow_type) and arrow_type.tz is not None:
        # A naive timestamp is a wall time in the session's zone.
        if isinstance(series.dtype, pd.DatetimeTZDtype):
            return series.dt.tz_convert("UTC")
        if pd.api.types.is_datetime64_dtype(series.dtype):
            return series.dt.tz_localize(timezone, ambiguous=False).dt.tz_convert("UTC")
    if int_to_decimal and pa.types.is_decimal(arrow_type):
        return series.map(lambda value: decimal.Decimal(value) if isinstance(value, int) else value)
    return series


def _array(
    series: pd.Series,
    name: str,
    arrow_type: pa.DataType,
    *,
    timezone: str,
    safecheck: bool,
    arrow_cast: bool,
    int_to_decimal: bool,
) -> pa.Array:
    series = _prepared(series, arrow_type, timezone, int_to_decimal)
    mask = None if hasattr(series.array, "__arrow_array__") else series.isnull()
    description = (
        f"Exception thrown when converting pandas.Series ({series.dtype}) with name '{name}'"
        f" to Arrow Array ({arrow_type})."
    )
    try:
        try:
            return pa.Array.from_pandas(series, mask=mask, type=arrow_type, safe=safecheck)
        except pa.ArrowInvalid:  # Spark 4.1 casts what Arrow will not convert directly
            if not arrow_cast:
                raise
            return pa.Array.from_pandas(series, mask=mask).cast(arrow_type, safe=safecheck)
    except TypeError as error:
        raise PySparkTypeError(description) from error
    except ValueError as error:
        hint = _SAFE_CHECK_HINT if safecheck else ""
        raise PySparkValueError(description + hint) from error


def to_arrow_batch(
    result: pd.DataFrame,
    schema: StructType,
    *,
    timezone: str,
    safecheck: bool,
    arrow_cast: bool,
    by_name: bool,
    int_to_decimal: bool,
    large_var_types: bool,
) -> pa.RecordBatch:
    """A checked result as a batch of ``schema``: columns by name (where ``by_name`` and a
    label is a string) or by position, each converted to its Arrow type (else, where
    ``arrow_cast``, as Spark 4.1 does, converted as it is and cast)."""
    arrow = spark_arrow_schema(schema, timezone=timezone, prefers_large_types=large_var_types)
    if len(result.columns) == 0:
        return pa.RecordBatch.from_pylist([{}] * len(result), schema=arrow)
    if by_name and any(isinstance(label, str) for label in result.columns):
        columns = [result[name] for name in schema.names]
    else:
        columns = [result.iloc[:, index] for index in range(len(schema.names))]
    arrays = [
        _array(
            column,
            field.name,
            field.type,
            timezone=timezone,
            safecheck=safecheck,
            arrow_cast=arrow_cast,
            int_to_decimal=int_to_decimal,
        )
        for column, field in zip(columns, arrow, strict=True)
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=arrow)

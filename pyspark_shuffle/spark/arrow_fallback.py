"""A grouped map's Arrow result checks where the installed PySpark has none to call (before
4.0, which has no ``applyInArrow``, and should ``pyspark.worker`` ever lose them), and what
becomes of a checked result on every release.

The checks are Spark 4.3's (``verify_return_type`` and ``ArrowBatchTransformer.enforce_schema``
without casts): a ``pyarrow.Table``; a table of no rows and no columns passes; by name, the
same set of names, else as many columns as the schema; then every type exactly the schema's.
Their messages read as 4.3's, the error class in brackets: the releases this runs on know none
of those classes.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyspark.errors import PySparkRuntimeError, PySparkTypeError

__all__ = ["arranged", "check_result"]


def _names_mismatch(expected: pa.Schema, actual: list[str]) -> PySparkRuntimeError | None:
    missing = sorted(set(expected.names) - set(actual))
    extra = sorted(set(actual) - set(expected.names))
    if not missing and not extra:
        return None
    said = "".join(
        (
            f" Missing: {', '.join(missing)}." if missing else "",
            f" Unexpected: {', '.join(extra)}." if extra else "",
        )
    )
    return PySparkRuntimeError(
        "[RESULT_COLUMN_NAMES_MISMATCH] Column names of the returned data do not match"
        f" specified schema.{said}"
    )


def _count_mismatch(expected: pa.Schema, actual: int) -> PySparkRuntimeError:
    return PySparkRuntimeError(
        "[RESULT_COLUMN_SCHEMA_MISMATCH] Number of columns of the returned data doesn't match"
        f" specified schema. Expected: {len(expected)} Actual: {actual}"
    )


def check_result(result: Any, expected: pa.Schema, by_name: bool) -> None:
    """Raise what Spark 4.3 raises for ``result`` of an ``applyInArrow`` function declared
    ``expected`` (its Arrow types, timestamps in UTC)."""
    if not isinstance(result, pa.Table):
        raise PySparkTypeError(
            "[UDF_RETURN_TYPE] Return type of the user-defined function should be"
            f" pyarrow.Table, but is {type(result).__name__}."
        )
    if result.num_columns == 0:
        return
    if by_name:
        error = _names_mismatch(expected, result.column_names)
        if error is not None:
            raise error
        actual = [result.schema.field(name).type for name in expected.names]
    elif result.num_columns != len(expected):
        raise _count_mismatch(expected, result.num_columns)
    else:
        actual = result.schema.types
    mismatches = [
        f"column '{field.name}' (expected {field.type}, actual {found})"
        for field, found in zip(expected, actual, strict=True)
        if found != field.type
    ]
    if mismatches:
        raise PySparkRuntimeError(
            "[RESULT_COLUMN_TYPES_MISMATCH] Column types of the returned data do not match"
            f" specified schema. Mismatch: {', '.join(mismatches)}."
        )


def arranged(result: pa.Table, expected: pa.Schema, by_name: bool) -> pa.Table:
    """A checked result as Spark reads it: the columns of ``expected`` by name (``by_name``)
    or by position, under its names; no columns, as rows of nulls. Positionally, a count
    that differs fails here (before 4.3 Spark's JVM fails on it, which no Python error
    mirrors)."""
    if result.num_columns == 0:
        return pa.Table.from_pylist([{}] * result.num_rows, schema=expected)
    if by_name:
        return result.select(expected.names)
    if result.num_columns != len(expected):
        raise _count_mismatch(expected, result.num_columns)
    return result.rename_columns(expected.names)

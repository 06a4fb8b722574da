"""Spark schemas as pyshuffle carries them: the Arrow schema Spark hands Python for a Spark
schema, the types pyshuffle refuses (before any task runs), the types a key may have, and
the schema of a join's output as Spark reports it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Final

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.types import (
    ArrayType,
    DataType,
    MapType,
    StructField,
    StructType,
    UserDefinedType,
    _parse_datatype_string,
)

from pyspark_shuffle.spark.compat import spark_arrow_schema
from pyspark_shuffle.spark.link import session_flag
from shuffle_api import InvalidOperationError, UnsupportedTypeError

__all__ = ["arrow_schema", "check_carried", "check_keys", "declared_schema", "join_schema"]

# Spark has no Arrow form for these: its own mapInArrow refuses them.
_NOT_CARRIED: Final = frozenset({"CalendarIntervalType", "YearMonthIntervalType"})
# Spark neither hashes nor orders these, so they are no key of a repartition, group, join or
# sort in Spark either. By name: not every Spark release has each class.
_NOT_KEYS: Final = frozenset({"MapType", "VariantType", "GeometryType", "GeographyType"})


def arrow_schema(
    spark: SparkSession, schema: StructType, *, timezone: str | None = None
) -> pa.Schema:
    """The Arrow schema Spark hands ``mapInArrow`` for ``schema`` (timestamps in the
    session's time zone; ``toArrow`` says ``timezone="UTC"``)."""
    return spark_arrow_schema(
        schema,
        timezone=timezone or str(spark.conf.get("spark.sql.session.timeZone")),
        prefers_large_types=session_flag(spark, "spark.sql.execution.arrow.useLargeVarTypes"),
    )


def _nested(data_type: DataType, path: str) -> Iterator[tuple[str, DataType]]:
    """``data_type`` at ``path`` and every type inside it, each with its path."""
    yield path, data_type
    if isinstance(data_type, UserDefinedType):
        yield from _nested(data_type.sqlType(), path)
    elif isinstance(data_type, StructType):
        for field in data_type.fields:
            yield from _nested(field.dataType, f"{path}.{field.name}")
    elif isinstance(data_type, ArrayType):
        yield from _nested(data_type.elementType, f"{path}[]")
    elif isinstance(data_type, MapType):
        yield from _nested(data_type.keyType, f"{path}.key")
        yield from _nested(data_type.valueType, f"{path}.value")


def check_carried(schema: StructType, what: str) -> None:
    """Refuse, naming the column and its type, a schema with a type Spark cannot hand to
    Python as Arrow (and so neither can pyshuffle)."""
    for field in schema.fields:
        for path, data_type in _nested(field.dataType, field.name):
            if type(data_type).__name__ in _NOT_CARRIED:
                raise UnsupportedTypeError(
                    f"{what}: column {path!r} is of type {data_type.simpleString()}, which"
                    " Spark cannot pass to Python as Arrow; cast it (to a string, say) first"
                )


def declared_schema(schema: StructType | str, what: str) -> StructType:
    """A function's declared output schema (a ``StructType`` or DDL), checked as
    :func:`check_carried` does."""
    struct = _parse_datatype_string(schema) if isinstance(schema, str) else schema
    if not isinstance(struct, StructType):
        raise InvalidOperationError(f"{what}: the schema {schema!r} is not a struct of columns")
    check_carried(struct, what)
    return struct


def check_keys(schema: StructType, keys: Sequence[str], what: str) -> None:
    """Refuse a key that is no column of ``schema``, or whose type Spark neither hashes nor
    orders (a map, a variant, anywhere in it)."""
    fields = {field.name: field for field in schema.fields}
    for key in keys:
        if key not in fields:
            raise InvalidOperationError(
                f"{what}: no column {key!r} in the DataFrame; columns: {list(fields)}"
            )
        for path, data_type in _nested(fields[key].dataType, key):
            if type(data_type).__name__ in _NOT_KEYS:
                where = "" if path == key else f" (at {path!r})"
                raise UnsupportedTypeError(
                    f"{what}: column {key!r} of type {fields[key].dataType.simpleString()}"
                    f" cannot be a key{where}: Spark neither hashes nor orders"
                    f" {data_type.simpleString()}"
                )


def join_schema(left: StructType, right: StructType, keys: Sequence[str], how: str) -> StructType:
    """Spark's columns for ``join(on=keys)``: keys, then the left's others, then the right's."""

    def nullable_if(field: StructField, outer: bool) -> StructField:
        return StructField(field.name, field.dataType, field.nullable or outer)

    # A key's value comes from the left, the right (right join) or either (full join:
    # Spark's coalesce of two outer sides, which it reports nullable whatever the sides).
    key_fields = [
        StructField(
            key,
            left[key].dataType,
            {"right": right[key].nullable, "full": True}.get(how, left[key].nullable),
        )
        for key in keys
    ]
    if how in ("semi", "anti"):
        return StructType(key_fields + [f for f in left.fields if f.name not in keys])
    left_outer, right_outer = how in ("right", "full"), how in ("left", "full")
    clashing = set(left.fieldNames()) & set(right.fieldNames()) - set(keys)
    if clashing:
        raise InvalidOperationError(
            f"join: columns {sorted(clashing)} are on both sides; rename them on one side"
        )
    return StructType(
        key_fields
        + [nullable_if(field, left_outer) for field in left.fields if field.name not in keys]
        + [nullable_if(field, right_outer) for field in right.fields if field.name not in keys]
    )

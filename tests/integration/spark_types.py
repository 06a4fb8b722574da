"""Generated Spark schemas and rows for the type tests: every Spark SQL type that PySpark hands
Python as Arrow, nested up to three levels, with nulls where the schema allows them, empty
values and extremes (NaN, -0.0, infinities, the ends of every integer and date range, empty,
unicode and large strings)."""

from __future__ import annotations

import datetime
import decimal
from typing import Any

from hypothesis import strategies as st
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DayTimeIntervalType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    NullType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

__all__ = [
    "KEY",
    "TypedRows",
    "described",
    "key_types",
    "short",
    "spark_types",
    "typed_rows",
    "values_of",
]

KEY = "k"
"""The key column of every generated schema; the others are ``c0``, ``c1``, ..."""

_LARGE_STRING = "large-" + "\u00e9\U0001f600x" * 20_000
_UTC = datetime.UTC

ATOMIC_TYPES: tuple[DataType, ...] = (
    BooleanType(),
    ByteType(),
    ShortType(),
    IntegerType(),
    LongType(),
    FloatType(),
    DoubleType(),
    DecimalType(5, 2),
    DecimalType(18, 0),
    DecimalType(38, 10),
    StringType(),
    BinaryType(),
    DateType(),
    TimestampType(),
    TimestampNTZType(),
    DayTimeIntervalType(),
    DayTimeIntervalType(DayTimeIntervalType.HOUR, DayTimeIntervalType.MINUTE),
    NullType(),
)

# Map keys: never null; floats left out (Spark keeps NaN keys apart, which no dict can hold).
_MAP_KEY_TYPES = tuple(
    each for each in ATOMIC_TYPES if not isinstance(each, FloatType | DoubleType | NullType)
)


def spark_types(depth: int, *, keys: bool = False) -> st.SearchStrategy[DataType]:
    """Spark types nested up to ``depth`` levels below the column; ``keys``: only those Spark
    hashes and orders (no map anywhere)."""
    atomic = st.sampled_from(ATOMIC_TYPES)
    if depth == 0:
        return atomic
    inner = _with_nullability(spark_types(depth - 1, keys=keys))
    nested = [
        inner.map(lambda element: ArrayType(*element)),
        st.lists(inner, min_size=1, max_size=3).map(
            lambda fields: StructType(
                [StructField(f"f{i}", each, nullable) for i, (each, nullable) in enumerate(fields)]
            )
        ),
    ]
    if not keys:
        nested.append(
            st.tuples(st.sampled_from(_MAP_KEY_TYPES), inner).map(
                lambda pair: MapType(pair[0], *pair[1])
            )
        )
    return st.one_of(atomic, *nested)


def _with_nullability(
    types: st.SearchStrategy[DataType],
) -> st.SearchStrategy[tuple[DataType, bool]]:
    """Each type with a nullability flag (always nullable: a void type holds only nulls)."""
    return st.tuples(types, st.booleans()).map(
        lambda pair: (pair[0], pair[1] or isinstance(pair[0], NullType))
    )


def key_types() -> st.SearchStrategy[DataType]:
    return spark_types(3, keys=True)


def _atomic_values(data_type: DataType) -> st.SearchStrategy[Any]:
    integers = {ByteType: 8, ShortType: 16, IntegerType: 32, LongType: 64}
    for kind, bits in integers.items():
        if isinstance(data_type, kind):
            low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
            return st.integers(low, high) | st.sampled_from([low, high, 0, -1])
    if isinstance(data_type, BooleanType):
        return st.booleans()
    if isinstance(data_type, FloatType | DoubleType):
        special = [float("nan"), -0.0, 0.0, float("inf"), float("-inf")]
        floats = st.floats(width=32) if isinstance(data_type, FloatType) else st.floats()
        return floats | st.sampled_from(special)
    if isinstance(data_type, DecimalType):
        # From digits and a string: decimal arithmetic would round to 28 digits.
        largest = 10**data_type.precision - 1
        unscaled = st.integers(-largest, largest) | st.sampled_from([-largest, largest, 0])
        return unscaled.map(lambda number: decimal.Decimal(f"{number}E-{data_type.scale}"))
    if isinstance(data_type, StringType):
        return st.text(max_size=8) | st.sampled_from(["", "\u00e9\U0001f600", _LARGE_STRING])
    if isinstance(data_type, BinaryType):
        return st.binary(max_size=8) | st.sampled_from([b"", b"\x00", b"\xff" * 3000])
    if isinstance(data_type, DateType):
        return st.dates(datetime.date(1, 1, 1), datetime.date(9999, 12, 31))
    if isinstance(data_type, TimestampType):
        return st.datetimes(
            datetime.datetime(1, 1, 2), datetime.datetime(9999, 12, 30), timezones=st.just(_UTC)
        )
    if isinstance(data_type, TimestampNTZType):
        return st.datetimes(datetime.datetime(1, 1, 2), datetime.datetime(9999, 12, 30))
    if isinstance(data_type, DayTimeIntervalType):
        unit = (
            datetime.timedelta(minutes=1)
            if data_type.endField == DayTimeIntervalType.MINUTE
            else datetime.timedelta(microseconds=1)
        )
        return st.integers(-(10**11), 10**11).map(lambda count: count * unit)
    if isinstance(data_type, NullType):
        return st.none()
    raise AssertionError(f"no values for {data_type}")


def values_of(data_type: DataType, nullable: bool) -> st.SearchStrategy[Any]:
    """Python values Spark takes for ``data_type`` (``None`` only where ``nullable``)."""
    if isinstance(data_type, ArrayType):
        values: st.SearchStrategy[Any] = st.lists(
            values_of(data_type.elementType, data_type.containsNull), max_size=3
        )
    elif isinstance(data_type, MapType):
        values = st.dictionaries(
            values_of(data_type.keyType, False),
            values_of(data_type.valueType, data_type.valueContainsNull),
            max_size=3,
        )
    elif isinstance(data_type, StructType):
        values = st.tuples(*(values_of(field.dataType, field.nullable) for field in data_type))
    else:
        values = _atomic_values(data_type)
    return st.none() | values if nullable else values


class TypedRows:
    """A schema whose column ``k`` is a key, and its rows (few distinct keys, so that groups
    and join matches have several rows)."""

    def __init__(self, schema: StructType, rows: list[tuple[Any, ...]]) -> None:
        self.schema = schema
        self.rows = rows

    def __repr__(self) -> str:
        # Short: a failing example prints it, and a row may hold a string of 80 kB.
        shown = ", ".join(short(row) for row in self.rows[:8])
        return f"TypedRows({described(self.schema)}, {len(self.rows)} rows: [{shown}])"


def described(data_type: DataType) -> str:
    """``data_type`` as DDL with its nullability ("not null" where a value may not be)."""
    if isinstance(data_type, StructType):
        fields = [
            f"{field.name}: {described(field.dataType)}{'' if field.nullable else ' not null'}"
            for field in data_type.fields
        ]
        return f"struct<{', '.join(fields)}>"
    if isinstance(data_type, ArrayType):
        element = described(data_type.elementType)
        return f"array<{element}{'' if data_type.containsNull else ' not null'}>"
    if isinstance(data_type, MapType):
        value = described(data_type.valueType)
        nullable = "" if data_type.valueContainsNull else " not null"
        return f"map<{described(data_type.keyType)}, {value}{nullable}>"
    return data_type.simpleString()


def short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 300 else text[:300] + "..."


@st.composite
def typed_rows(draw: st.DrawFn, *, max_rows: int = 24) -> TypedRows:
    key_type, key_nullable = draw(_with_nullability(key_types()))
    payload = draw(st.lists(_with_nullability(spark_types(3)), min_size=1, max_size=3))
    schema = StructType(
        [StructField(KEY, key_type, key_nullable)]
        + [StructField(f"c{i}", each, nullable) for i, (each, nullable) in enumerate(payload)]
    )
    keys = draw(st.lists(values_of(key_type, key_nullable), min_size=1, max_size=5))
    count = draw(st.integers(0, max_rows))
    rows = [
        (
            draw(st.sampled_from(keys)),
            *(draw(values_of(field.dataType, field.nullable)) for field in schema.fields[1:]),
        )
        for _ in range(count)
    ]
    return TypedRows(schema, rows)

"""NumPy <-> Arrow through buffers: the same values as pyarrow's own conversions."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from shuffle_runtime.ndarrays import (
    arrow_array,
    bytes_array,
    longs,
    number_scalar,
    numpy_values,
    validity,
)

TYPES = [pa.int8(), pa.int32(), pa.int64(), pa.uint16(), pa.uint64(), pa.float32(), pa.float64()]


@pytest.mark.parametrize("data_type", TYPES, ids=str)
def test_values_of_a_sliced_array_with_nulls_are_arrows_own(data_type: pa.DataType) -> None:
    array = pa.array([None if i % 7 == 3 else i for i in range(100)], data_type).slice(5, 60)
    assert numpy_values(array, fill=9).tolist() == array.fill_null(9).to_pylist()
    assert validity(array).tolist() == array.is_valid().to_pylist()


def test_booleans_round_trip_at_any_offset() -> None:
    array = pa.array([i % 3 == 0 if i % 5 else None for i in range(77)]).slice(3, 50)
    assert numpy_values(array).tolist() == array.fill_null(False).to_pylist()
    flags = np.arange(13) % 2 == 0
    assert arrow_array(flags).to_pylist() == flags.tolist()


@pytest.mark.parametrize("dtype", ["int8", "int64", "uint32", "float64"])
def test_arrow_array_of_a_strided_view_holds_its_values(dtype: str) -> None:
    values = np.arange(40, dtype=dtype)[::3]
    array = arrow_array(values)
    assert array.type == pa.from_numpy_dtype(np.dtype(dtype))
    assert array.to_pylist() == values.tolist()


def test_an_empty_array_has_no_values() -> None:
    assert numpy_values(pa.array([], pa.int64())).dtype == np.int64
    assert len(arrow_array(np.zeros(0, np.int32))) == 0
    assert validity(pa.array([], pa.int64())).tolist() == []


def test_bytes_and_strings_are_arrows_own() -> None:
    values = [b"", b"abc", None, b"\x00\xff", "é".encode()]
    assert bytes_array(values) == pa.array(values, pa.binary())
    assert bytes_array(values[-1:], pa.string()) == pa.array(["é"])
    assert len(bytes_array([])) == 0


@pytest.mark.parametrize("data_type", [pa.date32(), pa.timestamp("us"), pa.time64("ns")], ids=str)
def test_temporal_values_are_their_counts(data_type: pa.DataType) -> None:
    array = (
        pa.array([3, None, 5], pa.int64())
        .cast(pa.int32() if data_type.bit_width == 32 else pa.int64())
        .view(data_type)
    )
    assert numpy_values(array).tolist() == [3, 0, 5]


def test_longs_are_int64() -> None:
    assert longs([3, -1 << 40]) == pa.array([3, -1 << 40], pa.int64())


def test_a_number_scalar_is_of_its_type() -> None:
    assert number_scalar(0, pa.float32()) == pa.scalar(0.0, pa.float32())
    assert number_scalar(-7, pa.int16()) == pa.scalar(-7, pa.int16())
    assert number_scalar(float("nan"), pa.float64()).is_valid


def test_strings_have_no_numpy_view() -> None:
    with pytest.raises(TypeError, match="string"):
        numpy_values(pa.array(["a"]))


def test_converting_does_not_import_pandas() -> None:
    probe = (
        "import sys, numpy as np, pyarrow as pa\n"
        "from shuffle_runtime.ndarrays import arrow_array, bytes_array, numpy_values\n"
        "numpy_values(arrow_array(np.arange(5)))\n"
        "numpy_values(arrow_array(np.arange(5) > 2))\n"
        "bytes_array([b'x'])\n"
        "assert 'pandas' not in sys.modules, 'pandas imported'\n"
    )
    subprocess.run([sys.executable, "-c", probe], check=True)

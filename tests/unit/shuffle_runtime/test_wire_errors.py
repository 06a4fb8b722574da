"""Every ShuffleError class crosses both services' wires as itself, with its partition: the
default service's ERROR frames (by number) and the external data port's DataPortError (by
name) read one table (``shuffle_runtime.wire_errors``); a class outside it goes as its base."""

from __future__ import annotations

import pytest

from external_shuffle.wire.errors import error_from_pb, error_to_pb
from netty_like.protocol import decode_error, encode_error, error_from_code
from shuffle_api import IntermediateResultPartitionID, ResultPartitionID, ShuffleError
from shuffle_api import errors as error_module
from shuffle_api.errors import PartitionError, TransportError
from shuffle_runtime.connections import StaleConnectionError
from shuffle_runtime.wire_errors import WIRE_ERRORS, error_code, new_error

PARTITION = ResultPartitionID(IntermediateResultPartitionID("result-x", 3), "attempt-7")


def _raised(cls: type[ShuffleError]) -> ShuffleError:
    return new_error(cls, f"{cls.__name__} raised", PARTITION)


def _over_netty(error: ShuffleError) -> ShuffleError:
    channel, code, message = decode_error(memoryview(encode_error(5, error)))
    assert channel == 5
    return error_from_code(code, message, PARTITION)


def _over_data_port(error: ShuffleError) -> ShuffleError:
    return error_from_pb(error_to_pb(error), "a fetch", None)


def test_the_table_holds_every_error_class_of_shuffle_api_once() -> None:
    classes = {
        value
        for value in vars(error_module).values()
        if isinstance(value, type) and issubclass(value, ShuffleError)
    }
    assert {cls for _, cls in WIRE_ERRORS} == classes
    codes = [code for code, _ in WIRE_ERRORS]
    assert len(set(codes)) == len(codes)


@pytest.mark.parametrize("cls", [cls for _, cls in WIRE_ERRORS], ids=lambda cls: cls.__name__)
@pytest.mark.parametrize("wire", [_over_netty, _over_data_port], ids=["netty", "data-port"])
def test_every_class_arrives_as_itself_with_its_partition(
    cls: type[ShuffleError], wire: object
) -> None:
    assert callable(wire)
    arrived = wire(_raised(cls))
    assert type(arrived) is cls
    assert f"{cls.__name__} raised" in str(arrived)
    if isinstance(arrived, PartitionError):
        assert arrived.partition_id == PARTITION


def test_a_class_outside_the_table_goes_as_its_base() -> None:
    stale = StaleConnectionError("gone")
    assert error_code(stale) == error_code(TransportError("gone"))
    assert type(_over_netty(stale)) is TransportError
    assert type(_over_data_port(stale)) is TransportError

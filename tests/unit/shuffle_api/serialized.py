"""Descriptors and their round trip through the bytes, for the tests of
``shuffle_api.serialization`` and ``netty_like.descriptor``."""

from __future__ import annotations

from netty_like import NettyShuffleDescriptor
from shuffle_api import IntermediateResultPartitionID, ResultPartitionID, deserialize, serialize
from shuffle_api.serialization import Descriptor

RESULT = "3f2a9c0d1e4b4f7a8c6d5e4f3a2b1c0d"


def rpid(index: int, attempt: str = "attempt-0") -> ResultPartitionID:
    return ResultPartitionID(IntermediateResultPartitionID(RESULT, index), attempt)


def netty_descriptor(index: int, data_port: int = 40123) -> NettyShuffleDescriptor:
    return NettyShuffleDescriptor(
        partition=rpid(index),
        producer_location="executor-1",
        host="10.0.0.7",
        data_port=data_port,
        connection_index=1,
        store_url="memory://pyshuffle/store",
    )


def round_trip(value: Descriptor) -> Descriptor:
    return deserialize(serialize(value))

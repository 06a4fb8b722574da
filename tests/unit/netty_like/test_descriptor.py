"""``netty_like.descriptor``: its details through the bytes, and details that do not decode."""

from __future__ import annotations

import pytest

from netty_like import NettyShuffleDescriptor
from shuffle_api import LOCAL_ONLY_PORT, SerializationError, deserialize, serialize
from shuffle_api.messages import pb
from shuffle_api.serialization import FORMAT_VERSION
from tests.unit.shuffle_api.serialized import netty_descriptor, round_trip


@pytest.mark.parametrize("data_port", [40123, 0, LOCAL_ONLY_PORT])
def test_netty_shuffle_descriptor_round_trips(data_port: int) -> None:
    value = netty_descriptor(1, data_port)

    decoded = round_trip(value)

    assert decoded == value
    assert isinstance(decoded, NettyShuffleDescriptor)
    assert decoded.stores_local_resources_on() == "executor-1"


def test_netty_descriptor_with_undecodable_details_raises_serialization_error() -> None:
    message = pb.ShuffleDescriptor.FromString(
        pb.Envelope.FromString(
            serialize(netty_descriptor(0))
        ).shuffle_descriptor.SerializeToString()
    )
    message.details = b"\xff\xff\xff"
    envelope = pb.Envelope(format_version=FORMAT_VERSION, shuffle_descriptor=message)

    with pytest.raises(SerializationError):
        deserialize(envelope.SerializeToString())

"""A client's coordinators when none answers: the wait is said, with the addresses tried, long
before the retry timeout ends it."""

from __future__ import annotations

import logging

import pytest

from external_shuffle.client.coordinators import Coordinators
from external_shuffle.wire.channels import ChannelPool, ClientSettings
from external_shuffle.wire.stubs import pb
from shuffle_api import TransportError
from tests.refused_port import refused_port


def test_coordinators_that_do_not_answer_are_named_at_warning_then_given_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with refused_port() as port:
        address = f"127.0.0.1:{port}"
        channels = ChannelPool(
            ClientSettings(token="t", credentials=None, max_message_size=1 << 20, timeout=1.0)
        )
        coordinators = Coordinators((address,), channels, retry_timeout=4.0)
        with (
            caplog.at_level(logging.WARNING, "external_shuffle.client.coordinators"),
            pytest.raises(TransportError, match=r"gave up after retrying for 4\.0 s"),
        ):
            coordinators.first(
                "listing workers",
                lambda at: coordinators.stub(at).ListWorkers(pb.ListWorkersRequest(), timeout=1),
            )
        channels.close()
    [warning] = caplog.records
    assert warning.getMessage().startswith(
        f"no coordinator answers: listing workers on coordinators {address} failed"
    )
    assert "; retrying for " in warning.getMessage()

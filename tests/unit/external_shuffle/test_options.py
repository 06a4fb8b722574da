"""The external service's options: message chunks that always fit, and the daemon's own
calls configurable."""

from __future__ import annotations

import pytest

from external_shuffle.options import (
    DAEMON_OPTIONS,
    MAX_MESSAGE_SIZE,
    message_chunk_size,
    message_data_limit,
)
from shuffle_api import ConfigError, Configuration
from shuffle_api.options import CORE_OPTIONS


def test_a_chunk_is_kept_below_the_message_limit_and_never_empty() -> None:
    smallest = Configuration.load({"external-shuffle.max-message-size": "128k"})
    assert message_chunk_size(smallest) == message_data_limit(smallest) == 64 << 10
    default = Configuration.load({})
    assert message_chunk_size(default) == 1 << 20
    assert message_data_limit(default) == (16 << 20) - (64 << 10)
    with pytest.raises(ConfigError, match="max-message-size"):
        Configuration.load({"external-shuffle.max-message-size": "64k"}).get(MAX_MESSAGE_SIZE)


def test_the_daemon_accepts_the_timeout_of_its_own_calls() -> None:
    config = Configuration.load({"external-shuffle.client.timeout": "5"})
    config.validate([*CORE_OPTIONS, *DAEMON_OPTIONS])

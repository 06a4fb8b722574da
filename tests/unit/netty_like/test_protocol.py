"""``netty_like.protocol``: an ERROR frame's error number this side does not know."""

from __future__ import annotations

from netty_like.protocol import error_from_code
from shuffle_api import ShuffleError


def test_an_unknown_number_is_a_shuffle_error() -> None:
    assert type(error_from_code(250, "from a newer peer", None)) is ShuffleError

"""The frames of a worker's data port (the protocol is described in ``proto/``, next to
``DataPortError``); frame types 7 to 10 are the handshake's (:mod:`shuffle_runtime.sockets`)."""

from __future__ import annotations

import struct
from typing import Final

__all__ = [
    "END",
    "FAILED",
    "FETCH",
    "FETCH_BATCH",
    "MANIFEST",
    "MAX_REQUEST_SIZE",
    "RUN",
    "RUN_HEADER",
]

FETCH: Final = 1
MANIFEST: Final = 2
RUN: Final = 3
END: Final = 4
FAILED: Final = 5
FETCH_BATCH: Final = 6
RUN_HEADER: Final = struct.Struct("!QQ")
"""A RUN frame's body: the run's length and xxh3-64. The run's bytes follow the frame."""
MAX_REQUEST_SIZE: Final = 64 << 10
"""A FetchDataRequest names one partition and a range (about 100 bytes), and a batch of
:data:`~shuffle_runtime.sockets.MAX_BATCH` of them stays below this."""

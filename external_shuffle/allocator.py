"""glibc's malloc, set for a process that moves data in messages of megabytes.

Every data message is a new ``bytes`` object of up to ``max-message-size`` (gRPC's received
messages, framed chunks). With glibc's defaults, a block that large in a thread's arena is
handed back to the kernel when freed (trimmed, or unmapped) and the next one is faulted in
and zeroed page by page again: on a worker serving a fetch, a quarter of its CPU time. Kept
in the arena (a fixed mmap threshold above the largest message, a trim threshold of a few
messages), freed blocks are reused as they are.
"""

from __future__ import annotations

import ctypes
import logging
import sys
from typing import Final

__all__ = ["keep_message_buffers"]

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD: Final = -1  # from glibc's malloc.h
_M_MMAP_THRESHOLD: Final = -3
_MMAP_THRESHOLD_MAX: Final = 32 << 20  # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit)


def keep_message_buffers(max_message_size: int) -> bool:
    """Have malloc keep freed blocks of up to ``max_message_size`` bytes (and some) for reuse;
    False where the C library is not glibc (nothing changes then)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mmap_threshold = min(_MMAP_THRESHOLD_MAX, max(max_message_size * 2, 1 << 20))
    applied = bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(
        mallopt(_M_TRIM_THRESHOLD, mmap_threshold * 4)
    )
    if applied:
        logger.debug("malloc keeps blocks up to %d bytes for reuse", mmap_threshold)
    return applied

"""The malloc setting for message buffers applies wherever the C library is glibc."""

from __future__ import annotations

import platform
import sys

from external_shuffle.allocator import keep_message_buffers


def test_malloc_keeps_message_buffers_where_the_c_library_is_glibc() -> None:
    glibc = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    assert keep_message_buffers(16 << 20) is glibc
    # Whatever the message size, the thresholds stay within what glibc accepts.
    assert keep_message_buffers(1 << 30) is glibc
    assert keep_message_buffers(1) is glibc

"""The data file a writer pushes, as the push sink cuts it into chunks or holds it whole for
the commit (the pushes themselves: tests/conformance/test_external_shuffle_conformance.py)."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pytest

from external_shuffle.client.push import PushSettings, _DataStream

CHUNK = 1000


class _RecordingSink:
    """What a push sink is to its data stream: where chunks are streamed, or a file under a
    chunk is held for the commit."""

    def __init__(self) -> None:
        self.settings = PushSettings(chunk_size=CHUNK, max_in_flight=4 * CHUNK, timeout=5.0)
        self.chunks: list[bytes] = []
        self.held: list[bytes] = []

    @property
    def streaming(self) -> bool:
        return bool(self.chunks)

    @property
    def sent(self) -> int:
        return sum(len(chunk) for chunk in self.chunks)

    def send(self, parts: Sequence[memoryview], size: int) -> None:
        self.chunks.append(_joined(parts, size))

    def hold(self, parts: Sequence[memoryview], size: int) -> None:
        self.held.append(_joined(parts, size))


def _joined(parts: Sequence[memoryview], size: int) -> bytes:
    data = b"".join(parts)
    assert len(data) == size
    return data


@pytest.mark.parametrize("sizes", [[1], [CHUNK], [999, 1, 1000, 2500, 3, 7000], [4321] * 5])
def test_chunks_are_whole_but_the_last_and_hold_what_was_written(sizes: list[int]) -> None:
    sink = _RecordingSink()
    stream = _DataStream(sink)  # type: ignore[arg-type]
    reused = bytearray()
    expected = bytearray()
    for number, size in enumerate(sizes):
        data = bytes((number + position) % 251 for position in range(size))
        expected += data
        # The three kinds a writer hands over: a buffer it reuses, bytes, an Arrow buffer.
        if number % 3 == 0:
            reused[:] = data
            assert stream.write(reused) == size
            reused[:] = b"\xff" * size  # reused at once: what was written must not change
        elif number % 3 == 1:
            assert stream.write(data) == size
        else:
            assert stream.write(memoryview(pa.py_buffer(data))) == size
        # What is not sent yet is less than a chunk: the stream keeps no more.
        assert 0 <= len(expected) - sink.sent < CHUNK
    stream.close()
    if len(expected) < CHUNK:  # held whole for the commit's one call, nothing streamed
        assert (sink.chunks, sink.held) == ([], [bytes(expected)])
    else:
        assert b"".join(sink.chunks) == expected
        assert all(len(chunk) == CHUNK for chunk in sink.chunks[:-1])
        assert 0 < len(sink.chunks[-1]) <= CHUNK
        assert sink.held == []


@pytest.mark.parametrize("size", [10, CHUNK + 10])
def test_closing_twice_sends_or_holds_the_last_chunk_once(size: int) -> None:
    sink = _RecordingSink()
    stream = _DataStream(sink)  # type: ignore[arg-type]
    stream.write(b"x" * size)
    stream.close()
    stream.close()
    assert b"".join(sink.chunks + sink.held) == b"x" * size
    assert len(sink.chunks + sink.held) == 1 + size // CHUNK

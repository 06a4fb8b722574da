"""Arrow data as bytes that Spark carries opaquely (task results, broadcasts): one IPC stream."""

from __future__ import annotations

import pyarrow as pa

__all__ = ["from_ipc_stream", "to_ipc_stream"]


def to_ipc_stream(data: pa.Table | pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, data.schema) as writer:
        writer.write(data)
    return bytes(sink.getvalue().to_pybytes())


def from_ipc_stream(data: bytes) -> pa.Table:
    """The table in ``data``, read in place (no copy of its buffers)."""
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()

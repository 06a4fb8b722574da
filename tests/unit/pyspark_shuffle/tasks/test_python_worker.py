"""What a pyshuffle task does to its Python worker as it starts: its connection, its memory
pool (the Spark side: tests/integration/test_pyspark_many_partitions.py,
tests/integration/test_pyspark_worker_imports.py)."""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator

import pyarrow as pa
import pytest

from pyspark_shuffle.spark.internals import task_connection
from pyspark_shuffle.tasks import python_worker
from pyspark_shuffle.tasks.python_worker import acknowledge_at_once, task_starts, use_memory_pool

_TCP_QUICKACK = getattr(socket, "TCP_QUICKACK", None)


def _segments_sent(connection: socket.socket) -> int:
    """``tcpi_segs_out`` of Linux's ``struct tcp_info``: data and bare acknowledgements."""
    info = connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return int(struct.unpack_from("=I", info, _SEGMENTS_OUT)[0])


_SEGMENTS_OUT = 136


@pytest.mark.skipif(_TCP_QUICKACK is None, reason="TCP_QUICKACK is Linux's")
def test_a_tcp_connection_acknowledges_what_it_holds_at_once_and_stays_open() -> None:
    """As a Python worker between a task's command and its input: the kernel holds the
    command's acknowledgement back (to send it with an answer), and the executor's socket
    holds the input back until it comes."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        executor = socket.create_connection(server.getsockname())
        worker, _ = server.accept()
        with executor, worker:
            # A request answered at once: the kernel now delays this side's acknowledgements.
            executor.sendall(b"task")
            assert worker.recv(100) == b"task"
            worker.sendall(b"result")
            assert executor.recv(100) == b"result"
            acknowledged = []
            for _ in range(5):  # a try the delayed acknowledgement's timer beat proves nothing
                executor.sendall(b"command")
                assert worker.recv(100) == b"command"
                before = _segments_sent(worker)
                assert acknowledge_at_once(worker.fileno())
                acknowledged.append(_segments_sent(worker) - before)
                worker.sendall(b"result")
                assert executor.recv(100) == b"result"
                if acknowledged[-1] == 1:
                    break
            assert acknowledged[-1] == 1, acknowledged


def test_what_is_no_tcp_connection_is_left_as_it_is() -> None:
    first, second = socket.socketpair()
    with first, second:
        assert not acknowledge_at_once(first.fileno())
        first.sendall(b"still open")
        assert second.recv(100) == b"still open"
    read, write = os.pipe()
    try:
        assert not acknowledge_at_once(read)
        os.write(write, b"x")
        assert os.read(read, 1) == b"x"
    finally:
        os.close(read)
        os.close(write)


def test_outside_a_spark_task_there_is_no_task_connection_to_change() -> None:
    assert task_connection() is None
    task_starts()  # nothing to do, and no error


@pytest.fixture
def restored_memory_pool() -> Iterator[None]:
    before = pa.default_memory_pool()
    yield
    pa.set_memory_pool(before)


@pytest.mark.usefixtures("restored_memory_pool")
@pytest.mark.parametrize("name", ["system", "jemalloc", "mimalloc"])
def test_the_memory_pool_named_allocates_from_then_on(name: str) -> None:
    try:
        pool = getattr(pa, f"{name}_memory_pool")()
    except NotImplementedError:  # not in this pyarrow build
        pool = pa.system_memory_pool()
    assert use_memory_pool(name) == pool.backend_name
    assert pa.default_memory_pool().backend_name == pool.backend_name
    before = pool.bytes_allocated()
    allocated = pa.allocate_buffer(1 << 20)
    assert pool.bytes_allocated() - before >= allocated.size


@pytest.mark.usefixtures("restored_memory_pool")
def test_default_leaves_the_pool_as_it_is() -> None:
    pa.set_memory_pool(pa.system_memory_pool())
    assert use_memory_pool("default") == "system"
    assert pa.default_memory_pool().backend_name == "system"


@pytest.mark.usefixtures("restored_memory_pool")
def test_a_pool_this_pyarrow_lacks_falls_back_to_the_systems(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def missing() -> pa.MemoryPool:
        raise NotImplementedError("This Arrow build does not enable jemalloc")

    monkeypatch.setitem(python_worker._MEMORY_POOLS, "jemalloc", missing)
    assert use_memory_pool("jemalloc") == "system"
    assert pa.default_memory_pool().backend_name == "system"

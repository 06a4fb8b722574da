"""The host's own faults a chaos run uses, done for real: a small disk filled to the last byte
(writes fail with ENOSPC) and freed, and every connection to a port aborted on both ends while
a connection to another port lives on. Both need root, as on the machines CI runs on."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

import pytest

from pyspark_shuffle.chaos.connections import abort_connections, can_abort_connections
from pyspark_shuffle.chaos.disks import SmallDisks


def test_a_small_disk_filled_refuses_writes_until_freed_and_is_gone_when_closed(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "store"
    with SmallDisks(4 << 20) as disks:
        disk = disks.mount(directory)
        assert disk is not None and os.path.ismount(directory)
        disk.fill()
        with pytest.raises(OSError) as full:
            (directory / "partition").write_bytes(b"x" * 65_536)
        assert full.value.errno == errno.ENOSPC
        disk.free()
        (directory / "partition").write_bytes(b"x" * 65_536)
        assert sorted(path.name for path in directory.iterdir()) == ["partition"]
    assert not os.path.ismount(directory)
    assert not directory.exists() or not any(directory.iterdir())


def _connected(server: socket.socket) -> tuple[socket.socket, socket.socket]:
    client = socket.create_connection(server.getsockname()[:2], timeout=5)
    accepted, _ = server.accept()
    return client, accepted


def test_connections_to_a_port_are_aborted_on_both_ends_and_others_live_on() -> None:
    assert can_abort_connections()
    with (
        socket.create_server(("127.0.0.1", 0)) as target,
        socket.create_server(("127.0.0.1", 0)) as other,
    ):
        dropped = [_connected(target) for _ in range(2)]
        kept_client, kept_server = _connected(other)
        try:
            # One end destroyed, its peer reset by it: at least one socket a connection.
            assert 2 <= abort_connections([target.getsockname()[1]]) <= 4
            for client, accepted in dropped:
                for end in (client, accepted):
                    with pytest.raises(ConnectionError):
                        end.sendall(b"?")
                        end.recv(1)
            kept_client.sendall(b"alive")
            assert kept_server.recv(5) == b"alive"
        finally:
            for end in (kept_client, kept_server, *(end for pair in dropped for end in pair)):
                end.close()

"""Small filesystems of their own for a chaos run's stores, so that a fault can fill one to the
last byte, as a full disk is, without touching the host's own disks.

Each is a ``tmpfs`` mounted on the store's directory, which needs root (``mount``); where the host
refuses, no store is fillable and runs do not draw the store-full fault.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Self

__all__ = ["BALLAST_NAME", "SmallDisk", "SmallDisks"]

_LOG = logging.getLogger(__name__)

BALLAST_NAME: Final = ".chaos-ballast"
"""The file that fills a disk: a dot file, which no store takes for a partition's."""
_MOUNT_TIMEOUT_SECONDS: Final = 30.0


@dataclass(frozen=True, slots=True)
class SmallDisk:
    """A small filesystem of its own, mounted on ``directory``."""

    directory: Path

    @property
    def ballast(self) -> Path:
        return self.directory / BALLAST_NAME

    def fill(self) -> None:
        """Take every free byte with a ballast file (allocated, not written: at once)."""
        space = os.statvfs(self.directory)
        descriptor = os.open(self.ballast, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.posix_fallocate(descriptor, 0, max(1, space.f_bavail * space.f_frsize))
        except OSError:  # what it could take is taken: the disk is full either way
            pass
        finally:
            os.close(descriptor)

    def free(self) -> None:
        """The space back."""
        with contextlib.suppress(FileNotFoundError):
            self.ballast.unlink()


class SmallDisks:
    """tmpfs filesystems of ``size_bytes`` each, mounted on directories one by one, and all
    unmounted on :meth:`close` (lazily: a process that still holds a file there keeps it)."""

    def __init__(self, size_bytes: int) -> None:
        self._size = size_bytes
        self._mounted: list[SmallDisk] = []

    def mount(self, directory: Path) -> SmallDisk | None:
        """``directory`` (made if missing) as a small disk, or None where mounting is refused."""
        directory.mkdir(parents=True, exist_ok=True)
        try:
            answer = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={self._size}", "tmpfs", str(directory)],
                capture_output=True,
                text=True,
                timeout=_MOUNT_TIMEOUT_SECONDS,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            _LOG.info("no small disk at %s: %s", directory, error)
            return None
        if answer.returncode != 0:
            _LOG.info("no small disk at %s: %s", directory, answer.stderr.strip())
            return None
        disk = SmallDisk(directory)
        self._mounted.append(disk)
        return disk

    def close(self) -> None:
        for disk in reversed(self._mounted):
            answer = subprocess.run(
                ["umount", "--lazy", str(disk.directory)],
                capture_output=True,
                text=True,
                timeout=_MOUNT_TIMEOUT_SECONDS,
                check=False,
            )
            if answer.returncode != 0:
                _LOG.warning("%s stays mounted: %s", disk.directory, answer.stderr.strip())
        self._mounted.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

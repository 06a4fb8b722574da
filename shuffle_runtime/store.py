"""A partition store: an fsspec filesystem and a root, with paths that cannot escape it.

Local directories use native files (memory-mapped reads, or positioned reads where another
process may truncate a file under a reader: a mapped page past the new end kills the reader
with SIGBUS); every other fsspec store (``memory://``, S3, GCS, HDFS, ...) goes through
fsspec. OSErrors become :class:`StorageError` (:class:`StorageFullError` for a full store).
"""

from __future__ import annotations

import abc
import collections
import contextlib
import ctypes
import errno
import io
import mmap
import os
import resource
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, Final, Protocol

import fsspec
import pyarrow as pa
from fsspec.implementations.local import LocalFileSystem

from shuffle_api.errors import ShuffleError, StorageError, StorageFullError
from shuffle_api.ids import new_id, validate_id

__all__ = [
    "DataStream",
    "RangeReader",
    "Sender",
    "Store",
    "default_store_url",
    "storage_errors",
    "write_all",
]


def default_store_url() -> str:
    """A directory under the system temp dir, one per user."""
    return str(Path(tempfile.gettempdir()) / f"pyshuffle-{os.getuid()}")


_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def storage_errors(path: str) -> _StorageErrors:
    """Translate OSErrors (other than a missing file) into :class:`StorageError`, and a full
    store (no space, or over quota) into :class:`StorageFullError`."""
    return _StorageErrors(path)


class _StorageErrors:
    """:func:`storage_errors`'s context (a class: a generator-based one costs microseconds,
    paid on every small read)."""

    __slots__ = ("_path",)

    def __init__(self, path: str) -> None:
        self._path = path

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: object
    ) -> None:
        # A ShuffleError keeps its class (a refused push is an OSError too: PermissionError).
        if not isinstance(error, OSError) or isinstance(error, FileNotFoundError | ShuffleError):
            return
        if error.errno in _FULL:
            raise StorageFullError(
                f"no space left on the store while writing {self._path}: {error.strerror}"
            ) from error
        raise StorageError(f"store operation on {self._path} failed: {error}") from error


class Sender(Protocol):
    """Where a range is sent: a socket, or what gathers small sends for one (the same
    calls)."""

    def sendall(self, data: bytes | memoryview, /) -> None: ...

    def sendfile(self, file: io.FileIO, offset: int = 0, count: int | None = None) -> int: ...


class RangeReader(abc.ABC):
    """Reads byte ranges of one file."""

    @abc.abstractmethod
    def read_range(self, offset: int, length: int) -> pa.Buffer: ...

    @abc.abstractmethod
    def size(self) -> int:
        """The file's length as this reader sees it (a positioned or fsspec reader sees a
        truncation by another process; a memory map, its length when mapped)."""

    def read_after(self, prefix: bytes, offset: int, length: int) -> bytes:
        """``prefix`` followed by the range, as one new ``bytes`` (a message whose framing
        comes before its data); shorter if the file ends first."""
        return b"".join((prefix, self.read_range(offset, length)))

    def send_range(self, sock: Sender, offset: int, length: int) -> int:
        """Send the range to ``sock`` (within the socket's timeout); returns the bytes sent,
        fewer if the file ends first. Socket errors stay OSErrors: they are not the store's."""
        data = self.read_range(offset, length)
        sock.sendall(memoryview(data))
        return int(data.size)


_new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
_new_bytes.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
_new_bytes.restype = ctypes.py_object


def _pread_after(prefix: bytes, fd: int, offset: int, length: int) -> bytes:
    """``prefix`` and up to ``length`` bytes of ``fd`` at ``offset``, as one new bytes object
    (fewer if the file ends first).

    A large read goes straight into the bytes object returned, made as C code makes one
    (``PyBytes_FromStringAndSize(NULL, n)``, filled before anything else sees it): ``os.pread``
    and a join would copy every byte once more, a tenth of a worker's CPU time when it serves
    large fetches. A small one is read and joined: the view the other way needs costs 3 us,
    and 15 us for a size not seen before (a ctypes array type), where most blocks are small
    and of many sizes."""
    if length <= _JOINED_READ_BYTES:
        pieces = [prefix]
        while length:
            data = os.pread(fd, length, offset)
            if not data:  # the file ends early
                break
            pieces.append(data)
            offset += len(data)
            length -= len(data)
        return b"".join(pieces)
    size = len(prefix) + length
    message: bytes = _new_bytes(None, size)
    address = ctypes.cast(ctypes.c_char_p(message), ctypes.c_void_p).value
    assert address is not None
    view = memoryview((ctypes.c_char * size).from_address(address)).cast("B")
    try:
        view[: len(prefix)] = prefix
        filled = len(prefix)
        while filled < size:
            read = os.preadv(fd, [view[filled:]], offset + filled - len(prefix))
            if not read:  # the file ends early
                return message[:filled]
            filled += read
    finally:
        view.release()
    return message


_JOINED_READ_BYTES: Final = 128 << 10


class _LocalRanges(RangeReader):
    """Reads of a local file, open for as long as this reader lives (see :class:`_OpenFiles`):
    positioned reads, one copy each, and with ``mapped`` zero-copy slices of a memory map for
    ranges of at least :data:`_SMALLEST_MAPPED_READ` bytes (the buffers keep the mapping
    alive; mapped once, when the first is read). A file truncated under the reader gives short
    reads; a mapped page past its new end would kill the reader with SIGBUS, so small reads,
    most of a reducer's, never map, and a store whose files another process may truncate maps
    nothing. Threads may share one (two that map it at once each map it; one map is kept)."""

    def __init__(self, path: str, *, mapped: bool) -> None:
        self._path = path
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self._mappable = mapped
        self._mapped: pa.Buffer | None = None  # the whole file, once a large range is read
        self.used = 0.0
        """When it was last handed out (its cache's clock)."""

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)  # None where the open failed
        if fd is not None:
            os.close(fd)

    @property
    def deleted(self) -> bool:
        """Whether the file has no name left (deleted, or replaced, since it was opened)."""
        return os.fstat(self._fd).st_nlink == 0

    def read_range(self, offset: int, length: int) -> pa.Buffer:
        with storage_errors(self._path):
            if length < _SMALLEST_MAPPED_READ or not self._mappable:
                return pa.py_buffer(os.pread(self._fd, length, offset))
            mapped = self._mapped
            if mapped is None:
                # The open file, not its path: a file renamed over the path since is not it.
                size = os.fstat(self._fd).st_size
                mapping = mmap.mmap(self._fd, 0, access=mmap.ACCESS_READ) if size else b""
                mapped = self._mapped = pa.py_buffer(mapping)
            # A truncated file yields a short buffer, which fails its checksum.
            start = min(offset, mapped.size)
            return mapped.slice(start, max(0, min(length, mapped.size - start)))

    def size(self) -> int:
        with storage_errors(self._path):
            return os.fstat(self._fd).st_size

    def read_after(self, prefix: bytes, offset: int, length: int) -> bytes:
        with storage_errors(self._path):
            return _pread_after(prefix, self._fd, offset, length)

    def send_range(self, sock: Sender, offset: int, length: int) -> int:
        if not length:
            return 0  # sendfile takes no empty range
        # sendfile(2): from the page cache to the socket, no copy in this process (through
        # socket.sendfile, which keeps to the socket's timeout).
        with open(self._fd, "rb", buffering=0, closefd=False) as file:
            return int(sock.sendfile(file, offset, length))


_FileKey = tuple[str, bool]  # a file's path, and whether it is mapped


def _directories_above(path: str) -> Iterator[str]:
    """``/a/b/c`` -> ``/a/b``, ``/a``."""
    while (end := path.rfind("/")) > 0:
        path = path[:end]
        yield path


class _OpenFiles:
    """The local files this process read lately, kept open (and mapped): a Python worker's
    reducers, one after another, read a small block of each of the same map outputs, and
    opening (and mapping) each file cost more than reading its block.

    Only for files that do not change once written (partitions' data files, each attempt
    under a path of its own). A file deleted meanwhile is seen as gone when next asked for (it
    has no links left), as an open would see it. One deleted under another process's cache
    keeps its disk space until that process asks for it, evicts it (least recently used,
    past ``max_files``), finds it unused for ``max_idle`` seconds (looked for at most once a
    second, as the cache is used), or ends; a reader still reading keeps it open too."""

    def __init__(
        self, max_files: int, max_idle: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._max_files = max_files
        self._max_idle = max_idle
        self._clock = clock
        self._files: collections.OrderedDict[_FileKey, _LocalRanges] = collections.OrderedDict()
        # The keys below each directory that holds a cached file (at any depth): letting go
        # of a deleted partition's files costs its own files, not a look at every one cached.
        self._under: dict[str, set[_FileKey]] = {}
        self._lock = threading.Lock()
        self._next_expiry = 0.0

    def open(self, path: str, *, mapped: bool) -> _LocalRanges:
        """A reader of ``path``; FileNotFoundError if it is not there (any more)."""
        key = (path, mapped)
        now = self._clock()
        with self._lock:
            found = self._files.get(key)
            if found is not None:
                self._files.move_to_end(key)
                found.used = now
            if now >= self._next_expiry:
                self._expire(now)
        if found is not None:
            if not found.deleted:
                return found
            with self._lock:  # deleted since: closed once its readers are gone
                if self._files.get(key) is found:
                    self._drop(key)
        opened = _LocalRanges(path, mapped=mapped)
        opened.used = now
        with self._lock:
            if key not in self._files:
                for directory in _directories_above(path):
                    self._under.setdefault(directory, set()).add(key)
            self._files[key] = opened
            self._files.move_to_end(key)
            while len(self._files) > self._max_files:
                self._drop(next(iter(self._files)))
        return opened

    def _expire(self, now: float) -> None:
        self._next_expiry = now + 1.0
        while self._files:
            key, oldest = next(iter(self._files.items()))
            if now - oldest.used <= self._max_idle:
                return
            self._drop(key)

    def _drop(self, key: _FileKey) -> None:
        """Forget the file (under the lock)."""
        del self._files[key]
        for directory in _directories_above(key[0]):
            below = self._under[directory]
            below.discard(key)
            if not below:
                del self._under[directory]

    def forget_under(self, directory: str) -> None:
        """Let go of the files under ``directory`` (being deleted by this process)."""
        with self._lock:
            for key in list(self._under.get(directory.rstrip("/"), ())):
                self._drop(key)

    def __len__(self) -> int:
        return len(self._files)


def _open_files_limit() -> int:
    """An eighth of the descriptors this process may open (a mapped file holds two), up to
    4,096 files."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return 128
    return 4096 if soft == resource.RLIM_INFINITY else max(16, min(4096, soft // 8))


_OPEN_FILES: Final = _OpenFiles(max_files=_open_files_limit(), max_idle=30.0)


_SMALLEST_MAPPED_READ: Final = 1 << 20
"""Smaller ranges (most of a reducer's) are read: a read of a file truncated under its
reader is short, where a mapped page past the new end would kill the reader (SIGBUS)."""
_PAST_ANY_END: Final = 1 << 62


class _FsspecRanges(RangeReader):
    """Ranged reads through fsspec (a ranged GET on object stores)."""

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str) -> None:
        self._fs = fs
        self._path = path

    def read_range(self, offset: int, length: int) -> pa.Buffer:
        if length <= 0:
            return pa.py_buffer(b"")  # no request: an object store refuses an empty range
        with storage_errors(self._path):
            try:
                data = self._fs.cat_file(self._path, start=offset, end=offset + length)
            except OSError as error:
                # S3 refuses a range that starts at or past the end (416): short, as files are.
                if error.errno != errno.EINVAL or offset < self.size():
                    raise
                data = b""
            return pa.py_buffer(data)

    def size(self) -> int:
        with storage_errors(self._path):
            return int(self._fs.size(self._path))


class DataStream(Protocol):
    """A write-only byte stream (a file opened with "wb" is one)."""

    def write(self, data: bytes | memoryview, /) -> int: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


def write_all(stream: DataStream, data: bytes | bytearray | memoryview) -> None:
    """Write all of ``data``: an unbuffered local file may take part of a buffer per call."""
    pending = memoryview(data).cast("B")
    while pending:
        written = stream.write(pending)
        if not written:
            raise StorageError(f"the store took no bytes of a {len(pending)}-byte write")
        pending = pending[written:]


def _new_local_file(path: str) -> BinaryIO:
    """A new local file, unbuffered, its directory made first where it is missing (most go
    into one that is there already: a try costs one syscall, a ``makedirs`` several)."""
    try:
        return open(path, "wb", buffering=0)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return open(path, "wb", buffering=0)


class Store:
    """The root of a store. Every path below it is built from validated ids."""

    def __init__(self, url: str, *, memory_map: bool = True) -> None:
        """``memory_map``: read local files through memory maps (zero-copy); False where a
        file may be truncated under a reader by another process."""
        self._url = url or default_store_url()
        self._memory_map = memory_map
        with storage_errors(self._url):
            self._fs, root = fsspec.core.url_to_fs(self._url)
        self._local = isinstance(self._fs, LocalFileSystem)
        # Where a range past any end reads a whole file in one request: S3's GET with a Range
        # header does; others (pyarrow's HDFS) would allocate the range first.
        protocols = self._fs.protocol
        names = {protocols} if isinstance(protocols, str) else set(protocols)
        self._ranged_whole_reads = bool(names & {"s3", "s3a"})
        self._shared = not self._local and "memory" not in names
        self._root = root.rstrip("/") or "/"
        if self._local:
            with storage_errors(self._root):
                os.makedirs(self._root, exist_ok=True)

    @classmethod
    def open_existing(cls, url: str) -> Store | None:
        """The store at ``url`` if this process sees it, else ``None`` - never creating its
        root (a consumer probing a producer's store must leave no directory behind)."""
        try:
            filesystem, root = fsspec.core.url_to_fs(url)
            if not filesystem.exists(root):
                return None
        except (OSError, ValueError, ImportError):  # unreachable, unknown protocol, no driver
            return None
        return cls(url)

    @property
    def url(self) -> str:
        return self._url

    @property
    def filesystem(self) -> fsspec.AbstractFileSystem:
        return self._fs

    @property
    def is_local(self) -> bool:
        return self._local

    @property
    def is_shared(self) -> bool:
        """Whether what is written here outlives the writing process and its host, seen alike
        by every host: an object store or a remote file system (not a local directory, which
        this process cannot tell from a shared mount, nor ``memory://``, which is its own)."""
        return self._shared

    def free_bytes(self) -> int | None:
        """Bytes free on the file system of a local store (None for other stores)."""
        if not self._local:
            return None
        with storage_errors(self._root):
            return shutil.disk_usage(self._root).free

    def path(self, *parts: str) -> str:
        """``root/part/...``: each part must be a valid id (no separators, no ``..``)."""
        for part in parts:
            validate_id(part, "path component")
        return "/".join((self._root.rstrip("/"), *parts))

    def child(self, directory: str, name: str) -> str:
        validate_id(name, "file name")
        return f"{directory}/{name}"

    def open_output(self, path: str) -> BinaryIO:
        """A new file for writing. Local files are unbuffered: pyarrow hands over large buffers,
        and a second copy through a Python buffer would cost as much as the write itself."""
        with storage_errors(path):
            if self._local:
                return _new_local_file(path)
            self._fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            file: BinaryIO = self._fs.open(path, "wb")
            return file

    def open_ranges(self, path: str) -> RangeReader:
        """A reader of byte ranges of ``path``; raises FileNotFoundError if it is missing (on
        an object store, its reads do: a request to look first would double a reducer's)."""
        with storage_errors(path):
            if self._local:
                return _OPEN_FILES.open(path, mapped=self._memory_map)
            return _FsspecRanges(self._fs, path)

    def read_bytes(self, path: str) -> bytes:
        with storage_errors(path):
            if self._local:  # a few syscalls, where fsspec's file object costs tens of us
                with open(path, "rb") as file:
                    return file.read()
            if self._ranged_whole_reads:
                # A range past any end: one GET (s3fs asks for the object's size first).
                return bytes(self._fs.cat_file(path, start=0, end=_PAST_ANY_END))
            return bytes(self._fs.cat_file(path))

    @property
    def maps_files(self) -> bool:
        """Whether :meth:`map_bytes` maps files (local, memory-mapped) rather than reads them."""
        return self._local and self._memory_map

    def map_bytes(self, path: str) -> pa.Buffer:
        """A whole file, memory-mapped where :attr:`maps_files` (its pages shared with every
        process that reads it, none of them this process's own memory), else read."""
        with storage_errors(path):
            if self.maps_files:
                mapped = pa.memory_map(path)
                return mapped.read_buffer(mapped.size())
        return pa.py_buffer(self.read_bytes(path))

    def put(self, path: str, data: bytes) -> None:
        """Write ``data`` as the whole of ``path``, not atomically: for a file that a later
        atomic one (a commit point) makes visible to readers."""
        with storage_errors(path):
            if self._local:
                with _new_local_file(path) as handle:
                    write_all(handle, data)
            else:
                self._fs.pipe_file(path, data)

    def put_atomic(self, path: str, data: bytes) -> None:
        """Write ``data`` so that a reader sees either nothing or all of it."""
        with storage_errors(path):
            if self._local:
                temporary = f"{path}.{new_id()}.tmp"
                try:
                    with _new_local_file(temporary) as handle:
                        write_all(handle, data)
                    os.replace(temporary, path)
                except BaseException:
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(temporary)
                    raise
            else:
                # One PUT: object stores (and memory://) publish it whole or not at all.
                self._fs.pipe_file(path, data)

    def exists(self, path: str) -> bool:
        with storage_errors(path):
            if self._local:  # one stat, where fsspec's info costs tens of us
                return os.path.exists(path)
            return bool(self._fs.exists(path))

    def size(self, path: str) -> int:
        with storage_errors(path):
            return int(self._fs.size(path))

    def delete_tree(self, path: str, *, empty_parents: int = 0) -> None:
        """Remove ``path`` and everything below it (a missing path is fine), then up to
        ``empty_parents`` of its parent directories that are left empty."""
        if self._local:
            _OPEN_FILES.forget_under(path)
        try:
            with storage_errors(path):
                self._fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass
        for _ in range(empty_parents):
            path = path.rsplit("/", 1)[0]
            if len(path) <= len(self._root):
                return
            try:
                self._fs.rmdir(path)
            except OSError:  # not empty (or, on object stores, no directories to remove)
                return

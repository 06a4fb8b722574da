"""The options the contract itself owns; implementations declare their own."""

from __future__ import annotations

from typing import Any, Final

from shuffle_api.config import (
    HOST_CONFIG_FILE,
    ConfigOption,
    choice_option,
    int_option,
    memory_option,
    str_option,
)

__all__ = [
    "COMPRESSION_AUTO_BANDWIDTH",
    "COMPRESSION_CODEC",
    "CORE_OPTIONS",
    "DEFAULT_FACTORY",
    "HOST_CONFIG_FILE",
    "READ_SOURCES_IN_FLIGHT",
    "READ_STORE_AHEAD_SIZE",
    "READ_STORE_THREADS",
    "SHUFFLE_SERVICE_FACTORY_CLASS",
    "TARGET_BATCH_SIZE",
]

DEFAULT_FACTORY: Final = "netty_like"
"""The service pyshuffle's own distribution registers as its default (in process, no daemon)."""

SHUFFLE_SERVICE_FACTORY_CLASS = str_option(
    "shuffle-service-factory.class",
    DEFAULT_FACTORY,
    "The ShuffleServiceFactory to use: an installed service's name (entry point group"
    " pyshuffle.services: netty_like, external_shuffle, ...) or a class path (pkg.mod.Class or"
    " pkg.mod:Class).",
)

COMPRESSION_CODEC = choice_option(
    "shuffle.compression.codec",
    "auto",
    "Arrow IPC buffer compression of stored and sent partition data; auto: per partition, the"
    " codec that saves more time than it costs on its first batch (or none).",
    ("auto", "none", "lz4", "zstd"),
)

COMPRESSION_AUTO_BANDWIDTH = memory_option(
    "shuffle.compression.auto.bandwidth",
    256 << 20,
    "Bytes per second one writer's data moves at through the slowest step it crosses (disk or"
    " network), which the auto codec weighs a byte saved against; lower it on slow links.",
    minimum=1 << 20,
)

TARGET_BATCH_SIZE = memory_option(
    "shuffle.batch.target-size",
    4 << 20,
    "Written batches are cut to about this many bytes, bounding every message and buffer.",
    minimum=1024,
)

READ_SOURCES_IN_FLIGHT = int_option(
    "shuffle.read.sources-in-flight",
    2,
    "Sources (producers' data ports, workers) a reader has a request open to at once: while it"
    " reads one source's blocks, the next ones are asked already and answer into their"
    " connections, each within what the connection holds (socket buffers, or the reader's"
    " credit); 1: one source at a time.",
    minimum=1,
)

READ_STORE_THREADS = int_option(
    "shuffle.read.store-threads",
    8,
    "Threads of a process that read blocks from a shared store (an object store) ahead of its"
    " reducers, several requests at once: each request's round trip would otherwise add up.",
    minimum=1,
)

READ_STORE_AHEAD_SIZE = memory_option(
    "shuffle.read.store-ahead-size",
    64 << 20,
    "Bytes a reducer holds read from a shared store ahead of what it decodes (besides the"
    " block it waits for, whatever its size).",
    minimum=1 << 20,
)

CORE_OPTIONS: Final[tuple[ConfigOption[Any], ...]] = (
    SHUFFLE_SERVICE_FACTORY_CLASS,
    COMPRESSION_CODEC,
    COMPRESSION_AUTO_BANDWIDTH,
    TARGET_BATCH_SIZE,
    READ_SOURCES_IN_FLIGHT,
    READ_STORE_THREADS,
    READ_STORE_AHEAD_SIZE,
    HOST_CONFIG_FILE,
)

"""Options of the external shuffle service (keys under ``external-shuffle.``): the client's, the
daemon's, and the security ones both sides share."""

from __future__ import annotations

from typing import Any, Final

from shuffle_api import ConfigError
from shuffle_api.config import (
    ConfigOption,
    Configuration,
    bool_option,
    choice_option,
    float_option,
    int_option,
    memory_option,
    str_option,
)
from shuffle_api.plugins import OptionCatalog, OptionRole

__all__ = [
    "APPLICATION_CREDENTIAL",
    "APPLICATION_CREDENTIAL_LIFETIME",
    "APPLICATION_TIMEOUT",
    "AUTH_TOKEN",
    "AUTH_TOKEN_FILE",
    "BIND_HOST",
    "CLIENT_APPLICATION",
    "CLIENT_CATALOG",
    "CLIENT_HEARTBEAT_INTERVAL",
    "CLIENT_OPTIONS",
    "CLIENT_RETRY_TIMEOUT",
    "CLIENT_TIMEOUT",
    "COORDINATOR_ADDRESS",
    "COORDINATOR_PORT",
    "COORDINATOR_STATUS_PORT",
    "DAEMON_CATALOG",
    "DAEMON_OPTIONS",
    "LOG_FORMAT",
    "LOG_LEVEL",
    "LOG_LEVELS",
    "MAX_IN_FLIGHT",
    "MAX_MESSAGE_SIZE",
    "METRICS_PORT",
    "MIN_CHUNK_SIZE",
    "PLACEMENT",
    "PUSH_CHUNK_SIZE",
    "READ_FROM_STORE",
    "REPLICATION_FACTOR",
    "SHUTDOWN_GRACE",
    "SORT_BUFFER_SIZE",
    "TLS_CA_FILE",
    "TLS_CERT_FILE",
    "TLS_KEY_FILE",
    "USE_DATA_PORT",
    "WORKER_ADVERTISED_HOST",
    "WORKER_APPLICATION_QUOTA",
    "WORKER_DATA_PORT",
    "WORKER_HEARTBEAT_INTERVAL",
    "WORKER_MAX_STREAMS",
    "WORKER_MAX_STREAMS_PER_PEER",
    "WORKER_MEMORY_BUDGET",
    "WORKER_MEMORY_BUDGET_TIMEOUT",
    "WORKER_PORT",
    "WORKER_STORE_SHARED",
    "WORKER_STORE_URL",
    "WORKER_STREAM_IDLE_TIMEOUT",
    "WORKER_TIER_HIGH_WATER",
    "WORKER_TIER_URL",
    "WORKER_TIMEOUT",
    "coordinator_addresses",
    "message_chunk_size",
    "message_data_limit",
]

# --- both sides ------------------------------------------------------------------------------

COORDINATOR_ADDRESS = str_option(
    "external-shuffle.coordinator.address",
    "127.0.0.1:9097",
    "host:port of the coordinator, or of several side by side, separated by commas. Workers"
    " register with each; clients use the first that answers and keep every one informed,"
    " so any of them may restart. The coordinator role listens on the port of the one"
    " address (with several, set coordinator.port).",
)
AUTH_TOKEN = str_option(
    "external-shuffle.auth.token",
    "",
    "Shared secret every call carries (prefer auth.token-file, or the environment variable"
    " PYSHUFFLE_EXTERNAL_SHUFFLE_AUTH_TOKEN, to keeping it in a file of options).",
)
AUTH_TOKEN_FILE = str_option(
    "external-shuffle.auth.token-file",
    "",
    "File holding the shared secret (e.g. a mounted Kubernetes Secret); wins over auth.token.",
)
TLS_CERT_FILE = str_option(
    "external-shuffle.tls.cert-file",
    "",
    "Daemon: PEM certificate chain to serve TLS with (with tls.key-file); empty: plaintext.",
)
TLS_KEY_FILE = str_option(
    "external-shuffle.tls.key-file", "", "Daemon: PEM private key of tls.cert-file."
)
TLS_CA_FILE = str_option(
    "external-shuffle.tls.ca-file",
    "",
    "PEM CA bundle that signs the daemons' certificates; set: clients and workers connect with"
    " TLS.",
)
MAX_MESSAGE_SIZE = memory_option(
    "external-shuffle.max-message-size",
    16 << 20,
    "Largest gRPC message sent or accepted; larger ones are rejected (RESOURCE_EXHAUSTED).",
    minimum=128 << 10,
)

# --- client (driver and executors) -----------------------------------------------------------

SORT_BUFFER_SIZE = memory_option(
    "external-shuffle.client.sort-buffer.size",
    64 << 20,
    "Memory a writer holds to sort its rows by subpartition: it pushes a region of half this in"
    " the background while the next half fills (pushed bytes waiting for a worker count"
    " apart, up to max-in-flight).",
    minimum=1,
)
MIN_CHUNK_SIZE: Final = 4 << 10
"""The smallest chunk of data a message carries (pushed, or fetched when a client asks)."""
PUSH_CHUNK_SIZE = memory_option(
    "external-shuffle.client.chunk-size",
    1 << 20,
    "Bytes per pushed message (kept below max-message-size). A fetch sends each run in one"
    " message when it fits below max-message-size, and longer runs in chunks of that size.",
    minimum=MIN_CHUNK_SIZE,
)
MAX_IN_FLIGHT = memory_option(
    "external-shuffle.client.max-in-flight",
    8 << 20,
    "Pushed bytes a writer lets wait for a worker before it blocks (backpressure).",
    minimum=4 << 10,
)
REPLICATION_FACTOR = int_option(
    "external-shuffle.replication-factor",
    2,
    "Workers each partition is pushed to (all live ones when fewer). 2: a worker that dies"
    " loses nothing, reads fail over to the replica; 1: half the bytes pushed and stored, and"
    " a worker lost during a reduce fails the action (recover() reruns its producers).",
    minimum=1,
)
READ_FROM_STORE = bool_option(
    "external-shuffle.client.read-from-store",
    True,
    "Read partitions straight from a worker's store when its descriptor says the store is"
    " shared (no worker in the path); false: always fetch from the worker.",
)
USE_DATA_PORT = bool_option(
    "external-shuffle.client.use-data-port",
    True,
    "Fetch from a worker's data port when it has one (no gRPC framing, the worker sends with"
    " sendfile); false: always over gRPC. A data port that cannot be reached is fetched from"
    " over gRPC.",
)
CLIENT_TIMEOUT = float_option(
    "external-shuffle.client.timeout",
    30.0,
    "Seconds a client waits for a coordinator or worker call (and for an unknown descriptor);"
    " the daemon's own calls (heartbeats, the coordinator's health checks of workers) too.",
    minimum=0.1,
)
CLIENT_RETRY_TIMEOUT = float_option(
    "external-shuffle.client.retry-timeout",
    60.0,
    "Seconds a client keeps retrying, with backoff, while no coordinator answers: a"
    " coordinator restarting is ridden through, not failed at once (workers keep trying).",
    minimum=0.0,
)
CLIENT_APPLICATION = str_option(
    "external-shuffle.client.application",
    "",
    "Set by the driver's shuffle master in its tasks' configuration, not by users: the"
    " application the partitions its producers place belong to. The coordinator keeps them"
    " while the application lives, however long its map stage runs.",
)
CLIENT_HEARTBEAT_INTERVAL = float_option(
    "external-shuffle.client.heartbeat-interval",
    5.0,
    "Seconds between the driver's application heartbeats (which also bring lost partitions).",
    minimum=0.05,
)

# --- daemon ----------------------------------------------------------------------------------

BIND_HOST = str_option(
    "external-shuffle.daemon.bind-host",
    "127.0.0.1",
    "Interface the daemon's gRPC and metrics ports bind to (0.0.0.0: every interface).",
)
METRICS_PORT = int_option(
    "external-shuffle.daemon.metrics-port",
    9099,
    "Port of the Prometheus metrics endpoint; 0 picks a free one, -1 serves none.",
    minimum=-1,
)
SHUTDOWN_GRACE = float_option(
    "external-shuffle.daemon.shutdown-grace",
    30.0,
    "Seconds in-flight streams get to finish after SIGTERM before the daemon exits.",
    minimum=0.0,
)
LOG_FORMAT = choice_option(
    "external-shuffle.daemon.log-format",
    "json",
    "Daemon log lines on stderr: one JSON object per line, or plain text.",
    ("json", "text"),
)
LOG_LEVELS: Final = ("debug", "info", "warning", "error")
LOG_LEVEL = choice_option(
    "external-shuffle.daemon.log-level",
    "info",
    "Least level of the daemon's log lines (`pyshuffle daemon --log-level` wins over it).",
    LOG_LEVELS,
)
WORKER_PORT = int_option(
    "external-shuffle.worker.port",
    9098,
    "gRPC port of the worker role; 0 picks a free one.",
    minimum=0,
)
WORKER_DATA_PORT = int_option(
    "external-shuffle.worker.data-port",
    9095,
    "Port of the worker's data port: fetches over a plain TCP connection, sent from the page"
    " cache with sendfile(2) and authenticated with the token; 0 picks a free one (a restarted"
    " worker is then fetched from over gRPC), -1 turns it off. With TLS configured it speaks"
    " TLS with the same certificate (and sends through the worker's process, not sendfile).",
    minimum=-1,
)
WORKER_ADVERTISED_HOST = str_option(
    "external-shuffle.worker.advertised-host",
    "",
    "Host clients use to reach this worker; empty: the bind host, or this machine's name when"
    " binding every interface.",
)
WORKER_STORE_URL = str_option(
    "external-shuffle.worker.store-url",
    "",
    "fsspec URL of the worker's partition store; empty: a directory in the temp dir.",
)
WORKER_STORE_SHARED = bool_option(
    "external-shuffle.worker.store-shared",
    False,
    "The store is shared with the clients (object store, shared file system): descriptors let"
    " them read committed partitions straight from it.",
)
WORKER_TIER_URL = str_option(
    "external-shuffle.worker.tier-url",
    "",
    "fsspec URL of a shared store (s3://bucket/prefix) the worker moves committed partitions"
    " to: past tier-high-water, and all of them on decommission. A moved partition outlives"
    " the worker; clients that cannot reach the worker read it there (they need the store's"
    " credentials), and so does the coordinator to answer for it. Empty: no tier.",
)
WORKER_TIER_HIGH_WATER = memory_option(
    "external-shuffle.worker.tier-high-water",
    0,
    "With a tier-url: stored bytes past which the worker moves its oldest committed"
    " partitions to the tier until 80% of this is left; 0: only on decommission.",
    minimum=0,
)
WORKER_MEMORY_BUDGET = memory_option(
    "external-shuffle.worker.memory-budget",
    256 << 20,
    "Pushed bytes a worker holds in memory at once; pushes wait (backpressure) beyond it.",
    minimum=64 << 10,
)
WORKER_APPLICATION_QUOTA = memory_option(
    "external-shuffle.worker.application-quota",
    0,
    "Bytes one application may hold on this worker, pushed and committed; a push past it fails"
    " with QuotaExceededError and what it wrote of its partition is deleted. 0: no quota.",
    minimum=0,
)
WORKER_STREAM_IDLE_TIMEOUT = float_option(
    "external-shuffle.worker.stream-idle-timeout",
    30.0,
    "Seconds a push or fetch stream may move no message before the worker cancels it (a silent"
    " client frees its handler thread); an upload with no stream for as long is deleted.",
    minimum=0.1,
)
WORKER_MAX_STREAMS = int_option(
    "external-shuffle.worker.max-streams",
    48,
    "Push and fetch streams a worker has open at most; more are refused with"
    " RESOURCE_EXHAUSTED. 16 more handler threads serve health checks, commits and status.",
    minimum=1,
)
WORKER_MAX_STREAMS_PER_PEER = int_option(
    "external-shuffle.worker.max-streams-per-peer",
    32,
    "Push and fetch streams one client host has open on a worker at most.",
    minimum=1,
)
WORKER_MEMORY_BUDGET_TIMEOUT = float_option(
    "external-shuffle.worker.memory-budget-timeout",
    60.0,
    "Seconds a push waits for room in the memory budget before it fails with"
    " RESOURCE_EXHAUSTED (the client then sees a DataTooLargeError).",
    minimum=0.1,
)
WORKER_HEARTBEAT_INTERVAL = float_option(
    "external-shuffle.worker.heartbeat-interval",
    2.0,
    "Seconds between a worker's heartbeats to the coordinator.",
    minimum=0.05,
)
WORKER_TIMEOUT = float_option(
    "external-shuffle.coordinator.worker-timeout",
    10.0,
    "A worker silent this long is dead: its partitions are reported lost to their jobs.",
    minimum=0.1,
)
APPLICATION_TIMEOUT = float_option(
    "external-shuffle.coordinator.application-timeout",
    120.0,
    "An application silent this long expired: its partitions are deleted. Partitions placed by"
    " producers but claimed by no job are deleted after the same time.",
    minimum=0.1,
)
APPLICATION_CREDENTIAL_LIFETIME = float_option(
    "external-shuffle.coordinator.application-credential-lifetime",
    7 * 86_400.0,
    "Seconds an application's credential, issued when it registers, holds: set it above the"
    " longest application's run (its calls are refused past it).",
    minimum=60.0,
)
APPLICATION_CREDENTIAL = str_option(
    "external-shuffle.client.application-credential",
    "",
    "The credential a coordinator issued to this application (its driver sets it for its"
    " executors): used in place of the token, it reaches that application's partitions only.",
)
COORDINATOR_PORT = int_option(
    "external-shuffle.coordinator.port",
    0,
    "Port the coordinator role listens on; 0: the port of coordinator.address (which must"
    " then name one coordinator).",
    minimum=0,
)
COORDINATOR_STATUS_PORT = int_option(
    "external-shuffle.coordinator.status-port",
    -1,
    "Port of the coordinator's status page (HTTP; the token, or an operator's credential, is the"
    " password); 0 picks a free"
    " one, -1 serves none.",
    minimum=-1,
)
PLACEMENT = choice_option(
    "external-shuffle.coordinator.placement",
    "balanced",
    "How partitions are placed: balanced (least loaded worker by bytes, then partitions) or"
    " local-preferred (a worker on the producer's host, else balanced).",
    ("balanced", "local-preferred"),
)

_SHARED: Final[tuple[ConfigOption[Any], ...]] = (
    COORDINATOR_ADDRESS,
    AUTH_TOKEN,
    AUTH_TOKEN_FILE,
    TLS_CA_FILE,
    MAX_MESSAGE_SIZE,
)
CLIENT_OPTIONS: Final[tuple[ConfigOption[Any], ...]] = (
    *_SHARED,
    SORT_BUFFER_SIZE,
    PUSH_CHUNK_SIZE,
    MAX_IN_FLIGHT,
    REPLICATION_FACTOR,
    READ_FROM_STORE,
    USE_DATA_PORT,
    CLIENT_TIMEOUT,
    CLIENT_RETRY_TIMEOUT,
    CLIENT_HEARTBEAT_INTERVAL,
    CLIENT_APPLICATION,
    APPLICATION_CREDENTIAL,
)
DAEMON_OPTIONS: Final[tuple[ConfigOption[Any], ...]] = (
    *_SHARED,
    TLS_CERT_FILE,
    TLS_KEY_FILE,
    PUSH_CHUNK_SIZE,
    CLIENT_TIMEOUT,
    BIND_HOST,
    METRICS_PORT,
    SHUTDOWN_GRACE,
    LOG_FORMAT,
    LOG_LEVEL,
    WORKER_PORT,
    WORKER_DATA_PORT,
    WORKER_ADVERTISED_HOST,
    WORKER_STORE_URL,
    WORKER_STORE_SHARED,
    WORKER_TIER_URL,
    WORKER_TIER_HIGH_WATER,
    WORKER_MEMORY_BUDGET,
    WORKER_MEMORY_BUDGET_TIMEOUT,
    WORKER_APPLICATION_QUOTA,
    WORKER_STREAM_IDLE_TIMEOUT,
    WORKER_MAX_STREAMS,
    WORKER_MAX_STREAMS_PER_PEER,
    WORKER_HEARTBEAT_INTERVAL,
    WORKER_TIMEOUT,
    APPLICATION_TIMEOUT,
    APPLICATION_CREDENTIAL_LIFETIME,
    COORDINATOR_PORT,
    COORDINATOR_STATUS_PORT,
    PLACEMENT,
)


def coordinator_addresses(configuration: Configuration) -> tuple[str, ...]:
    """The coordinators' ``host:port`` addresses, in the order given."""
    value = configuration.get(COORDINATOR_ADDRESS)
    addresses = tuple(part.strip() for part in value.split(",") if part.strip())
    for address in addresses:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(
                f"{COORDINATOR_ADDRESS.key} = {value!r}: {address!r} is not host:port"
            )
    if not addresses:
        raise ConfigError(f"{COORDINATOR_ADDRESS.key} names no coordinator")
    return addresses


_MESSAGE_OVERHEAD = 64 << 10  # room for a data message's other fields


def message_data_limit(configuration: Configuration) -> int:
    """The most data bytes one message carries: ``max-message-size`` less room for the
    message's other fields (never 0: the size's minimum leaves room)."""
    return configuration.get(MAX_MESSAGE_SIZE) - _MESSAGE_OVERHEAD


def message_chunk_size(configuration: Configuration) -> int:
    """Data bytes per pushed message: ``client.chunk-size``, kept within
    :func:`message_data_limit`."""
    return min(configuration.get(PUSH_CHUNK_SIZE), message_data_limit(configuration))


CLIENT_CATALOG = OptionCatalog("external service, clients", OptionRole.SERVICE, CLIENT_OPTIONS)
DAEMON_CATALOG = OptionCatalog("external service, daemon", OptionRole.DAEMON, DAEMON_OPTIONS)

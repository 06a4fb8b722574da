"""Options of the netty_like service (keys under ``netty-like.``)."""

from __future__ import annotations

from typing import Any, Final

from shuffle_api.config import (
    ConfigOption,
    Configuration,
    bool_option,
    float_option,
    host_local,
    int_option,
    memory_option,
    str_option,
)
from shuffle_api.errors import ConfigError
from shuffle_api.plugins import OptionCatalog, OptionRole
from shuffle_runtime.tls import TlsFiles

__all__ = [
    "DATA_PORT_ENABLED",
    "DATA_PORT_HOST",
    "DATA_PORT_PORT",
    "IDLE_TIMEOUT",
    "INITIAL_CREDIT",
    "MAX_CREDIT",
    "MAX_FRAME_SIZE",
    "NETTY_CATALOG",
    "NETTY_OPTIONS",
    "PARTITION_REQUEST_TIMEOUT",
    "PIPELINED_SUBPARTITION_BUFFER",
    "READ_FROM_SHARED_STORE",
    "SORT_BUFFER_SIZE",
    "STORAGE_URL",
    "TLS_CA_FILE",
    "TLS_CERT_FILE",
    "TLS_CHECK_HOSTNAME",
    "TLS_KEY_FILE",
    "tls_files",
]

STORAGE_URL = host_local(
    str_option(
        "netty-like.storage.url",
        "",
        "fsspec URL under which blocking partitions are written; empty: a directory in the"
        " temp dir (under PySpark, the executor's Spark local directory). An object store"
        " (s3://, gs://, ...; the same URL on every executor) is shared: its partitions"
        " outlive their executors (docs/cluster.md).",
    )
)
SORT_BUFFER_SIZE = host_local(
    memory_option(
        "netty-like.sort-buffer.size",
        64 << 20,
        "Memory a blocking-partition writer holds: it spills a region of half this to the"
        " store in the background while the next half fills.",
        minimum=1,
    )
)
PIPELINED_SUBPARTITION_BUFFER = host_local(
    memory_option(
        "netty-like.pipelined.subpartition-buffer",
        8 << 20,
        "Bytes queued per pipelined subpartition before the producer blocks (backpressure).",
        minimum=1,
    )
)
DATA_PORT_ENABLED = bool_option(
    "netty-like.data-port.enabled",
    True,
    "Serve partitions to other processes over TCP; false: local consumers only.",
)
DATA_PORT_HOST = host_local(
    str_option(
        "netty-like.data-port.host",
        "",
        "Address the data port binds to and advertises to consumers; empty: the host the"
        " environment runs on (under PySpark, the address Spark uses for the executor).",
    )
)
DATA_PORT_PORT = int_option(
    "netty-like.data-port.port", 0, "TCP port of the data port; 0 picks a free one.", minimum=0
)
INITIAL_CREDIT = int_option(
    "netty-like.network.initial-credit",
    2,
    "Buffers a consumer grants a remote channel up front (Flink's exclusive buffers).",
    minimum=1,
)
MAX_CREDIT = int_option(
    "netty-like.network.max-credit",
    8,
    "Most buffers a consumer grants one channel when the producer reports a backlog.",
    minimum=1,
)
MAX_FRAME_SIZE = memory_option(
    "netty-like.network.max-frame-size",
    64 << 20,
    "Largest frame sent or accepted on the data port.",
    minimum=1024,
)
PARTITION_REQUEST_TIMEOUT = float_option(
    "netty-like.network.partition-request-timeout",
    30.0,
    "Seconds a consumer waits for a pipelined partition to be created or an unknown descriptor"
    " to be updated.",
    minimum=0.0,
)
CONNECT_RETRIES = int_option(
    "netty-like.network.connect-retries",
    3,
    "Times a consumer connects again to a producer's data port that refused or did not answer"
    " (as Spark's shuffle client retries a fetch), before the partition counts as lost.",
    minimum=0,
)
CONNECT_RETRY_WAIT = float_option(
    "netty-like.network.connect-retry-wait",
    1.0,
    "Seconds between those connection attempts.",
    minimum=0.0,
)
IDLE_TIMEOUT = float_option(
    "netty-like.data-port.idle-timeout",
    120.0,
    "Seconds a data-port connection with no open channel may send nothing (or stop in the"
    " middle of a frame) before the data port closes it.",
    minimum=0.1,
)

READ_FROM_SHARED_STORE = bool_option(
    "netty-like.read-from-shared-store",
    True,
    "Read another process's blocking partitions straight from the store where this process sees"
    " their files (they then outlive the producer); false: always through its data port.",
)

TLS_CERT_FILE = host_local(
    str_option(
        "netty-like.tls.cert-file",
        "",
        "PEM certificate chain the data ports serve TLS with (with tls.key-file and"
        " tls.ca-file); empty: plaintext. Set on every process of the application, as Spark's"
        " spark.ssl.* settings are (docs/cluster.md).",
    )
)
TLS_KEY_FILE = host_local(
    str_option("netty-like.tls.key-file", "", "PEM private key of tls.cert-file.")
)
TLS_CA_FILE = host_local(
    str_option(
        "netty-like.tls.ca-file",
        "",
        "PEM certificate of the authority that signed every data port's certificate: what"
        " consumers and the driver trust.",
    )
)
TLS_CHECK_HOSTNAME = bool_option(
    "netty-like.tls.check-hostname",
    True,
    "A data port's certificate must name the address it is reached at; false: any"
    " certificate the authority signed (executors whose addresses are not known in advance,"
    " as pods').",
)

NETTY_OPTIONS: Final[tuple[ConfigOption[Any], ...]] = (
    STORAGE_URL,
    SORT_BUFFER_SIZE,
    PIPELINED_SUBPARTITION_BUFFER,
    DATA_PORT_ENABLED,
    DATA_PORT_HOST,
    DATA_PORT_PORT,
    IDLE_TIMEOUT,
    INITIAL_CREDIT,
    CONNECT_RETRIES,
    CONNECT_RETRY_WAIT,
    MAX_CREDIT,
    MAX_FRAME_SIZE,
    PARTITION_REQUEST_TIMEOUT,
    READ_FROM_SHARED_STORE,
    TLS_CERT_FILE,
    TLS_KEY_FILE,
    TLS_CA_FILE,
    TLS_CHECK_HOSTNAME,
)


def tls_files(configuration: Configuration) -> TlsFiles:
    """The TLS files configured (none: plaintext); a ConfigError unless all three are set,
    since every process of the application serves, or fetches, or both."""
    files = TlsFiles(
        cert_file=configuration.get(TLS_CERT_FILE),
        key_file=configuration.get(TLS_KEY_FILE),
        ca_file=configuration.get(TLS_CA_FILE),
        check_hostname=configuration.get(TLS_CHECK_HOSTNAME),
    )
    if files.enabled and not (files.cert_file and files.key_file and files.ca_file):
        raise ConfigError(
            f"TLS on the data ports needs {TLS_CERT_FILE.key}, {TLS_KEY_FILE.key} and"
            f" {TLS_CA_FILE.key}, all three"
        )
    return files


NETTY_CATALOG = OptionCatalog("default service (netty_like)", OptionRole.SERVICE, NETTY_OPTIONS)

"""What encryption costs a fetch: the data ports with TLS beside plaintext, and beside gRPC with
TLS (the only encrypted path the external service had before), in one run.

Setup, untimed: ``--megabytes`` of the shared benchmark data (``common.random_batches``) are
written as ``--partitions`` partitions of ``--subpartitions`` subpartitions, each once per
service and setting below. Each mode then reads every partition whole through an input gate
of another environment in this process, ``--repeat`` times after one warm-up round; a read
iterates every batch and counts its rows (checked against the rows written after the clock
stops). Throughput is the stored bytes read (the partitions' ``PartitionStatistics``) per
second, in MB/s (10**6 bytes): the median of the repetitions.

* **external service**: one LocalCluster (a coordinator and one worker daemon, its store a
  directory the client is told not to read: ``read-from-store = false``) in plaintext, and one
  with TLS on every port (a certificate for 127.0.0.1 from an authority of the run's own).
  Modes: data port plaintext (sendfile), data port TLS, gRPC TLS (``use-data-port =
  false``), and gRPC plaintext for reference.
* **default service**: two environments of one application in this process (the producer
  serves its data port, the consumer reads through it: ``read-from-shared-store = false``),
  plaintext and TLS; server and client share the interpreter.

Run from the repository root::

    python benchmarks/data_port_tls.py            # about a minute
    python benchmarks/data_port_tls.py --megabytes 64 --repeat 3

Saves ``benchmarks/results/data_port_tls.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import (
    ROW_BYTES,
    format_rows,
    machine,
    mb_per_s,
    positive,
    random_batches,
    save_results,
    subpartition_indexes,
)

from external_shuffle.local_cluster import LocalCluster
from shuffle_api import (
    Configuration,
    ShuffleDescriptor,
    ShuffleEnvironment,
    SubpartitionRange,
)
from shuffle_api.testing import ConformanceHarness, ShuffleScenario
from shuffle_runtime.tls import TlsFiles
from tests.tls_files import write_tls_files

RESULTS = Path(__file__).resolve().parent / "results" / "data_port_tls.json"


@dataclass(frozen=True, slots=True)
class Fetches:
    """One way of fetching: the stored bytes each read moved, and each read's seconds."""

    stored_bytes: int
    seconds: list[float]

    @property
    def mb_per_s(self) -> float:
        return mb_per_s(self.stored_bytes, statistics.median(self.seconds))


def _record(measured: dict[str, Fetches], name: str, fetches: Fetches) -> None:
    measured[name] = fetches
    print(f"{name}: {fetches.mb_per_s:,.0f} MB/s", flush=True)


def _tls_settings(prefix: str, files: TlsFiles, *, serving: bool) -> dict[str, object]:
    settings: dict[str, object] = {f"{prefix}.tls.ca-file": files.ca_file}
    if serving:
        settings[f"{prefix}.tls.cert-file"] = files.cert_file
        settings[f"{prefix}.tls.key-file"] = files.key_file
    return settings


@contextmanager
def _written(
    config: Mapping[str, object], args: argparse.Namespace
) -> Iterator[tuple[ShuffleScenario, list[ShuffleDescriptor], int, int]]:
    """A scenario holding the run's data as ``--partitions`` partitions; yields it, their
    descriptors, rows and stored bytes."""
    batches = random_batches(args.megabytes * 1_000_000 // ROW_BYTES, seed=34)
    configuration = Configuration.load(dict(config), environ={})
    with ShuffleScenario.open(ConformanceHarness(configuration)) as scenario:
        descriptors: list[ShuffleDescriptor] = []
        stored = 0
        for index in range(args.partitions):
            descriptor = scenario.partition_descriptor(
                index, partitions=args.partitions, subpartitions=args.subpartitions
            )
            shuffle_descriptor, writer = scenario.new_writer(descriptor)
            with writer:
                for batch in batches[index :: args.partitions]:
                    keys = batch.column("key").to_numpy()
                    writer.write(batch, subpartition_indexes(keys, args.subpartitions))
                stored += sum(writer.finish().bytes_per_subpartition)
            descriptors.append(shuffle_descriptor)
        yield scenario, descriptors, sum(batch.num_rows for batch in batches), stored


def _timed_reads(
    scenario: ShuffleScenario,
    reader: ShuffleEnvironment,
    descriptors: list[ShuffleDescriptor],
    rows: int,
    args: argparse.Namespace,
) -> list[float]:
    """Seconds of each read of every partition whole (after a warm-up read)."""
    seconds = []
    for round_number in range(-1, args.repeat):
        started = time.perf_counter()
        count = 0
        with scenario.gate(
            reader, descriptors, SubpartitionRange(0, args.subpartitions - 1)
        ) as gate:
            for batch in gate:
                count += batch.num_rows
        elapsed = time.perf_counter() - started
        if count != rows:
            raise SystemExit(f"read {count} rows of {rows}")
        if round_number >= 0:
            seconds.append(elapsed)
    return seconds


def _external(args: argparse.Namespace, directory: Path, files: TlsFiles) -> dict[str, Fetches]:
    measured: dict[str, Fetches] = {}
    for encrypted in (False, True):
        daemons = _tls_settings("external-shuffle", files, serving=True) if encrypted else {}
        with LocalCluster(
            directory / f"cluster-{encrypted}", workers=1, store_shared=False, settings=daemons
        ) as cluster:
            client = cluster.client_config(
                **{
                    "external-shuffle.client.read-from-store": False,
                    **(
                        _tls_settings("external-shuffle", files, serving=False) if encrypted else {}
                    ),
                }
            )
            with _written(client, args) as (scenario, descriptors, rows, stored):
                for transport, use_data_port in (("data port", True), ("gRPC", False)):
                    reading = Configuration.load(
                        {**client, "external-shuffle.client.use-data-port": use_data_port},
                        environ={},
                    )
                    with scenario.environment(reading) as reader:
                        name = f"external {transport} {'TLS' if encrypted else 'plaintext'}"
                        seconds = _timed_reads(scenario, reader, descriptors, rows, args)
                        _record(measured, name, Fetches(stored, seconds))
    return measured


def _netty(args: argparse.Namespace, directory: Path, files: TlsFiles) -> dict[str, Fetches]:
    measured: dict[str, Fetches] = {}
    for encrypted in (False, True):
        config = {
            "netty-like.storage.url": str(directory / f"netty-{encrypted}"),
            "netty-like.read-from-shared-store": False,
            **(_tls_settings("netty-like", files, serving=True) if encrypted else {}),
        }
        with _written(config, args) as (scenario, descriptors, rows, stored):
            name = f"default data port {'TLS' if encrypted else 'plaintext'}"
            seconds = _timed_reads(scenario, scenario.consumer, descriptors, rows, args)
            _record(measured, name, Fetches(stored, seconds))
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=positive, default=256)
    parser.add_argument("--partitions", type=positive, default=8)
    parser.add_argument("--subpartitions", type=positive, default=4)
    parser.add_argument("--repeat", type=positive, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        directory = Path(temporary)
        files = write_tls_files(directory / "tls")
        measured = {**_external(args, directory, files), **_netty(args, directory, files)}
    figures = {name: fetches.mb_per_s for name, fetches in measured.items()}
    rows = [(name, f"{figure:,.0f}") for name, figure in figures.items()]
    ratios = {
        "external_tls_data_port_vs_plaintext": figures["external data port TLS"]
        / figures["external data port plaintext"],
        "external_tls_data_port_vs_grpc_tls": figures["external data port TLS"]
        / figures["external gRPC TLS"],
        "default_tls_vs_plaintext": figures["default data port TLS"]
        / figures["default data port plaintext"],
    }
    print()
    print(format_rows(("fetch", "MB/s"), rows))
    for name, value in ratios.items():
        print(f"{name}: {value:.2f}")
    save_results(
        RESULTS,
        {
            "machine": machine(),
            "arguments": vars(args),
            "fetches": {name: asdict(fetches) for name, fetches in measured.items()},
            "mb_per_s": figures,
            "ratios": ratios,
        },
    )


if __name__ == "__main__":
    main()

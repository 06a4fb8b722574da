"""The manifest: the small JSON document that commits a partition and describes it."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa

from shuffle_api.errors import PartitionCorruptedError, UnsupportedFormatVersionError
from shuffle_api.ids import IntermediateResultPartitionID, ResultPartitionID
from shuffle_api.io import PartitionStatistics

__all__ = [
    "CODECS",
    "DATA_FILE",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "INDEX_FILE",
    "INDEX_SCHEMA",
    "MANIFEST_FILE",
    "MAX_SUBPARTITIONS",
    "NO_STATISTICS",
    "PartitionManifest",
    "without_sources",
]

FORMAT_NAME: Final = "pyshuffle-partition"
FORMAT_VERSION: Final = 2
"""2: statistics as one compressed field (``PartitionStatistics.encode``), where 1 had three
lists of numbers: a reader fetches a manifest per partition it reads, and lists of thousands
cost milliseconds to write and parse each time."""
MAX_SUBPARTITIONS: Final = 1 << 17
"""The most subpartitions a partition may have: a reader's index of runs grows with the
count, whatever was written."""
DATA_FILE: Final = "data.arrow"
INDEX_FILE: Final = "index.arrow"
MANIFEST_FILE: Final = "manifest.json"
CODECS: Final = ("none", "lz4", "zstd")
NO_STATISTICS: Final = PartitionStatistics((), (), ())
"""In a manifest read by a reader of data: statistics are 3 x R numbers, as Python ints more
work than all the rest of a manifest, and only the driver and the workers use them."""

# One row per run: consecutive batches of one subpartition (-1: broadcast to all) in one region.
INDEX_SCHEMA: Final = pa.schema(
    [
        ("subpartition", pa.int32()),
        ("region", pa.int32()),
        ("first_batch", pa.int64()),  # batch number in the data file (pa.ipc.open_file)
        ("num_batches", pa.int32()),
        ("offset", pa.int64()),  # byte range of the run's IPC messages in the data file
        ("length", pa.int64()),
        ("rows", pa.int64()),
        ("checksum", pa.uint64()),  # xxh3-64 of those bytes
    ]
)


@dataclass(frozen=True, slots=True)
class PartitionManifest:
    """Everything a reader needs before it opens the data file."""

    partition: ResultPartitionID
    number_of_subpartitions: int
    codec: str
    schema: pa.Schema | None
    statistics: PartitionStatistics
    num_regions: int
    data_bytes: int
    index_checksum: int
    format_version: int = FORMAT_VERSION
    merged_from: tuple[ResultPartitionID, ...] = ()
    """For a merged partition, the partitions (map attempts) whose runs it holds, in order."""

    def to_json(self) -> bytes:
        document: dict[str, Any] = {
            "format": FORMAT_NAME,
            "format_version": self.format_version,
            "partition": _partition_json(self.partition),
            "number_of_subpartitions": self.number_of_subpartitions,
            "codec": self.codec,
            "schema": None
            if self.schema is None
            else base64.b64encode(self.schema.serialize().to_pybytes()).decode("ascii"),
            "data_file": DATA_FILE,
            "data_bytes": self.data_bytes,
            "index_file": INDEX_FILE,
            "index_checksum": self.index_checksum,
            "checksum": "xxh3_64",
            "num_regions": self.num_regions,
        }
        if self.format_version == 1:
            document.update(_statistics_lists(self.statistics))
        else:
            document["statistics"] = base64.b64encode(self.statistics.encode()).decode("ascii")
        if self.merged_from:
            document["merged_from"] = [_partition_json(source) for source in self.merged_from]
        return json.dumps(document, indent=1).encode("utf-8")

    @classmethod
    def from_json(
        cls,
        data: bytes,
        where: str,
        partition: ResultPartitionID | None = None,
        *,
        statistics: bool = True,
    ) -> PartitionManifest:
        """The manifest in ``data``; a :class:`PartitionCorruptedError` (naming
        ``partition``, the one it should describe) if it does not decode. Without
        ``statistics``, they are neither decoded nor checked: :data:`NO_STATISTICS`."""
        try:
            document = json.loads(data)
            if not isinstance(document, dict):
                raise ValueError(f"expected a JSON object, got {type(document).__name__}")
            if document.get("format") != FORMAT_NAME:
                raise ValueError(f"format is {document.get('format')!r}, not {FORMAT_NAME!r}")
            version = int(document["format_version"])
            if version > FORMAT_VERSION or version < 1:
                raise UnsupportedFormatVersionError(
                    f"partition at {where} has format version {version};"
                    f" this pyshuffle reads 1..{FORMAT_VERSION}"
                )
            schema_text = document["schema"]
            subpartitions = int(document["number_of_subpartitions"])
            return cls(
                partition=_partition_of(document["partition"]),
                number_of_subpartitions=subpartitions,
                codec=str(document["codec"]),
                schema=None
                if schema_text is None
                else pa.ipc.read_schema(pa.py_buffer(base64.b64decode(schema_text))),
                statistics=NO_STATISTICS
                if not statistics
                else _statistics_of_lists(document)
                if version == 1
                else PartitionStatistics.decode(
                    base64.b64decode(document["statistics"], validate=True), subpartitions
                ),
                num_regions=int(document["num_regions"]),
                data_bytes=int(document["data_bytes"]),
                index_checksum=int(document["index_checksum"]),
                format_version=version,
                merged_from=tuple(map(_partition_of, document.get("merged_from", ()))),
            )
        except UnsupportedFormatVersionError:
            raise
        except (ValueError, KeyError, TypeError, pa.ArrowException) as error:
            raise PartitionCorruptedError(
                f"manifest at {where} does not decode: {error}", partition
            ) from error


def _partition_json(partition: ResultPartitionID) -> dict[str, Any]:
    return {
        "result_id": partition.partition_id.result_id,
        "partition_index": partition.partition_id.partition_index,
        "producer_attempt_id": partition.producer_attempt_id,
    }


def _partition_of(named: dict[str, Any]) -> ResultPartitionID:
    return ResultPartitionID(
        IntermediateResultPartitionID(named["result_id"], int(named["partition_index"])),
        named["producer_attempt_id"],
    )


def _statistics_lists(statistics: PartitionStatistics) -> dict[str, list[int]]:
    return {
        "rows_per_subpartition": list(statistics.rows_per_subpartition),
        "bytes_per_subpartition": list(statistics.bytes_per_subpartition),
        "arrow_bytes_per_subpartition": list(statistics.arrow_bytes_per_subpartition),
    }


def _statistics_of_lists(document: dict[str, Any]) -> PartitionStatistics:
    """Format 1's statistics."""
    return PartitionStatistics(
        tuple(map(int, document["rows_per_subpartition"])),
        tuple(map(int, document["bytes_per_subpartition"])),
        # Absent from the manifests of pyshuffle before 2026-11-26.
        tuple(map(int, document.get("arrow_bytes_per_subpartition", ()))),
    )


def without_sources(manifest: bytes) -> bytes:
    """The manifest (JSON) ``manifest`` without ``merged_from``: what a reader of a merged
    partition's rows gets, who never looks at its sources (thousands of them take hundreds
    of KB, which a reducer would receive and decode with every fetch)."""
    if b'"merged_from"' not in manifest:
        return manifest
    document = json.loads(manifest)
    document.pop("merged_from", None)
    return json.dumps(document, indent=1).encode("utf-8")

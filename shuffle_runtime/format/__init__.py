"""The on-store partition format shared by every implementation (data + index + manifest)."""

from shuffle_runtime.format.codec_choice import ipc_write_options
from shuffle_runtime.format.copy import copy_partition
from shuffle_runtime.format.layout import (
    KEY_PREFIXES,
    partition_directory,
    result_directories,
    stored_partitions,
)
from shuffle_runtime.format.manifest import FORMAT_VERSION, PartitionManifest
from shuffle_runtime.format.merge import MergedPartition, check_merge_target, merge_partitions
from shuffle_runtime.format.partition_writer import SortMergePartitionWriter
from shuffle_runtime.format.reader import (
    Layouts,
    PartitionFileReader,
    Run,
    decode_run,
    is_committed,
    is_readable,
    verify_checksum,
    verify_run,
)
from shuffle_runtime.format.sink import DataStream, PartitionSink, StoreSink, write_all
from shuffle_runtime.format.writer import PartitionFileWriter

__all__ = [
    "FORMAT_VERSION",
    "KEY_PREFIXES",
    "DataStream",
    "Layouts",
    "MergedPartition",
    "PartitionFileReader",
    "PartitionFileWriter",
    "PartitionManifest",
    "PartitionSink",
    "Run",
    "SortMergePartitionWriter",
    "StoreSink",
    "check_merge_target",
    "copy_partition",
    "decode_run",
    "ipc_write_options",
    "is_committed",
    "is_readable",
    "merge_partitions",
    "partition_directory",
    "result_directories",
    "stored_partitions",
    "verify_checksum",
    "verify_run",
    "write_all",
]

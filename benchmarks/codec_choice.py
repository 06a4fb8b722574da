"""What the ``auto`` codec sees on this machine: per kind of data, the bytes each codec keeps,
its CPU cost, the bandwidth at which it breaks even, and what ``auto`` chooses.

Each figure is the median of ``--repeat`` trials of
``shuffle_runtime.format.codec_choice.try_codecs`` on a 4 MiB batch (the writer's target batch
size), sampled as the writer samples it. The
break-even bandwidth is where ``2 * (plain - compressed) / B`` equals the cost: below it the
codec pays. Run from the repository root::

    python benchmarks/codec_choice.py
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from common import MB, format_rows, machine, positive, random_batches, save_results

from shuffle_api.options import COMPRESSION_AUTO_BANDWIDTH, TARGET_BATCH_SIZE
from shuffle_runtime.format.codec_choice import AUTO, AUTO_CANDIDATES, choose_codec, try_codecs

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results" / "codec_choice.json"
SEED = 20261126


def benchmark_rows(rows: int) -> pa.RecordBatch:
    """The throughput benchmarks' data: random key, random float, 20 random letters."""
    return pa.Table.from_batches(random_batches(rows, SEED)).combine_chunks().to_batches()[0]


def categorical_rows(rows: int) -> pa.RecordBatch:
    """Sorted keys in runs of 100, an amount with two decimals, one of five category names."""
    rng = np.random.default_rng(SEED)
    names = np.array(["books", "games", "garden", "kitchen", "music"])
    return pa.record_batch(
        [
            pa.array(np.repeat(np.arange(rows // 100 + 1, dtype=np.int64), 100)[:rows]),
            pa.array(np.round(rng.random(rows) * 100, 2)),
            pa.array(names[rng.integers(0, len(names), size=rows)]),
        ],
        names=["key", "amount", "category"],
    )


def random_bytes_rows(rows: int) -> pa.RecordBatch:
    """Random 64-bit integers and 32 random bytes: nothing to compress."""
    rng = np.random.default_rng(SEED)
    payload = pa.py_buffer(rng.integers(0, 256, size=rows * 32, dtype=np.uint8).tobytes())
    return pa.record_batch(
        [
            pa.array(rng.integers(-(2**62), 2**62, size=rows, dtype=np.int64)),
            pa.FixedSizeBinaryArray.from_buffers(pa.binary(32), rows, [None, payload]),
        ],
        names=["key", "value"],
    )


DATASETS = {
    "benchmark data (key, float, 20 random letters)": benchmark_rows,
    "categorical (sorted keys, 2-decimal amount, 5 names)": categorical_rows,
    "random bytes": random_bytes_rows,
}


def of_target_size(make: Callable[[int], pa.RecordBatch]) -> pa.RecordBatch:
    """A batch of about the writer's target size, as the writer's first run hands it over."""
    probe = make(10_000)
    rows = max(1, int(10_000 * TARGET_BATCH_SIZE.default / probe.nbytes))
    return make(rows)


def measure(batch: pa.RecordBatch, repeat: int, bandwidth: int) -> dict[str, Any]:
    codecs: dict[str, Any] = {}
    runs = [try_codecs(batch, AUTO_CANDIDATES) for _ in range(repeat)]
    for position, codec in enumerate(AUTO_CANDIDATES):
        trials = [run[position] for run in runs]
        cost = statistics.median(trial.cost_seconds for trial in trials)
        plain, compressed = trials[0].plain_bytes, trials[0].compressed_bytes
        saved = plain - compressed
        codecs[codec] = {
            "plain_bytes": plain,
            "compressed_bytes": compressed,
            "kept": compressed / plain,
            "cost_seconds": cost,
            "break_even_bytes_per_s": 2 * saved / cost if cost > 0 and saved > 0 else None,
        }
    choices = [choose_codec(AUTO, batch, bandwidth) for _ in range(repeat)]
    return {"codecs": codecs, "chosen": max(set(choices), key=choices.count), "choices": choices}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=positive, default=7, help="trials (median reported)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="JSON results file")
    args = parser.parse_args(argv)
    bandwidth = COMPRESSION_AUTO_BANDWIDTH.default
    results = {
        name: measure(of_target_size(make), args.repeat, bandwidth)
        for name, make in DATASETS.items()
    }

    rows = []
    for name, result in results.items():
        cells = [name]
        for codec in AUTO_CANDIDATES:
            figures = result["codecs"][codec]
            even = figures["break_even_bytes_per_s"]
            cells.append(
                f"{figures['kept']:.0%} kept, {figures['cost_seconds'] * 1e3:.2f} ms, break-even"
                + (f" {even / MB:,.0f} MB/s" if even else " never")
            )
        cells.append(result["chosen"])
        rows.append(cells)
    print(
        f"trials of {AUTO_CANDIDATES} on samples of the first batch, median of {args.repeat};"
        f" auto at {bandwidth / MB:.0f} MB/s (shuffle.compression.auto.bandwidth)"
    )
    print(format_rows(("data", *AUTO_CANDIDATES, "auto chooses"), rows))
    save_results(
        args.output,
        {
            "benchmark": "codec_choice",
            "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "parameters": {"repeat": args.repeat, "bandwidth_bytes_per_s": bandwidth},
            "environment": machine(pyarrow=pa.__version__, numpy=np.__version__),
            "results": results,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``shuffle_runtime.format.codec_choice``: the ``auto`` codec's rule and its measured trial."""

from __future__ import annotations

import itertools

import pytest

from shuffle_runtime.format.codec_choice import CodecTrial, choose_codec, try_codecs
from tests.unit.shuffle_runtime.format.compressibility import MIB, compressible, incompressible


def ticking_clock(step: float) -> itertools.count[float]:
    return itertools.count(0.0, step)


def test_the_rule_weighs_bytes_saved_twice_against_the_cpu_they_cost() -> None:
    trial = CodecTrial("lz4", plain_bytes=1_000_000, compressed_bytes=400_000, cost_seconds=0.001)

    assert trial.net_seconds(1_000_000_000) == pytest.approx(2 * 600_000 / 1e9 - 0.001)
    # Break-even at 1.2 GB/s: slower links make it pay, faster ones do not.
    assert trial.net_seconds(600_000_000) > 0
    assert trial.net_seconds(2_000_000_000) < 0


def test_a_trial_measures_the_codec_on_a_sample_of_the_batch() -> None:
    batch = compressible(200_000)

    trial, other = try_codecs(batch, ("lz4", "zstd"), sample_bytes=256 << 10)

    assert (trial.codec, other.codec) == ("lz4", "zstd")
    assert other.plain_bytes == trial.plain_bytes
    assert 256 << 10 <= trial.plain_bytes < 320 << 10  # the sample, with IPC framing
    assert trial.compressed_bytes < trial.plain_bytes // 4
    assert trial.cost_seconds >= 0


def test_an_explicit_codec_is_kept_without_a_trial() -> None:
    def no_clock() -> float:
        raise AssertionError("an explicit codec must not be measured")

    for codec in ("none", "lz4", "zstd"):
        assert choose_codec(codec, compressible(), 1 * MIB, clock=no_clock) == codec


def test_auto_stores_incompressible_data_plain() -> None:
    # Even at a slow 1 MiB/s nothing is saved, so nothing can pay for the CPU.
    assert choose_codec("auto", incompressible(), 1 * MIB) == "none"


def test_auto_compresses_compressible_data() -> None:
    # At 64 MiB/s, the 400 kB lz4 saves of the 512 KiB sample are worth 12 ms: far more than
    # lz4 costs, even on a loaded machine (at the default 256 MiB/s, 3 ms).
    assert choose_codec("auto", compressible(), 64 * MIB) in ("lz4", "zstd")


def test_auto_follows_the_bandwidth_the_saving_is_weighed_at() -> None:
    # Every encode + decode takes one tick: with zstd costing as much as plain, any saving pays.
    free = ticking_clock(0.001)
    assert choose_codec("auto", compressible(), 1 << 40, clock=lambda: next(free)) != "none"
    # zstd costs more CPU than plain storage, measured: a fast enough link makes it not pay.
    assert choose_codec("auto", compressible(), 1 * MIB, candidates=("zstd",)) == "zstd"
    assert choose_codec("auto", compressible(), 1 << 40, candidates=("zstd",)) == "none"


def test_a_partition_too_small_to_repay_a_trial_is_stored_plain_without_one() -> None:
    def no_clock() -> float:
        raise AssertionError("a trial that cannot pay must not run")

    # 100 kB, all saved and moved twice at 256 MiB/s: 0.75 ms, less than a trial costs.
    assert choose_codec("auto", compressible(), 256 * MIB, known_bytes=100_000, clock=no_clock) == (
        "none"
    )
    # On a link 256 times slower the same bytes are worth a trial, and lz4 pays there.
    assert choose_codec("auto", compressible(), 1 * MIB, known_bytes=100_000) in ("lz4", "zstd")

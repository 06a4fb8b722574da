"""The external service's fault matrix (tests/reliability/test_external_fault_matrix.py) as a
table: each cell, its result ("exact": Spark's rows), its seconds and the files left on the
workers once the application is done.

    .venv/bin/python benchmarks/fault_matrix.py
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from common import machine, save_results

# The cells and their runner are the test's own: one definition of the matrix.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pyspark_shuffle.spark.local import local_spark_session
from tests.reliability.test_external_fault_matrix import CELLS, Outcome, run_cell

RESULTS = Path(__file__).parent / "results" / "fault_matrix.json"


def main() -> None:
    spark = local_spark_session("fault-matrix", cores=2, max_task_failures=2)
    outcomes: list[Outcome] = []
    print(f"{'cell':<50} {'result':<12} {'seconds':>8} {'files left':>10}")
    try:
        for cell in CELLS:
            with tempfile.TemporaryDirectory() as directory:
                outcome = run_cell(spark, cell, Path(directory))
            outcomes.append(outcome)
            print(
                f"{outcome.cell:<50} {outcome.result[:12]:<12} {outcome.seconds:>8}"
                f" {outcome.files_left:>10}"
            )
            if outcome.result != "exact":
                print(f"    {outcome.result}")
    finally:
        spark.stop()
    save_results(
        RESULTS,
        {"machine": machine(), "cells": [asdict(outcome) for outcome in outcomes]},
    )


if __name__ == "__main__":
    main()

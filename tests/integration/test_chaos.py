"""``pyshuffle chaos`` as CI runs it: ten seeded runs on both services (local-cluster, two
executors; three workers and two coordinators for the external service), each with 1-3 faults
at random moments, every result equal to Spark's, no file left, no daemon crashed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.pyshuffle_command import WITHOUT_PYSHUFFLE_VARIABLES, pyshuffle

# Seeds 2151-2160 draw both services, all four operations and every kind of fault: executor,
# Python worker and daemon ones, a daemon's connections dropped, a worker's store filled (see
# tests/unit/pyspark_shuffle/chaos/test_plans.py for how a seed plans a run).
FIRST_SEED = 2151
RUNS = 10


@pytest.mark.slow
@pytest.mark.timeout(1500)  # the suite's 300 s is too little for ten runs on a busy host
def test_ten_seeded_chaos_runs_give_spark_s_results_and_leave_nothing(tmp_path: Path) -> None:
    summary_file = tmp_path / "chaos.json"
    result = pyshuffle(
        "chaos",
        *("--runs", str(RUNS), "--seed", str(FIRST_SEED)),
        *("--work", str(tmp_path / "work"), "--output", str(summary_file)),
        env=WITHOUT_PYSHUFFLE_VARIABLES,
        timeout=1200,
    )
    assert summary_file.exists(), result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads(summary_file.read_text())
    assert summary["failures"] == [], result.stdout[-3000:]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert summary["runs"] == summary["exact"] == RUNS
    assert (summary["wrong_results"], summary["files_left"], summary["daemon_crashes"]) == (0, 0, 0)
    assert set(summary["runs_by_service"]) == {"netty_like", "external_shuffle"}
    # This host (root, as CI's) can drop connections and fill stores of their own.
    assert {"connection-drop", "store-full"} <= set(summary["fault_kinds"]["external_shuffle"])
    fired = {kind for kind, phases in summary["faults"].items() if set(phases) - {"no target"}}
    assert {
        *("executor-kill", "executor-term", "executor-stall"),
        *("daemon-kill", "daemon-term", "daemon-restart", "daemon-stall"),
        *("connection-drop", "store-full"),
    } <= fired, summary["faults"]
    assert sum(line.startswith("run ") for line in result.stdout.splitlines()) == RUNS

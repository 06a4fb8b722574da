"""Running an application of :mod:`tests.integration.cluster_jobs` from a test: in a process
of its own, whose outcomes come back as JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["Outcomes", "run_application", "step"]

ROOT = Path(__file__).resolve().parents[2]

Outcomes = dict[str, dict[str, Any]]


def run_application(service: str, work: Path) -> Outcomes:
    """The service's plan in one application; each step's outcome under its label."""
    (work / "executor-tmp").mkdir(parents=True)
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.cluster_jobs", str(work), service],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=1400,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, (
        f"the {service} application printed no result (exit {done.returncode}):\n"
        f"{done.stderr[-4000:]}"
    )
    outcomes: Outcomes = json.loads(lines[-1].removeprefix("RESULT "))
    return outcomes


def step(outcomes: Outcomes, label: str) -> dict[str, Any]:
    outcome = outcomes[label]
    assert "error" not in outcome, outcome
    return outcome

"""``pyshuffle chaos`` at scale: N randomized runs with faults at random moments, on both
services (local-cluster[2,1,1024]), saved with the machine and the commit they ran on.

    .venv/bin/python benchmarks/chaos.py --runs 1000 [--seed 1] [--resume]

The summary is written after every run; ``--resume`` goes on from it (a run of hours may be
stopped and taken up again), each stretch of seeds recorded with its commit.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from common import machine, positive, save_results

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pyspark_shuffle.chaos.command import main as chaos

RESULTS = Path(__file__).parent / "results" / "chaos.json"


def _commit() -> str:
    answer = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=Path(__file__).parent,
        capture_output=True,
        text=True,
        check=False,
    )
    return answer.stdout.strip() or "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=positive, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--resume", action="store_true", help="go on from the saved summary")
    args = parser.parse_args()
    status = chaos(
        [
            *("--runs", str(args.runs), "--seed", str(args.seed), "--output", str(RESULTS)),
            *("--label", f"commit {_commit()}"),
            *(["--resume"] if args.resume else []),
        ]
    )
    summary = json.loads(RESULTS.read_text())
    save_results(RESULTS, {**summary, "machine": machine()})
    return status


if __name__ == "__main__":
    sys.exit(main())

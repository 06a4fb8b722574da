"""``pyshuffle chaos`` at scale: N randomized runs with faults at random moments, on both
services (local-cluster[2,1,1024]), saved with the machine they ran on.

    .venv/bin/python benchmarks/chaos.py --runs 1000 [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from common import machine, positive, save_results

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pyspark_shuffle.chaos.command import main as chaos

RESULTS = Path(__file__).parent / "results" / "chaos.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=positive, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        summary_file = Path(directory) / "chaos.json"
        status = chaos(
            ["--runs", str(args.runs), "--seed", str(args.seed), "--output", str(summary_file)]
        )
        summary = json.loads(summary_file.read_text())
    save_results(RESULTS, {"first_seed": args.seed, **summary, "machine": machine()})
    return status


if __name__ == "__main__":
    sys.exit(main())

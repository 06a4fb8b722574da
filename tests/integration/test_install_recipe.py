"""docs/pyspark.md's install recipe, run as written: the wheel built from a checkout, a
virtual environment packed with venv-pack, ``spark-submit --archives`` on
``local-cluster[2,1,1024]``. The executors must import pyshuffle from the shipped archive, and
the driver from the environment: nothing of this checkout is on any path."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest

from pyspark_shuffle.spark.local import require_java
from tests.source_tree import ROOT, copy_source

RECIPE_MARKER = "<!-- install-recipe -->"
# Where the recipe names a cluster, the test's two executor JVMs (and no web UI: free ports).
CLUSTER = "spark://host:7077"
LOCAL_CLUSTER = "'local-cluster[2,1,1024]' --conf spark.ui.enabled=false"

JOB = """
import json
import pyspark_shuffle
from pyspark.sql import SparkSession
from pyspark_shuffle import SparkShuffle

spark = SparkSession.builder.appName("install-recipe").getOrCreate()
frame = spark.range(0, 20_000, 1, 4).selectExpr("id AS k", "id * 3 AS v")
with SparkShuffle(spark) as shuffle:
    shuffled = shuffle.repartition(frame, "k", num_partitions=4)
    equal = sorted(map(tuple, shuffled.collect())) == sorted(map(tuple, frame.collect()))
where = spark.sparkContext.parallelize(range(8), 8).map(
    lambda _: __import__("pyspark_shuffle").__file__
)
print("RESULT " + json.dumps({
    "equal": equal,
    "driver": pyspark_shuffle.__file__,
    "executors": sorted(set(where.collect())),
}))
spark.stop()
"""


def recipe() -> str:
    """The shell lines of the recipe in docs/pyspark.md (the code block after its marker)."""
    text = (ROOT / "docs" / "pyspark.md").read_text(encoding="utf-8")
    found = re.search(re.escape(RECIPE_MARKER) + r"\n```\n(.*?)\n```", text, re.DOTALL)
    assert found, f"docs/pyspark.md has no code block after {RECIPE_MARKER}"
    return found.group(1)


# A wheel, an environment installed and packed, an application on local-cluster: 268 s in a CI
# run on a slow machine, near the suite's 300 s.
@pytest.mark.timeout(1500)
def test_the_install_recipe_as_written_ships_pyshuffle_to_the_executors(tmp_path: Path) -> None:
    require_java()
    checkout = copy_source(tmp_path / "pyshuffle")
    # Away from the checkout: Python puts a script's directory first on its path.
    job = tmp_path / "jobs" / "job.py"
    job.parent.mkdir()
    job.write_text(JOB, encoding="utf-8")
    lines = recipe()
    assert CLUSTER in lines and lines.endswith(" job.py")
    lines = lines.replace(CLUSTER, LOCAL_CLUSTER).removesuffix("job.py") + str(job)
    environment = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("PYSPARK_", "PYTHON", "SPARK_", "VIRTUAL_ENV"))
    }
    # The user's shell: pip, python, venv-pack and a Spark, its home named as a Spark
    # distribution's is (pip's spark-submit would ask the driver's Python for it): pip's
    # pyspark, linked file by file into a directory where its workers keep their work/.
    spark_home = tmp_path / "spark"
    spark_home.mkdir()
    for entry in Path(pyspark.__file__).parent.iterdir():
        if entry.name != "work":  # where other local-cluster runs left their executors' work
            (spark_home / entry.name).symlink_to(entry)
    environment["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environment['PATH']}"
    environment["SPARK_HOME"] = str(spark_home)
    environment["SPARK_LOCAL_IP"] = "127.0.0.1"
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", lines],
        cwd=checkout,
        env=environment,
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    results = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and results, done.stdout[-3000:] + done.stderr[-6000:]
    outcome = json.loads(results[-1].removeprefix("RESULT "))
    assert outcome["equal"] is True
    assert outcome["driver"].startswith(str(checkout / "pyshuffle-env" / "lib")), outcome
    assert outcome["executors"], "no executor said where it imported pyshuffle from"
    for path in outcome["executors"]:  # each executor's unpacked copy of the archive
        assert path.startswith(str(spark_home / "work")) and "/environment/lib/" in path

"""A long map stage's progress bar as a user sees it on a terminal (a pseudo-terminal here).
A job run by spark-submit, whose JVM relays the Python driver's output to the terminal and
draws no bar of Spark's by default, shows pyshuffle's bar: redrawn in place, erased at the
stage's end, with the progress lines logged on lines of their own. The same job shows none
without a terminal; run by Python itself (PySpark then turns Spark's own bar on), it shows
Spark's bar alone. The three jobs run at once, each in a process of its own (the unit tests
of ``auto_bar`` take the other cases, ``spark.ui.showConsoleProgress=false`` among them)."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pyspark
import pytest

pytestmark = pytest.mark.slow

_JOB = textwrap.dedent(
    """
    import logging, sys, time
    from pyspark.sql import SparkSession
    from pyspark_shuffle import SparkShuffle

    def slowly(batches):
        for batch in batches:
            time.sleep(0.8)
            yield batch

    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("pyspark_shuffle.driver.progress").setLevel(logging.INFO)
    spark = (
        SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    config = {
        "netty-like.storage.url": sys.argv[1],
        "pyspark-shuffle.map.target-size": 0,  # a map task per partition: 6
        "pyspark-shuffle.progress.interval": 1.5,
    }
    with SparkShuffle(spark, config=config) as shuffle:
        frame = spark.range(0, 600, 1, 6).mapInArrow(slowly, "id long")
        print("rows", shuffle.repartition(frame, "id", num_partitions=2).count(), flush=True)
    spark.stop()
    """
)
_SUBMIT = str(Path(pyspark.__file__).parent / "bin" / "spark-submit")
_COLUMNS = 100
_BAR = re.compile(r"\r(\[pyshuffle map \d+: [=> ]*\((\d) \+ (\d)\) / 6\])")
_LOGGED = "pyspark_shuffle.driver.progress: map stage of"


class _Job:
    """One run of the job, its stdout and stderr on a pseudo-terminal or a pipe."""

    def __init__(self, command: Sequence[str], *, terminal: bool) -> None:
        environment = {
            **os.environ,
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "COLUMNS": str(_COLUMNS),
        }
        self._output = bytearray()
        self._reader: threading.Thread | None = None
        if terminal:
            primary, secondary = pty.openpty()
            self.process = subprocess.Popen(
                command, stdin=secondary, stdout=secondary, stderr=secondary, env=environment
            )
            os.close(secondary)
            self._reader = threading.Thread(target=self._drain, args=(primary,), daemon=True)
            self._reader.start()
        else:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=environment,
            )

    def _drain(self, primary: int) -> None:
        try:
            while chunk := os.read(primary, 65536):
                self._output += chunk
        except OSError:  # EIO: nothing holds the terminal any more
            pass
        finally:
            os.close(primary)

    def output(self) -> str:
        """What the job wrote, once it has ended well."""
        if self._reader is None:
            written, _ = self.process.communicate(timeout=240)
            self._output += written
        else:
            self.process.wait(timeout=240)
            self._reader.join(timeout=30)
        text = self._output.decode(errors="replace")
        assert self.process.returncode == 0, text[-4000:]
        assert "rows 600" in text, text[-4000:]
        return text


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    work = tmp_path_factory.mktemp("progress-bar")
    job = work / "job.py"
    job.write_text(_JOB)

    runs = {
        "submitted": _Job([_SUBMIT, str(job), str(work / "submitted")], terminal=True),
        "no terminal": _Job([_SUBMIT, str(job), str(work / "piped")], terminal=False),
        "python": _Job([sys.executable, str(job), str(work / "python")], terminal=True),
    }
    try:
        yield {name: run.output() for name, run in runs.items()}
    finally:
        for run in runs.values():
            if run.process.poll() is None:
                run.process.kill()
                run.process.wait()


def test_a_long_map_stage_on_a_terminal_draws_a_bar_in_place_and_erases_it(
    outputs: dict[str, str],
) -> None:
    shown = outputs["submitted"]
    bars = list(_BAR.finditer(shown))
    texts = [bar.group(1) for bar in bars]
    assert len(set(texts)) >= 2, shown  # redrawn as the tasks finish
    assert all(len(text) == _COLUMNS - 1 for text in texts), texts
    done = [int(bar.group(2)) for bar in bars]
    assert done == sorted(done), texts
    # Erased once the stage ended, before the job's own output.
    erased = shown.index("\r" + " " * (_COLUMNS - 1) + "\r", bars[-1].end())
    assert erased < shown.index("rows 600")
    assert "[Stage " not in shown  # Spark's own bar is off under spark-submit
    # The progress lines are still logged, each from a line's start, never behind the bar.
    logged = [match.start() for match in re.finditer(re.escape(_LOGGED), shown)]
    assert logged, shown
    assert all(shown[at - 1] in "\r\n" for at in logged), shown


def test_no_bar_without_a_terminal(outputs: dict[str, str]) -> None:
    assert "[pyshuffle map" not in outputs["no terminal"]
    assert "[Stage " not in outputs["no terminal"]


def test_where_spark_draws_its_own_bar_pyshuffle_draws_none(outputs: dict[str, str]) -> None:
    assert "[Stage " in outputs["python"]
    assert "[pyshuffle map" not in outputs["python"]

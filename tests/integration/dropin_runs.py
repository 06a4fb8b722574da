"""Running the same user code twice, as the drop-in suite does: once on plain Spark, once
with ``pyspark_shuffle.enable`` on; and what each run gave, made comparable (rows sorted with
their Python types, the schema, or the error's type, Spark error class and message line, and
whether the call or the action raised it)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyspark_shuffle
from pyspark_shuffle import DropInCall
from pyspark_shuffle.options import DROPIN_MIN_INPUT_SIZE
from tests.integration.spark_rows import canonical

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from tests.integration.services import ShuffleService

__all__ = [
    "Outcome",
    "Runs",
    "closed_switch",
    "conf_set",
    "error_line",
    "outcome_of",
    "run_both",
]

# The worker's own last word in a PythonException's text: "module.SomeError: message"
# (PySpark's errors say "[CLASS] message" after the colon; a user's own error says its text).
_RAISED = re.compile(r"^\s*((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Warning)): (.*)$")


def error_line(error: BaseException) -> str:
    """What an error says went wrong, without the parts that differ per run (tracebacks,
    plans, SQLSTATE lines): for an error from a Python worker, its traceback's last raised
    line; for Py4J's, the Java exception's first line (not "calling o123.collect"); for any
    other, its text's first line."""
    text = str(getattr(error, "java_exception", error))
    if type(error).__name__ == "PythonException":
        raised = [
            f"{match[1]}: {match[2].strip()}"
            for line in text.splitlines()
            if (match := _RAISED.match(line)) and not match[1].endswith("PythonException")
        ]
        assert raised, f"no raised error in the worker's text: {text}"
        return raised[-1]
    return text.strip().splitlines()[0] if text.strip() else ""


@dataclass(frozen=True)
class Outcome:
    """What one run of user code gave: rows (sorted, each value with its Python type) and
    the schema, or an error and where it was raised (``"call"`` or ``"action"``)."""

    rows: list[tuple[Any, ...]] | None = None
    schema: StructType | None = None
    error: BaseException | None = None
    raised_at: str = ""

    @property
    def error_summary(self) -> tuple[str, str | None, str, str] | None:
        """The error's type, Spark error class, message line and where it was raised."""
        if self.error is None:
            return None
        condition = getattr(self.error, "getCondition", lambda: None)()
        return (type(self.error).__name__, condition, error_line(self.error), self.raised_at)

    def comparable(self) -> tuple[object, ...]:
        return (self.rows, self.schema, self.error_summary)


def _typed(value: object) -> object:
    if isinstance(value, dict):
        return tuple((key, _typed(each)) for key, each in value.items())
    if isinstance(value, list | tuple):
        return (type(value).__name__, *(_typed(each) for each in value))
    return (type(value).__name__, canonical(value))


def outcome_of(make: Callable[[], DataFrame]) -> Outcome:
    """``make()`` (the call) and its rows (the action, one collect)."""
    try:
        frame = make()
    except Exception as error:  # compared, whatever it is
        return Outcome(error=error, raised_at="call")
    try:
        rows = frame.collect()
    except Exception as error:
        return Outcome(error=error, raised_at="action")
    typed = [tuple(_typed(value) for value in row) for row in rows]
    return Outcome(rows=sorted(typed, key=repr), schema=frame.schema)


@dataclass(frozen=True)
class Runs:
    """The two runs of one piece of user code and the switch's decisions during the second."""

    spark: Outcome
    switched: Outcome
    calls: tuple[DropInCall, ...]

    def paths(self) -> list[str]:
        return [call.path for call in self.calls]

    def assert_same(self) -> None:
        spark, switched = self.spark.comparable(), self.switched.comparable()
        if switched == spark:
            return
        parts = ("rows", "schema", "error")
        differences = [
            f"{part}:\n  spark:    {theirs!r}\n  switched: {ours!r}"
            for part, theirs, ours in zip(parts, spark, switched, strict=True)
            if theirs != ours
        ]
        raise AssertionError("\n".join([*differences, f"calls: {self.calls}"]))


def switch_config(service: ShuffleService) -> dict[str, object]:
    """The service's configuration, with every call the switch can carry carried (the suites'
    inputs are far under the size from which pyshuffle pays)."""
    return {**service.config(), DROPIN_MIN_INPUT_SIZE.key: 0}


def run_both(spark: SparkSession, service: ShuffleService, make: Callable[[], DataFrame]) -> Runs:
    """``make`` and its action on plain Spark, then with the switch on the module's service
    (off again after)."""
    plain = outcome_of(make)
    config = switch_config(service)
    with pyspark_shuffle.enable(spark, config=config) as switch:
        # The switch must run on the service it was given (not one an earlier enable chose).
        values = switch.shuffle.configuration.values
        assert {key: str(values.get(key)) for key in config} == {
            key: str(value) for key, value in config.items()
        }
        before = len(switch.calls)
        switched = outcome_of(make)
        calls = switch.calls[before:]
    return Runs(plain, switched, calls)


def closed_switch(spark: SparkSession) -> None:
    """Close the session's switch, made on whatever service (``enable`` without a
    configuration returns it as it is; with another, it refuses), so that each module and
    service starts and ends without one."""
    pyspark_shuffle.enable(spark).close()


@contextlib.contextmanager
def conf_set(spark: SparkSession, settings: Mapping[str, str]) -> Iterator[None]:
    """Spark settings for the block, each put back (or unset) after: the session is shared."""
    saved = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, was in saved.items():
            if was is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, was)

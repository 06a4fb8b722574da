"""pyshuffle's configuration for one ``SparkShuffle``: as it started (what configures the
running service), and as each operation reads it anew (``spark.conf.set`` between
operations)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

from blob import BLOB_OPTIONS
from pyspark_shuffle.options import PYSPARK_SHUFFLE_OPTIONS, SPARK_CONF_PREFIX
from pyspark_shuffle.spark.link import spark_settings
from shuffle_api import (
    ConfigError,
    Configuration,
    ShuffleServiceFactory,
    load_shuffle_service_factory,
)
from shuffle_api.options import CORE_OPTIONS, SHUFFLE_SERVICE_FACTORY_CLASS

__all__ = ["SessionConfig", "spark_configuration"]


def spark_configuration(
    spark: SparkSession,
    overrides: Mapping[str, object] | None = None,
    *,
    config_file: str | Path | None = None,
) -> Configuration:
    """pyshuffle's configuration: defaults < ``config_file`` < ``PYSHUFFLE_*`` variables <
    ``spark.pyshuffle.<key>`` Spark conf (the context's, then the session's) < ``overrides``."""
    configuration = Configuration.load(toml_file=config_file)
    for key, value in spark_settings(spark).items():
        if key.startswith(SPARK_CONF_PREFIX):
            configuration = configuration.with_values(
                {key.removeprefix(SPARK_CONF_PREFIX): value}, source=f"Spark conf {key}"
            )
    return configuration.with_values(overrides or {})


class SessionConfig:
    """The configuration of one ``SparkShuffle`` and the service factory it names."""

    def __init__(
        self,
        spark: SparkSession,
        overrides: Mapping[str, object] | None,
        config_file: str | Path | None,
    ) -> None:
        self._spark = spark
        self._overrides = dict(overrides or {})
        self._config_file = config_file
        self.started_with = spark_configuration(spark, overrides, config_file=config_file)
        self.factory: ShuffleServiceFactory = load_shuffle_service_factory(
            self.started_with, extra_options=PYSPARK_SHUFFLE_OPTIONS
        )
        self._options = (*CORE_OPTIONS, *self.factory.config_options(), *PYSPARK_SHUFFLE_OPTIONS)
        # What an operation may set anew: keys read by its planning and tasks. The others
        # configure the running master, descriptor cache or blob store.
        fixed = {SHUFFLE_SERVICE_FACTORY_CLASS.key, *(option.key for option in BLOB_OPTIONS)}
        self.from_master: Mapping[str, str] = {}
        """What the running master adds for its tasks' environments (set once it exists)."""
        self._per_operation = {
            option.key
            for option in (*CORE_OPTIONS, *PYSPARK_SHUFFLE_OPTIONS)
            if option.key not in fixed
        } | {option.key for option in self.factory.config_options() if option.host_local}

    def now(self) -> Configuration:
        """The configuration as an operation starting now reads it (once: each operation
        passes it on). A key that configures the running service may not change:
        :class:`ConfigError` names it."""
        now = spark_configuration(self._spark, self._overrides, config_file=self._config_file)
        now.validate(self._options)
        for key in sorted(set(now.values) | set(self.started_with.values)):
            was, is_now = self.started_with.values.get(key), now.values.get(key)
            if key not in self._per_operation and was != is_now:
                raise ConfigError(
                    f"config key {key!r} was {was!r} when this SparkShuffle started and is now"
                    f" {is_now!r} (from {now.sources.get(key, 'its default')}): it configures"
                    " the running shuffle service, so set it before SparkShuffle starts"
                )
        return now.with_values(self.from_master, source="the shuffle master")

"""The driver side of the PySpark integration: the ``SparkShuffle`` facade, its stages and
exchanges, the registry of results and the chain they form, joins, Parquet sources and sinks,
fused stages and progress. The tasks it starts run :mod:`pyspark_shuffle.tasks`."""

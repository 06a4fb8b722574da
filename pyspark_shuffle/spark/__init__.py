"""The seam between pyshuffle and Spark: one link with a classic and a Spark Connect side
(:mod:`~pyspark_shuffle.spark.link`), what differs between Spark releases
(:mod:`~pyspark_shuffle.spark.compat`), the Spark internals pyshuffle uses
(:mod:`~pyspark_shuffle.spark.internals`) and a local session for the demo, tests and benchmarks
(:mod:`~pyspark_shuffle.spark.local`)."""

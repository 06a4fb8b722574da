"""PySpark map/reduce stages that exchange Arrow data through any pyshuffle service.

``SparkShuffle(spark)`` loads the factory named by ``shuffle-service-factory.class`` (pyshuffle
config or Spark conf ``spark.pyshuffle.<key>``) and offers DataFrame operations whose shuffle
goes through it: hash repartition, group-apply, sort and join. ``pandas_function(f)`` marks
a pandas function for ``group_apply``, run as Spark's ``applyInPandas`` runs it.
"""

from pyspark_shuffle.driver.exchange import Exchange, MapOutput
from pyspark_shuffle.driver.session import ShuffleStatistics, SparkShuffle, spark_configuration
from pyspark_shuffle.tasks.pandas_functions import PandasFunction, pandas_function

__all__ = [
    "Exchange",
    "MapOutput",
    "PandasFunction",
    "ShuffleStatistics",
    "SparkShuffle",
    "pandas_function",
    "spark_configuration",
]

"""PySpark map/reduce stages that exchange Arrow data through any pyshuffle service.

``SparkShuffle(spark)`` loads the factory named by ``shuffle-service-factory.class`` (pyshuffle
config or Spark conf ``spark.pyshuffle.<key>``) and offers DataFrame operations whose shuffle
goes through it: hash repartition, group-apply, sort and join. ``pandas_function(f)`` marks
a pandas function for ``group_apply``, run as Spark's ``applyInPandas`` runs it.

``enable(spark)`` is the one line for code written for Spark: the session's own
``groupBy(...).applyInPandas`` / ``applyInArrow`` calls, and both on ``cogroup``, then run through
pyshuffle where it can carry them, through Spark as before where it cannot.
"""

from pyspark_shuffle.driver.dropin import DropIn, DropInCall, disable, enable
from pyspark_shuffle.driver.exchange import Exchange, MapOutput
from pyspark_shuffle.driver.session import ShuffleStatistics, SparkShuffle, spark_configuration
from pyspark_shuffle.tasks.pandas_functions import PandasFunction, pandas_function

__all__ = [
    "DropIn",
    "DropInCall",
    "Exchange",
    "MapOutput",
    "PandasFunction",
    "ShuffleStatistics",
    "SparkShuffle",
    "disable",
    "enable",
    "pandas_function",
    "spark_configuration",
]

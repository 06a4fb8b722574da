"""PySpark map/reduce stages that exchange Arrow data through any pyshuffle service.

``SparkShuffle(spark)`` loads the factory named by ``shuffle-service-factory.class`` (pyshuffle
config or Spark conf ``spark.pyshuffle.<key>``) and offers DataFrame operations whose shuffle
goes through it: hash repartition, group-apply, sort and join.
"""

from pyspark_shuffle.driver.exchange import Exchange, MapOutput
from pyspark_shuffle.driver.session import ShuffleStatistics, SparkShuffle, spark_configuration

__all__ = ["Exchange", "MapOutput", "ShuffleStatistics", "SparkShuffle", "spark_configuration"]

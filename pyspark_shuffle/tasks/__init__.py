"""What runs inside Spark's Python workers: the map and reduce tasks of an exchange
(:mod:`~pyspark_shuffle.tasks.map_reduce`), what a worker knows of its executor
(:mod:`~pyspark_shuffle.tasks.executor`) and what pyshuffle does to the worker as each of its
tasks starts (:mod:`~pyspark_shuffle.tasks.python_worker`)."""

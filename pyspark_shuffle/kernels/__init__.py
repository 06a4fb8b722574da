"""Spark-free kernels of the PySpark integration: hashing and ordering of keys, partitioners,
sorting, what a reducer does with its batches, the plan of a reduce stage, and Arrow IPC bytes.
They import no pyspark, so they are tested (and benchmarked) without a Spark session."""

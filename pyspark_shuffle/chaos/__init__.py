"""``pyshuffle chaos``: randomized jobs with faults at random moments, each checked against
Spark's own result (plans, a run, the summary of many)."""

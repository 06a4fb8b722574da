"""Engine-agnostic job-master logic after Flink's scheduler."""

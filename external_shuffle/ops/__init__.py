"""An operator's tools: ``pyshuffle admin``, the coordinator's status page, metrics and the
health probes, and the cluster view the first two share."""

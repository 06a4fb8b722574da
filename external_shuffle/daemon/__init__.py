"""``pyshuffle daemon``: the process that serves the coordinator and worker roles, with what
both roles share (logs, admitted streams, errors reported as gRPC statuses)."""

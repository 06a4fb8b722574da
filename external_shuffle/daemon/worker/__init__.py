"""The worker role: pushed partitions stored and served (gRPC and the data port), its
registration and heartbeats, and what it committed since a coordinator last heard."""

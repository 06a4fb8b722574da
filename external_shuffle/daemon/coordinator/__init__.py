"""The coordinator role: its state (workers, applications, placements) as a plain class, and
the gRPC servicer thin over it."""

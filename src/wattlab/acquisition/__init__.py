"""Sources (a driver tied to the bus), the session supervisor, and workload markers."""

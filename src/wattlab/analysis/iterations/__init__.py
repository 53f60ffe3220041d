"""Training iterations of a run: bursts, markers, periods, per-iteration energy."""

"""Energy of a run: per stream and phase, fused NVML, counters, node split, summaries."""

"""Training iterations of a run: bursts, markers, periods, per-iteration energy."""

from wattlab.analysis.iterations.iteration_result import IterationResult
from wattlab.analysis.iterations.iteration_stream import DetectedIteration, IterationStream
from wattlab.analysis.iterations.run_iterations import iterations

__all__ = [
    "DetectedIteration",
    "IterationResult",
    "IterationStream",
    "iterations",
]

"""wattlab: measure how much energy GPU work really takes."""

__version__ = "0.1.0"

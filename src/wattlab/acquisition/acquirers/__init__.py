"""Acquirers: one driver (or GPU library) wrapped to yield chunks, gaps and markers."""

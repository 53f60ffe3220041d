"""Instrument drivers: one file per family, pure protocol, no threads, no wattlab imports above."""

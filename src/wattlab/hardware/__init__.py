"""The virtual bench: emulators speaking each instrument's exact bytes, and a simulated GPU."""

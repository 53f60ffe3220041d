"""Emulators speaking each instrument's exact bytes: serial meters on a pty, analysers over TCP."""

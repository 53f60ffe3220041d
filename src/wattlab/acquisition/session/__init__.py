"""A recording: the supervisor, source runners (threads or processes), remote agents, live view."""

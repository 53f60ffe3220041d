"""The recorder process: receives every stream, writes the run file, reports and exports."""

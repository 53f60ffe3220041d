"""The bus message format, publish/receive, and the recorder that writes HDF5."""

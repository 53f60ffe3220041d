"""The run-file format's one owner: its layout, the writer, the reader, the layout check, repair."""

"""One module per CLI verb: argument handling above, the real work in the subpackages."""

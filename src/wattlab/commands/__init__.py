"""One module per CLI verb, found by `wattlab.cli`: each has ``add_parser(sub)`` and ``run(args)``.

Argument handling lives here; the real work lives in the subpackages, so the Python API
and the CLI give the same results.
"""

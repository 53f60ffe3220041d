"""The bus: message format, the sources' publisher (DEALER), coalescing, CurveZMQ, link health."""

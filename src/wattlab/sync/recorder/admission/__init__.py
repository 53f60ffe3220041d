"""What the recorder admits: who may send for a stream, what a client may cost.

The limits, the refusals counted and logged, and the rows flagged at ingest
(docs/reliability.md).
"""

"""What one local client or agent may cost the recorder: frames, new streams, markers.

Why: the recorder serves every source of a run; a flood from one client (a confused
workload, a runaway loop) must not take the memory, the disk or the loop from the others.
Each limit here is far above what a real run uses (docs/reliability.md gives the figures);
what goes over it is refused, counted and, where it carried data, becomes a gap row.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

MAX_FRAME_BYTES = 32 * 1024 * 1024  # one frame (ZMQ_MAXMSGSIZE): 65,536 rows x 64 f8 channels
MAX_STREAMS = 512  # streams one recording takes
# once the file is in SWMR mode each new stream closes and reopens it (~0.1 s, and the
# 802 MB of issue 36): then a client may add this many at once ...
NEW_STREAMS_BURST = 32
NEW_STREAMS_PER_S = 2.0  # ... and then this many a second (before SWMR: no rate, they are
# cheap; a refused stream's publisher describes it again when its batches are not taken)
MARKERS_BURST = 10_000  # markers a client may send at once ...
MARKERS_PER_S = 1_000.0  # ... and then this many a second
MAX_ORPHAN_STREAMS = 64  # undescribed streams whose batches wait for a descriptor ...
MAX_ORPHAN_BYTES = 32 * 1024 * 1024  # ... holding at most this much in all
MAX_PEERS_TRACKED = 1024  # clients with a bucket of their own; the rest share one


@dataclass
class TokenBucket:
    """``burst`` at once, then ``per_s`` a second."""

    burst: float
    per_s: float
    tokens: float
    at_s: float

    def take(self, now_s: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now_s - self.at_s) * self.per_s)
        self.at_s = now_s
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class PeerBuckets:
    """One token bucket per peer (a client's routing id or an agent's name), bounded."""

    def __init__(self, burst: float, per_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._burst = burst
        self._per_s = per_s
        self._clock = clock
        self._buckets: dict[bytes | str, TokenBucket] = {}

    def allow(self, peer: bytes | str) -> bool:
        """Whether ``peer`` may do one more; past ``MAX_PEERS_TRACKED`` peers share a bucket."""
        now_s = self._clock()
        if peer not in self._buckets and len(self._buckets) >= MAX_PEERS_TRACKED:
            peer = b""
        bucket = self._buckets.get(peer)
        if bucket is None:
            bucket = self._buckets[peer] = TokenBucket(self._burst, self._per_s, self._burst,
                                                       now_s)
        return bucket.take(now_s)

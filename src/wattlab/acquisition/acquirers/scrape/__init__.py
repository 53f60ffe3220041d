"""Work counters read from a server's Prometheus endpoint (``wattlab record --scrape``)."""

from wattlab.acquisition.acquirers.scrape.exposition import Series, parse_exposition
from wattlab.acquisition.acquirers.scrape.known_metrics import DEFAULT_METRICS, unit_of
from wattlab.acquisition.acquirers.scrape.scrape_acquirer import (
    DEFAULT_HZ,
    ScrapeAcquirer,
    check_url,
)

__all__ = [
    "DEFAULT_HZ",
    "DEFAULT_METRICS",
    "ScrapeAcquirer",
    "Series",
    "check_url",
    "parse_exposition",
    "unit_of",
]

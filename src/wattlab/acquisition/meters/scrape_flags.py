"""``--scrape [ID=]URL``, ``--scrape-metric NAME`` and ``--scrape-hz HZ`` of ``wattlab record``.

Why a module of its own: the options, their checks and the probe scrape that turns a wrong
URL or metric into a usage error (exit 2) before anything starts stay out of record.py,
which only adds the options to its parser and the sources they name to its session.
Both URLs and vLLM's metric names hold ':', so neither is split on it: an ID is taken from
before a leading ``ID=`` only where that ID is a plain stream name.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass, field
from typing import Any

from wattlab.acquisition.acquirers import Acquirer
from wattlab.acquisition.meters.meter_specs import build_meter, check_unique_ids
from wattlab.arg_types import Number
from wattlab.errors import UsageError
from wattlab.samples import check_source_id

SCRAPE_KIND = "scrape"
METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
PLAIN_ID = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.\-]{0,63})=(.*)$")
SCRAPE_HZ = Number(0.0, 100.0, above=True, unit="Hz")


@dataclass(frozen=True)
class ScrapeSource:
    """One ``--scrape``: its stream id, URL and the acquirer's options."""

    source_id: str
    url: str
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def meter_text(self) -> str:
        """The ``--meter`` form a source process builds it from."""
        return f"{self.source_id}={SCRAPE_KIND}:{self.url}"

    @property
    def options_json(self) -> str:
        return json.dumps(self.options)

    def acquirer(self) -> Acquirer:
        return build_meter(SCRAPE_KIND, self.url, self.source_id, self.options)


def add_scrape_options(p: argparse.ArgumentParser) -> None:
    """The scrape options, in their own group of ``record``'s help."""
    g = p.add_argument_group("work counters from a server (see docs/scrape.md)")
    g.add_argument("--scrape", action="append", default=[], metavar="[ID=]URL",
                   help="also record the counters a server serves at this Prometheus "
                        "endpoint, e.g. http://localhost:8000/metrics (repeatable; stream "
                        "'scrape', then scrape2, ...); vLLM's, SGLang's and TGI's token and "
                        "request counters are recorded by default")
    g.add_argument("--scrape-metric", action="append", default=[], metavar="NAME",
                   help="record this metric instead of the known ones (repeatable, or a "
                        "comma list), e.g. vllm:generation_tokens_total")
    g.add_argument("--scrape-hz", type=SCRAPE_HZ, metavar="HZ",
                   help="scrapes per second (default 10)")


def metric_list(texts: list[str]) -> list[str]:
    names = [n.strip() for t in texts for n in t.split(",") if n.strip()]
    bad = [n for n in names if not METRIC_NAME.match(n)]
    if bad:
        raise UsageError(f"--scrape-metric {', '.join(map(repr, bad))}: not a Prometheus "
                         "metric name (letters, digits, '_' and ':', not starting with a digit)")
    return names


def scrape_sources(args: argparse.Namespace, *, probe: bool = True) -> list[ScrapeSource]:
    """The ``--scrape`` sources, checked; ``probe`` scrapes each once (exit 2 if it fails).

    Why a probe: a URL nobody answers, or a metric the server does not serve, must stop the
    recording before it starts, with the endpoint's own metric names in the message.
    """
    if not args.scrape:
        if args.scrape_metric or args.scrape_hz is not None:
            raise UsageError("--scrape-metric and --scrape-hz need --scrape URL")
        return []
    options: dict[str, Any] = {}
    if args.scrape_metric:
        options["metrics"] = metric_list(args.scrape_metric)
    if args.scrape_hz is not None:
        options["hz"] = args.scrape_hz
    sources = []
    for n, text in enumerate(args.scrape, 1):
        m = PLAIN_ID.match(text)
        sid, url = (m.group(1), m.group(2)) if m else (
            SCRAPE_KIND if n == 1 else f"{SCRAPE_KIND}{n}", text)
        sources.append(ScrapeSource(check_source_id(sid), url, options))
    check_unique_ids([s.source_id for s in sources], "--scrape")
    if probe:
        for source in sources:
            acquirer = source.acquirer()
            try:
                acquirer.open()
            finally:
                acquirer.close()
    return sources

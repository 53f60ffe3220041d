"""Which meters exist, how users name them (``--meter``, bench files, discovery), disk cost."""

from wattlab.acquisition.meters.bench_file import (
    BenchConfig,
    DeviceConfig,
    NvmlChoice,
    bench_acquirers,
    check_bench,
    check_gpus_exist,
    load_bench,
    meter_options_json,
    nvml_selection,
    write_template,
)
from wattlab.acquisition.meters.discovery import discover
from wattlab.acquisition.meters.disk_budget import (
    check_room,
    duration_text,
    nvml_streams,
    rate_text,
)
from wattlab.acquisition.meters.meter_specs import (
    amd_acquirers,
    check_unique_ids,
    meter_acquirers,
    nvml_acquirers,
    parse_meter_spec,
)
from wattlab.acquisition.meters.scrape_flags import (
    ScrapeSource,
    add_scrape_options,
    scrape_sources,
)

__all__ = [
    "BenchConfig",
    "DeviceConfig",
    "NvmlChoice",
    "ScrapeSource",
    "add_scrape_options",
    "amd_acquirers",
    "bench_acquirers",
    "check_bench",
    "check_gpus_exist",
    "check_room",
    "check_unique_ids",
    "discover",
    "duration_text",
    "load_bench",
    "meter_acquirers",
    "meter_options_json",
    "nvml_acquirers",
    "nvml_selection",
    "nvml_streams",
    "parse_meter_spec",
    "rate_text",
    "scrape_sources",
    "write_template",
]

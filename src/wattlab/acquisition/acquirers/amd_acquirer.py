"""AMD GPUs as a source: the GPU reader on the amdsmi driver, one meter entry per GPU.

Why a registered meter kind: ``--meter amd:0``, a bench file's ``kind = "amd"`` entry,
``wattlab agent --meter`` and ``--source-processes`` then read AMD GPUs with no code of
their own. ``--amd all|0,1`` (record, agent) is the short form: it asks amdsmi which GPUs
there are and adds one entry per GPU, named ``amd{i}``, whose streams are
``amd{i}.power``, ``amd{i}.energy`` and ``amd{i}.state`` (amdsmi has no sample buffer, so
there is no ``samples`` stream). ``simulate`` reads the fake amdsmi instead
(``wattlab.hardware.fake_amdsmi``), for machines without an AMD GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from wattlab.acquisition.acquirers.meter_registry import MeterKind, register
from wattlab.errors import NvmlError, UsageError
from wattlab.option_checks import bool_check, non_negative_int, positive_int

DEFAULT_ID = "amd"


def _checked(parse: Any, rule: str) -> Any:
    """An option check from a parser that raises UsageError on bad input."""

    def check(value: Any) -> str | None:
        try:
            parse(value)
        except (UsageError, TypeError, AttributeError) as e:
            return f"{rule} ({e})"
        return None

    return check


def _streams(value: Any) -> Any:
    from wattlab.acquisition.acquirers.nvml_acquirer import parse_streams

    return parse_streams(value)


def _intervals(value: Any) -> Any:
    from wattlab.acquisition.acquirers.nvml_cadence import parse_intervals

    return parse_intervals(value)


def amd_library(options: Mapping[str, Any]) -> Any:
    """The fake amdsmi for ``simulate``, else None (the driver imports the real one)."""
    if not options.get("simulate"):
        return None
    from wattlab.hardware.fake_amdsmi import fake_amdsmi

    return fake_amdsmi(int(options.get("simulated_gpus", 1)), int(options.get("seed", 0)))


def _build(address: str, source_id: str, options: Mapping[str, Any]) -> Any:
    from wattlab.acquisition.acquirers.nvml_acquirer import NvmlAcquirer
    from wattlab.acquisition.acquirers.nvml_cadence import parse_intervals
    from wattlab.drivers.amdsmi import AmdSmiDriver

    text = address.strip()
    if not (text.isascii() and text.isdigit()):
        raise UsageError(f"amd:{address}: the address is one GPU index, like amd:0 "
                         "(--amd all|0,1 reads several)")
    index = int(text)
    return NvmlAcquirer(AmdSmiDriver(amd_library(options)), index,
                        streams=options.get("streams", "all"),
                        intervals_s=parse_intervals(options.get("intervals", "")),
                        name=None if source_id == DEFAULT_ID else source_id)


def amd_devices(spec: str, options: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``--amd all|0,1`` → (source id, address) per GPU; amdsmi is asked which exist.

    A bad list or an index amdsmi does not see is a UsageError (exit 2); so is a machine
    without amdsmi, with the way to install it.
    """
    from wattlab.drivers.amdsmi import AmdSmiDriver

    driver = AmdSmiDriver(amd_library(options))
    try:
        driver.open()
    except NvmlError as e:
        raise UsageError(f"--amd {spec}: {e}") from e
    try:
        indices = driver.resolve_gpus(spec)
    except UsageError as e:
        raise UsageError(f"--amd {spec}: {e}") from e
    finally:
        driver.close()
    return [(f"amd{i}", str(i)) for i in indices]


KIND = register(MeterKind(
    kind="amd", default_id=DEFAULT_ID, aliases=("amdsmi",), address_key="index",
    help="an AMD GPU through amdsmi (ROCm): socket power, energy counter, clocks, limits",
    build=_build, stream_rate=None,  # not measured: the disk budget counts its chunks only
    options={"simulate": (bool_check, False), "simulated_gpus": (positive_int, 1),
             "seed": (non_negative_int, 0),
             "streams": (_checked(_streams, "must be \"all\" or a list of NVML streams"),
                         "all"),
             "intervals": (_checked(_intervals, "must be like \"energy=5,emit=2\""), "")},
    template="""
# An AMD GPU through amdsmi (pip install amdsmi; needs ROCm's libamd_smi). One entry per
# GPU; its streams are <id>.power, <id>.energy, <id>.state (`--amd all` reads every GPU).
# [[device]]
# kind = "amd"
# id = "amd0"
# index = "0"
# simulate = false      # true: the simulated MI300X (no hardware needed)
""",
))


def amd_options(simulate: bool, simulated_gpus: int | None, seed: int | None,
                streams: str | None, intervals: str | None) -> dict[str, Any]:
    """The amd entries' options from ``record``'s or ``agent``'s flags."""
    return {"simulate": bool(simulate), "simulated_gpus": simulated_gpus or 1,
            "seed": seed or 0, "streams": streams or "all", "intervals": intervals or ""}

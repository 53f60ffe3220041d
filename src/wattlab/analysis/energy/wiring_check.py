"""A bench meter's board power against its GPU's own reading: a wiring mistake, said loudly.

Why: a bench file's ``gpu = N`` says that the named rails carry all of GPU N's power, and
``board_power_w`` becomes the reference every NVML figure is judged against. A rail left
out (a PowerSensor3 pair not named, a cable that bypasses the sensor) or one too many (a
rail feeding another device, ``gpu = N`` naming the wrong GPU) makes that reference wrong
by a third or more, and every "err %" after it with a straight face. Both readings are of
one board, so their means over a run must agree within the two instruments' accuracies.

The bound: NVIDIA states NVML's board power to ±5 % (older boards: ±5 W); a riser's
current sensors are good to a few percent once calibrated (5 % allowed). They agree within
about 10 %; ``WIRING_BOUND`` is 2.5 times that, room for NVML's part-time sampling on
recent GPUs and a meter's offset at low power. The mistakes it is for are far larger:
one of two 12 V cables left out takes 35-45 % of a busy GPU's power away (NVML then reads
1.5-1.8 times the rails; 1.6-1.8 on the emulated PowerSensor3 without pair 3).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from wattlab.runfile import SourceView

WIRING_BOUND = 0.25
"""The larger of the two mean powers may exceed the smaller by at most this fraction."""
WIRING_PREFIX = "wiring error: "
"""How a mismatch's line starts (``wattlab energy`` puts such notes first)."""
NVML_PREFERENCE = (".samples", ".power", ".energy", "")
"""Which of GPU N's streams to compare with: the 50 Hz samples first."""


@dataclass(frozen=True)
class WiringMismatch:
    """A bench meter whose board power and its GPU's reading are too far apart."""

    meter: str  # "riser:board_power_w"
    gpu: int
    gpu_stream: str  # "gpu0.samples"
    meter_w: float
    gpu_w: float
    left_out: tuple[str, ...]  # measured inputs not named as rails

    def line(self) -> str:
        """One line: which stream, by how much, and what to check."""
        lead = (f"{WIRING_PREFIX}{self.meter} (GPU {self.gpu}'s board power from the bench file) "
                f"averages {self.meter_w:.1f} W where {self.gpu_stream} reads "
                f"{self.gpu_w:.1f} W")
        if self.gpu_w > self.meter_w:
            part = (f" ({_percent(self.gpu_w, self.meter_w)} more; the bound is "
                    f"{WIRING_BOUND * 100:.0f} %): the rails miss power: check for a pair or cable "
                    "not named in rails")
            if self.left_out:
                part += f" ({', '.join(self.left_out)} measured but not named)"
            part += ", or a cable that bypasses the sensor"
        else:
            part = (f" ({_percent(self.meter_w, self.gpu_w)} less; the bound is "
                    f"{WIRING_BOUND * 100:.0f} %): the rails carry more than GPU {self.gpu}: check "
                    "for a rail that feeds another device, or gpu = N naming the wrong GPU")
        return lead + part + "; its figures are not a reference (docs/meters.md)"


def _percent(high_w: float, low_w: float) -> str:
    return f"{100 * (high_w / low_w - 1):.0f} %" if low_w > 0 else "all of it"


def gpu_stream(gpu_source: str, mean_w: Mapping[str, float | None]) -> str | None:
    """GPU N's stream to compare with: the first of its streams with a mean power."""
    for suffix in NVML_PREFERENCE:
        name = gpu_source + suffix
        if mean_w.get(name) is not None:
            return name
    return None


def wiring_mismatches(views: Mapping[str, SourceView], mean_w: Mapping[str, float | None]
                      ) -> list[WiringMismatch]:
    """Every bench meter feeding a GPU whose mean power is beyond the bound from the GPU's.

    ``mean_w``: each stream's mean power over the span compared (its total channel's).
    """
    out = []
    for sid, view in views.items():
        config = view.descriptor.get("config", {})
        if config.get("feeds_gpu") is None or config.get("gpu_source") is None:
            continue
        meter_w = mean_w.get(sid)
        other = gpu_stream(str(config["gpu_source"]), mean_w)
        if meter_w is None or other is None or not math.isfinite(meter_w):
            continue
        gpu_w = mean_w[other]
        assert gpu_w is not None  # gpu_stream picks a stream with a mean
        if _within(meter_w, gpu_w):
            continue
        channel = str(config.get("board_power_channel") or config.get("power_channel"))
        out.append(WiringMismatch(f"{sid}:{channel}", int(config["feeds_gpu"]), other,
                                  meter_w, gpu_w,
                                  tuple(config.get("not_in_board_power") or ())))
    return out


def _within(meter_w: float, gpu_w: float) -> bool:
    low, high = sorted((meter_w, gpu_w))
    return high <= 0 or (low > 0 and high <= (1 + WIRING_BOUND) * low)

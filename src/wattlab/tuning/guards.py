"""Several knobs of one GPU changed together, each restored by its own ``SettingsGuard``.

Why a wrapper and not a new guard: ``SettingsGuard`` (acquisition/experiments/sweep_runner.py)
already reads the original, checks a setting against the GPU's range before anything changes and
restores exactly once; the tuner changes up to three knobs, so it holds one per knob and
restores them all, each even if another's restore failed.
"""

from __future__ import annotations

from typing import Any

from wattlab.acquisition.experiments import SettingsGuard
from wattlab.drivers.nvml import NvmlDriver
from wattlab.errors import NvmlError, UsageError

KNOBS = ("sm_clock", "mem_clock", "power_limit")
POWER_LIMIT_STEP_W = 25.0


class KnobGuards:
    """Apply a setting (knob → value) and restore every original on any exit."""

    def __init__(self, driver: NvmlDriver, gpu: int, knobs: list[str]) -> None:
        self.guards = {k: SettingsGuard(driver, gpu, k) for k in knobs}
        self.info = next(iter(self.guards.values())).info
        self.applied: dict[str, float] = {}

    def axes(self) -> dict[str, tuple[float, ...]]:
        """The settings to search per knob, ascending, the GPU's default last."""
        out: dict[str, tuple[float, ...]] = {}
        for knob, guard in self.guards.items():
            if knob == "power_limit":
                lo, hi = self.info.power_limit_min_w, self.info.power_limit_max_w
                top = guard.original_power_limit_w
                if lo is None or hi is None:
                    raise UsageError(f"GPU {guard.gpu}: its power limit range is unknown")
                values = [top - k * POWER_LIMIT_STEP_W for k in range(64)
                          if top - k * POWER_LIMIT_STEP_W >= lo]
            else:
                values = list(self.info.mem_clocks_mhz if knob == "mem_clock"
                              else self.info.sm_clocks_mhz)
                if not values:
                    raise UsageError(f"GPU {guard.gpu}: it lists no supported "
                                     f"{knob.replace('_', ' ')}s")
            out[knob] = tuple(sorted(float(v) for v in values))
        return out

    def apply(self, setting: dict[str, float]) -> None:
        """Set each knob whose value changes (a knob at its default is left as it is)."""
        for knob, value in setting.items():
            if self.applied.get(knob) != value:
                self.guards[knob].apply(value)
                self.applied[knob] = value

    def restore(self) -> dict[str, Any]:
        """Every original back; a failing knob does not stop the others (errors reported)."""
        out: dict[str, Any] = {}
        for knob, guard in self.guards.items():
            try:
                out.update(guard.restore())
            except NvmlError as e:
                out[f"{knob}_error"] = str(e)
        self.applied.clear()
        return out

    def originals(self) -> dict[str, Any]:
        """What the watchdog needs to restore without this process."""
        guard = next(iter(self.guards.values()))
        return {"gpu": guard.gpu, "knobs": list(self.guards),
                "power_limit_w": guard.original_power_limit_w}

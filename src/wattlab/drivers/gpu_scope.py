"""What a GPU's power and energy readings really cover, found once when a reader opens.

Why: the same NVML call means different things on different machines. Under MIG it is the
whole physical GPU, never one instance; in a vGPU guest it is the physical card shared with
other VMs (when the driver answers at all); on a GH200-style module the readings cover the
Grace CPU, the GPU and the memory together. Writing that into every stream's descriptor is
what lets a node total add each joule exactly once (``analysis/energy/node_energy.py``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

VIRTUALIZATION = {0: "none", 1: "passthrough", 2: "vgpu", 3: "host_vgpu", 4: "host_vsga"}


@dataclass(frozen=True)
class GpuScope:
    """A GPU's situation: MIG on, virtualisation mode, whether its readings cover a module."""

    mig: bool = False
    virtualization: str = "none"
    module: bool = False
    module_parts: str = ""  # what a module's readings cover, where not a Grace module's

    @property
    def covers(self) -> tuple[str, ...]:
        """The parts of the node the readings include (a node total adds none twice)."""
        return ("cpu", "gpu", "memory") if self.module else ("gpu",)

    def measures(self) -> str:
        """One sentence for the descriptor: what these watts and joules are."""
        if self.module:
            what = self.module_parts or ("the whole module: Grace CPU, GPU and memory "
                                         "(module power scope); not the GPU alone")
        else:
            what = "the whole GPU board"
        if self.mig:
            what += ("; MIG is on: every MIG instance of this GPU together, never one "
                     "instance (share it by your own rule, e.g. by SM slices)")
        if self.virtualization == "vgpu":
            what += ("; a vGPU guest: the physical GPU, shared with other virtual machines, "
                     "so not this VM's share")
        return what

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "covers": list(self.covers), "measures": self.measures()}

"""What is plugged in: serial ports (recognising known meters), VISA resources, GPUs.

Recognition is in two steps, as a careful person would do it: the USB vendor/product id
says what a port *might* be, then a harmless identify query (PowerSensor3 ``V``, PMD
``00``, a registered meter's own ``identify``) says what it is. Ports are only queried
when their id matches a known meter, or when the user names them with ``--probe``.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from wattlab.acquisition.acquirers import meter_kinds
from wattlab.drivers.transport import SerialTransport
from wattlab.errors import WattlabError

# USB (vendor, product) id -> the meter kinds seen with it, as the meters registered them
USB_CANDIDATES: dict[tuple[int, int], tuple[str, ...]] = {}
for _kind in meter_kinds().values():
    for _usb_id in _kind.usb_ids:
        USB_CANDIDATES[_usb_id] = (*USB_CANDIDATES.get(_usb_id, ()), _kind.kind)
PROBE_KINDS = tuple(k.kind for k in meter_kinds().values() if k.identify is not None)
IDENTIFY_TIMEOUT_S = 0.5


@dataclass
class FoundDevice:
    """One thing `wattlab devices` found, and how to name it to `--meter`."""

    kind: str
    address: str
    description: str = ""
    identity: str = ""
    meter_spec: str = ""
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def identify_serial(port: str, candidates: tuple[str, ...] = PROBE_KINDS) -> FoundDevice:
    """Ask the port, politely, what it is; unknown devices are reported as such."""
    notes: list[str] = []
    for kind in candidates:
        try:
            transport = SerialTransport(port, timeout_s=IDENTIFY_TIMEOUT_S)
        except WattlabError as e:
            return FoundDevice("serial", port, notes=[str(e)])
        try:
            identify = meter_kinds()[kind].identify
            if identify is None:
                raise WattlabError("it has no identify query")
            identity = identify(transport)
            return FoundDevice(kind, port, identity=identity, meter_spec=f"{kind}:{port}")
        except WattlabError as e:
            notes.append(f"not a {kind}: {e}")
        finally:
            transport.close()
    return FoundDevice("serial", port, notes=notes)


def serial_ports() -> list[FoundDevice]:
    from serial.tools import list_ports

    found = []
    for info in list_ports.comports():
        candidates = USB_CANDIDATES.get((info.vid or -1, info.pid or -1))
        if candidates:
            device = identify_serial(info.device, candidates)
        else:
            device = FoundDevice("serial", info.device)
        device.description = f"{info.description} [{info.vid or 0:04X}:{info.pid or 0:04X}]"
        found.append(device)
    return found


# pyvisa-py session classes that list local buses only; serial ports are listed above
LOCAL_VISA_SESSIONS = (("pyvisa_py.usb", "USBInstrSession"), ("pyvisa_py.usb", "USBRawSession"),
                       ("pyvisa_py.gpib", "GPIBSession"))


def _local_visa_names() -> list[str]:
    """USB TMC (and GPIB) resources, without the network broadcast a full listing sends."""
    names: list[str] = []
    for module_name, class_name in LOCAL_VISA_SESSIONS:
        try:
            module = importlib.import_module(module_name)
            names += getattr(module, class_name).list_resources()
        except Exception:  # a bus whose backend (pyusb, gpib-ctypes) is not installed
            continue
    return names


def _all_visa_names() -> list[str]:
    import pyvisa

    manager = pyvisa.ResourceManager("@py")
    try:
        return list(manager.list_resources())
    finally:
        manager.close()


def quiet_visa_listing(listing: Callable[[], list[str]]) -> tuple[list[str], list[str]]:
    """The names ``listing`` found, and what it warned about as one note line each.

    Why: pyvisa-py warns, with a source line and a stack frame on stderr, about every
    discovery it cannot do (HiSLIP without the zeroconf package); the user needs one line.
    Its other warnings (its own unclosed broadcast sockets) are not the user's to act on.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("ignore")
        warnings.simplefilter("always", UserWarning)
        names = listing()
    said = (" ".join(str(w.message).split()) for w in caught)
    return names, [f"network discovery incomplete: {text}" for text in dict.fromkeys(said)]


def visa_resources(network: bool = False) -> list[FoundDevice]:
    """VISA instruments on local buses; ``network``: also VXI-11 / HiSLIP discovery.

    Network discovery broadcasts on every interface, so it is asked for, never implied;
    a TCP instrument can always be named directly (``TCPIP::host::port::SOCKET``).
    """
    try:
        names, notes = quiet_visa_listing(_all_visa_names if network else _local_visa_names)
    except Exception as e:
        return [FoundDevice("visa", "-", notes=[f"VISA listing failed: {e}"])]
    found = [FoundDevice("visa", name, meter_spec=f"wt300e:{name}") for name in names]
    return found + ([FoundDevice("visa", "-", notes=notes)] if notes else [])


def nvml_gpus() -> list[FoundDevice]:
    from wattlab.drivers.nvml import NvmlDriver

    driver = NvmlDriver()
    try:
        driver.open()
    except WattlabError as e:
        return [FoundDevice("nvml", "-", notes=[str(e)])]
    try:
        found = []
        for index in range(driver.gpu_count()):
            info = driver.device_info(index)
            found.append(FoundDevice("nvml", str(index), info.name,
                                     identity=f"{info.uuid} driver {info.driver_version}",
                                     meter_spec=f"--nvml {index}"))
        return found
    finally:
        driver.close()


def discover(probe: list[str], network: bool = False) -> list[FoundDevice]:
    """Everything, plus the ports named with ``--probe`` (e.g. an emulator's pty)."""
    return [*serial_ports(), *(identify_serial(p) for p in probe), *visa_resources(network),
            *nvml_gpus()]

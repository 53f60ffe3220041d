"""The meter registry: every kind is complete and reachable through every entry point."""

from __future__ import annotations

import pytest

from wattlab.acquisition.acquirers.meter_registry import MeterKind, meter_kinds, register
from wattlab.acquisition.meters.bench_file import KINDS, TEMPLATE
from wattlab.acquisition.meters.discovery import PROBE_KINDS, USB_CANDIDATES
from wattlab.acquisition.meters.meter_specs import ALIASES, METER_KINDS, parse_meter_spec
from wattlab.commands.emulate import emulated_kinds

pytestmark = pytest.mark.fast

SIMULATED_IN_PROCESS = {"amd"}  # a GPU library: faked inside the process (--simulate)


def test_every_meter_module_registered_its_kinds_in_order() -> None:
    assert list(meter_kinds()) == ["powersensor3", "pmd", "wt300e", "hmc8015", "mcp39f511",
                                  "rapl", "amd", "scrape"]
    assert list(KINDS) == ["nvml", *meter_kinds()]


def test_every_kind_reaches_meter_flag_bench_file_emulate_and_template() -> None:
    emulated = {k.kind for k in emulated_kinds().values()}
    for name, kind in meter_kinds().items():
        assert METER_KINDS[name] == kind.default_id
        assert all(ALIASES[a] == name and a not in METER_KINDS for a in kind.aliases)
        assert parse_meter_spec(f"{name}:/dev/x").source_id == kind.default_id
        assert kind.address_key in KINDS[name].required
        assert name in emulated or name in SIMULATED_IN_PROCESS
        assert kind.template.strip() and kind.template in TEMPLATE
        for usb_id in kind.usb_ids:
            assert name in USB_CANDIDATES[usb_id]
    assert set(PROBE_KINDS) == {k for k, m in meter_kinds().items() if m.identify}


def test_a_kind_cannot_be_registered_twice() -> None:
    mcp = meter_kinds()["mcp39f511"]
    assert register(mcp) is mcp  # re-importing a module registers the same object again
    clash = MeterKind(kind="mcp39f511", default_id="x", help="", build=mcp.build,
                      stream_rate=None)
    with pytest.raises(ValueError, match="'mcp39f511' is taken by meter kind 'mcp39f511'"):
        register(clash)


def test_an_alias_cannot_take_another_kinds_name() -> None:
    ps3 = meter_kinds()["powersensor3"]
    for aliases in (("powersensor3",), ("ps3",)):
        clash = MeterKind(kind="riser", default_id="x", help="", build=ps3.build,
                          stream_rate=None, aliases=aliases)
        with pytest.raises(ValueError, match=f"'{aliases[0]}' is taken by meter kind "
                                             "'powersensor3'"):
            register(clash)
    assert "riser" not in meter_kinds()

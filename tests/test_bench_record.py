"""`wattlab record --bench`: rails and board power from a bench file, end to end.

An emulated PowerSensor3 on a real pty and a simulated GPU, recorded into a real HDF5 run
file; the SCPI analysers through real pyvisa-py against their emulators.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import wattlab
from tests.conftest import running
from wattlab.acquisition.meters.bench_file import (
    check_bench,
    check_gpus_exist,
    load_bench,
    parse_bench,
)
from wattlab.acquisition.session.supervisor import record_bench
from wattlab.analysis.alignment import power_channel
from wattlab.cli import main
from wattlab.errors import UsageError
from wattlab.hardware.emulators.hmc8015_emulator import Hmc8015Emulator
from wattlab.hardware.emulators.powersensor3_emulator import EmulatedSensor, PowerSensor3Emulator
from wattlab.hardware.emulators.powersensor3_emulator import default_config as ps3_default_config
from wattlab.hardware.emulators.wt300e_emulator import Wt300eEmulator

BOARD_W = 240.0
# the riser reads a constant BOARD_W while the simulated GPU's load runs at 70-600 W: the
# two do not measure one board, and `record` says so as a wiring error and exits 1
# (tests/test_wiring_check.py); every row is kept, which is what these tests read
MISWIRED = 1
RAILS = {"0": "slot_12v", "1": "slot_3v3", "2": "cable_8pin_1", "3": "cable_8pin_2"}


def riser_bench(port: str, rails: dict[str, str] = RAILS, extra: str = "") -> str:
    table = ", ".join(f'{k} = "{v}"' for k, v in rails.items())
    return f"""\
[bench]
name = "riser"

[[device]]
kind = "nvml"
simulate = true

[[device]]
kind = "powersensor3"
id = "riser"
port = "{port}"
rails = {{ {table} }}
gpu = 0
{extra}"""


@pytest.fixture
def ps3() -> Iterator[PowerSensor3Emulator]:
    with running(PowerSensor3Emulator(lambda t: BOARD_W)) as device:
        yield device


@pytest.mark.system
def test_record_bench_has_rails_and_board_power(ps3: PowerSensor3Emulator, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    bench = tmp_path / "bench.toml"
    bench.write_text(riser_bench(ps3.path))
    out = tmp_path / "run.h5"
    code = main(["record", "--bench", str(bench), "--duration", "2", "-o", str(out)])
    printed = capsys.readouterr()
    assert "riser" in printed.out
    # a constant 240 W riser beside the simulated GPU's own load (70-600 W): over 2 s the
    # two means may or may not differ by the wiring check's 25 % (test_wiring_check plants
    # both cases); a wiring error always exits 1, and so does a loss, with its gap rows
    miswired = "wattlab: error: wiring error: riser:board_power_w" in printed.err
    with wattlab.open(str(out)) as run:
        assert code == (MISWIRED if miswired or run.gaps else 0), (code, printed.err)
        stored = json.loads(run.attrs["bench_config"])
        assert stored == json.loads(json.dumps(load_bench(str(bench)).to_json()))
        assert stored["devices"][1]["rails"] == RAILS and stored["devices"][1]["gpu"] == 0
        assert "gpu0.samples" in run.sources
        riser = run.source("riser")
        for rail in RAILS.values():
            for quantity in ("current_a", "voltage_v", "power_w"):
                assert f"{rail}_{quantity}" in riser.channel_names
        assert not {"power0_w", "current1_a"} & set(riser.channel_names)
        rails_w = sum(riser.channel(f"{r}_power_w").astype(np.float64) for r in RAILS.values())
        board_w = riser.channel("board_power_w")
        assert len(board_w) > 20_000
        np.testing.assert_allclose(board_w, rails_w, rtol=1e-5, atol=1e-3)
        np.testing.assert_allclose(board_w, riser.channel("power_total_w"), rtol=1e-4, atol=0.05)
        assert abs(float(np.mean(board_w)) - BOARD_W) < 0.03 * BOARD_W
        config = riser.descriptor["config"]
        assert (config["feeds_gpu"], config["gpu_source"]) == (0, "gpu0")
        assert config["rails"]["slot_3v3"]["input"] == "pair 1"
        assert config["bench_entry"] == f"{bench}:8: device 'riser' (powersensor3)"
        assert power_channel(riser) == "board_power_w"
        assert riser.unit("board_power_w") == "W"


@pytest.mark.system
def test_named_rails_leave_the_rest_out_of_board_power(ps3: PowerSensor3Emulator,
                                                       tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Unnamed pairs stay under their device names and are said to be outside the sum."""
    out = tmp_path / "two.h5"
    rails = {"0": "slot_12v", "2": "cable_8pin_1"}
    result = record_bench(parse_bench(riser_bench(ps3.path, rails), "two.toml"), str(out),
                          duration_s=1.0)
    assert result.source_errors == {}
    assert "power1_w, power3_w measured but not named" in capsys.readouterr().err
    with wattlab.open(str(out)) as run:
        riser = run.source("riser")
        assert {"power1_w", "power3_w", "slot_12v_power_w"} <= set(riser.channel_names)
        assert riser.descriptor["config"]["not_in_board_power"] == ["power1_w", "power3_w"]
        expected = riser.channel("slot_12v_power_w") + riser.channel("cable_8pin_1_power_w")
        np.testing.assert_allclose(riser.channel("board_power_w"), expected, rtol=1e-5, atol=1e-3)
        assert np.mean(riser.channel("board_power_w")) < np.mean(riser.channel("power_total_w"))


@pytest.mark.system
def test_record_bench_with_the_nvml_cadences_of_the_file(tmp_path: Path) -> None:
    """The Python API: a bench file's ``intervals`` reach the reader."""
    bench = parse_bench('[[device]]\nkind = "nvml"\nsimulate = true\n'
                        'streams = ["samples", "energy"]\n'
                        'intervals = { drain = 1.5, emit = 1.5 }\n', "frugal.toml")
    out = tmp_path / "frugal.h5"
    result = record_bench(bench, str(out), duration_s=2.0)
    assert result.source_errors == {}
    with wattlab.open(str(out)) as run:
        samples = run.source("gpu0.samples")
        assert samples.descriptor["config"]["intervals_s"]["drain"] == 1.5
        assert len(samples.time_ns) >= 80 and run.gaps == []


@pytest.mark.system
def test_record_bench_in_source_processes(ps3: PowerSensor3Emulator, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The rails travel with the meter into its own process."""
    bench = tmp_path / "bench.toml"
    bench.write_text(riser_bench(ps3.path))
    out = tmp_path / "proc.h5"
    code = main(["record", "--bench", str(bench), "--source-processes", "--duration", "1.5",
                 "-o", str(out)])
    miswired = "wiring error" in capsys.readouterr().err  # may or may not: see above
    with wattlab.open(str(out)) as run:
        assert code == (MISWIRED if miswired or run.gaps else 0), code
        riser = run.source("riser")
        assert "cable_8pin_2_power_w" in riser.channel_names
        assert riser.descriptor["config"]["feeds_gpu"] == 0
        assert json.loads(run.attrs["bench_config"])["name"] == "riser"


@pytest.mark.fast
@pytest.mark.parametrize(("flags", "named"), [
    (["--nvml", "0"], "--nvml"), (["--simulate"], "--simulate"),
    (["--seed", "3", "--simulated-gpus", "2"], "--simulated-gpus, --seed"),
    (["--nvml-streams", "samples"], "--nvml-streams"),
    (["--nvml-intervals", "drain=1"], "--nvml-intervals"),
    (["--meter", "riser=ps3:/dev/null"], "stream id(s) ['riser'] used twice"),
])
def test_bench_with_conflicting_flags_is_refused(tmp_path: Path, flags: list[str], named: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    bench = tmp_path / "bench.toml"
    bench.write_text(riser_bench("/dev/null"))
    out = tmp_path / "never.h5"
    assert main(["record", "--bench", str(bench), "--duration", "1", "-o", str(out), *flags]) == 2
    err = capsys.readouterr().err
    assert named in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


RIDER = riser_bench("/dev/ttyACM0")


@pytest.mark.fast
@pytest.mark.parametrize(("text", "message"), [
    (RIDER.replace("3 = ", "5 = "),
     "b.toml:12: device 2 (powersensor3): rails names pair '5', which does not exist "
     "(pairs: 0, 1, 2, 3)"),
    (RIDER.replace('"slot_3v3"', '"Slot 3V3"'),
     "b.toml:12: device 2 (powersensor3): rails 1 = 'Slot 3V3': must be a rail name"),
    (RIDER.replace('"cable_8pin_2"', '"cable_8pin_1"'),
     "b.toml:12: device 2 (powersensor3): rails uses the rail name(s) ['cable_8pin_1'] twice"),
    (RIDER.replace('"slot_12v"', '"board"'), "b.toml:12: device 2 (powersensor3): rails "
                                             "0 = 'board': must not be 'board'"),
    (RIDER.replace("gpu = 0", "gpu = 1"),
     "b.toml:13: device 2 (powersensor3): gpu = 1 is not one of the GPUs the nvml device at "
     "line 4 reads (0)"),
    (RIDER.replace("gpu = 0", 'gpu = "0"'),
     "b.toml:13: device 2 (powersensor3): gpu must be a whole number >= 0"),
    (RIDER.replace("simulate = true", 'gpus = "1"'),
     "b.toml:13: device 2 (powersensor3): gpu = 0 is not one of the GPUs"),
    (RIDER.replace("[[device]]\nkind = \"nvml\"\nsimulate = true\n", ""),
     "b.toml:10: device 1 (powersensor3): gpu = 0, but no [[device]] kind = \"nvml\""),
    (RIDER.replace("rails = {", "# rails = {"),
     "b.toml:13: device 2 (powersensor3): gpu = 0 needs rails = { 0 = \"slot_12v\""),
    (RIDER + '\n[[device]]\nkind = "pmd"\nport = "/dev/ttyUSB0"\n'
             'rails = { pcie1 = "cable_a" }\ngpu = 0\n',
     "b.toml:19: device 3 (pmd): gpu 0 is already fed by device 'riser' at line 8"),
    (RIDER + '\n[[device]]\nkind = "pmd"\nport = "/dev/ttyUSB0"\nrails = { pcie3 = "x" }\n',
     "b.toml:18: device 3 (pmd): rails names input 'pcie3', which does not exist (inputs: "
     "pcie1, pcie2, eps1, eps2)"),
    (RIDER + '\n[[device]]\nkind = "wt300e"\nresource = "TCPIP::h::1::SOCKET"\n'
             'elements = { 4 = "wall" }\n',
     "b.toml:18: device 3 (wt300e): elements names element '4'"),
    (RIDER.replace("gpu = 0\n", "") + '\n[[device]]\nkind = "wt300e"\n'
     'resource = "TCPIP::h::1::SOCKET"\nelements = [1]\ngpu = 0\n',
     "b.toml:18: device 3 (wt300e): gpu = 0 needs elements = { 1 = \"...\" }"),
    (RIDER.replace("gpu = 0\n", "") + '\n[[device]]\nkind = "hmc8015"\n'
     'resource = "TCPIP::h::1::SOCKET"\nrail = "dc_in"\nfunctions = ["URMS"]\ngpu = 0\n',
     "b.toml:19: device 3 (hmc8015): gpu = 0 needs \"P\" (active power) in functions"),
    (RIDER.replace('kind = "nvml"', 'kind = "nvml"\ngpu = 0'),
     "b.toml:6: device 1 (nvml): unknown key 'gpu' (did you mean 'gpus'?)"),
])
def test_bad_rails_and_gpus_name_file_line_and_key(text: str, message: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_bench(text, "b.toml")
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.fast
def test_cli_bad_bench_file_is_one_line_exit_2(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    bench = tmp_path / "bad.toml"
    bench.write_text(RIDER.replace("gpu = 0", "gpu = 2"))
    assert main(["record", "--bench", str(bench), "--duration", "1",
                 "-o", str(tmp_path / "x.h5")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"wattlab: error: {bench}:13: device 2 (powersensor3): gpu = 2")
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "x.h5").exists()
    assert main(["bench", "check", str(bench)]) == 2


@pytest.mark.fast
def test_gpu_that_nvml_does_not_have_is_refused_at_start() -> None:
    """With gpus = "all" on real NVML the file cannot know; the start checks."""
    config = parse_bench(RIDER.replace("simulate = true", 'gpus = "all"'), "b.toml")
    with pytest.raises(UsageError, match=r"b.toml:8: device 'riser' \(powersensor3\): gpu = 0, "
                                         r"but the GPUs read are 1, 2"):
        check_gpus_exist(config, [("gpu1", None), ("gpu2", None)])
    check_gpus_exist(config, [("gpu0", None)])


@pytest.mark.system
def test_bench_check_names_a_rail_the_device_does_not_measure(tmp_path: Path) -> None:
    """Pair 3 switched off in the sensor's configuration: the rail on it is an error."""
    config = [s if i < 6 else EmulatedSensor(s.type, s.pair_name, s.vref_v, s.sensitivity, False)
              for i, s in enumerate(ps3_default_config())]
    with running(PowerSensor3Emulator(lambda t: BOARD_W, config=config)) as device:
        bench = tmp_path / "bench.toml"
        bench.write_text(riser_bench(device.path))
        results = {r.name: r for r in check_bench(load_bench(str(bench)))}
        assert results["gpu0"].ok
        assert not results["riser"].ok
        assert results["riser"].error.startswith(
            f"{bench}:8: device 'riser' (powersensor3): rail 'cable_8pin_2' is on pair 3, "
            "which this PowerSensor3 does not measure")
        # the port was released: the same device opens again
        bench.write_text(riser_bench(device.path, {k: v for k, v in RAILS.items() if k != "3"}))
        assert all(r.ok for r in check_bench(load_bench(str(bench))))


@pytest.mark.system
def test_bench_check_analysers_with_labels(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """WT300E elements and the HMC8015's rail name the channels; gpu adds board power."""
    wt = Wt300eEmulator("WT332E").start()
    hmc = Hmc8015Emulator().start()
    try:
        bench = tmp_path / "bench.toml"
        bench.write_text(f"""\
[[device]]
kind = "nvml"
simulate = true

[[device]]
kind = "wt300e"
resource = "{wt.resource}"
elements = {{ 1 = "wall", 2 = "monitor" }}
items = ["U", "P"]

[[device]]
kind = "hmc8015"
resource = "{hmc.resource}"
rail = "gpu_dc_in"
gpu = 0
""")
        assert main(["bench", "check", str(bench), "--json"]) == 0
        report = {d["name"]: d for d in json.loads(capsys.readouterr().out)["devices"]}
        wall = report["wall"]["streams"][0]
        assert wall["channels"] == ["wall_voltage_v [V]", "wall_power_w [W]",
                                    "monitor_voltage_v [V]", "monitor_power_w [W]"]
        assert wall["rails"]["monitor"]["input"] == "element 2"
        assert "feeds_gpu" not in wall
        dc = report["hmc"]["streams"][0]
        assert dc["channels"][-1] == "board_power_w [W]" and dc["feeds_gpu"] == 0
        values = report["hmc"]["first_values"]
        assert values["hmc:board_power_w"] == pytest.approx(values["hmc:gpu_dc_in_power_w"])
        assert main(["bench", "check", str(bench)]) == 0
        text = capsys.readouterr().out
        assert "rails: wall on element 1, monitor on element 2\n" in text
        assert "rails: gpu_dc_in on input; board_power_w (their sum) feeds GPU 0" in text
    finally:
        wt.close()
        hmc.close()

"""Bench files: validation messages with file, line and key; `bench check` on emulators."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from wattlab.acquisition.meters.bench_file import (
    TEMPLATE,
    NvmlChoice,
    bench_acquirers,
    check_bench,
    load_bench,
    nvml_selection,
    parse_bench,
)
from wattlab.cli import main
from wattlab.errors import UsageError
from wattlab.hardware.emulators.powersensor3_emulator import PowerSensor3Emulator
from wattlab.hardware.emulators.wt300e_emulator import Wt300eEmulator


@pytest.mark.fast
def test_template_is_valid() -> None:
    config = parse_bench(TEMPLATE, "bench.toml")
    assert config.name == "my-bench"
    first_device_line = TEMPLATE.splitlines().index("[[device]]") + 1
    assert [(d.kind, d.line) for d in config.devices] == [("nvml", first_device_line)]
    assert config.devices[0].options["gpus"] == "all"


@pytest.mark.fast
def test_template_examples_are_valid_when_uncommented() -> None:
    """Every commented example (rails, gpu, elements, rail) must parse as documented."""
    lines = [re.sub(r"^# (\[\[device\]\]|[a-z_]+ = )", r"\1", line)
             for line in TEMPLATE.splitlines()]
    text = "\n".join(lines).replace("simulated_gpus = 1", "simulated_gpus = 2")
    config = parse_bench(text, "bench.toml")
    assert [d.kind for d in config.devices] == ["nvml", "powersensor3", "pmd", "wt300e",
                                                "hmc8015", "mcp39f511", "rapl", "amd",
                                                "scrape"]
    ps3, pmd, wall, hmc, mcp, rapl, amd, scrape = config.meters
    assert scrape.address == "http://localhost:8000/metrics" and scrape.options["hz"] == 10
    assert scrape.options["metrics"] == ["vllm:generation_tokens_total",
                                         "vllm:prompt_tokens_total"]
    assert amd.address == "0" and amd.options["simulate"] is False
    assert rapl.address == "/sys/class/powercap" and rapl.options["interval_s"] == 0.1
    assert (ps3.options["gpu"], pmd.options["gpu"]) == (0, 1)
    assert ps3.options["rails"] == {"0": "slot_12v", "1": "slot_3v3", "2": "cable_8pin_1",
                                    "3": "cable_8pin_2"}
    assert wall.options["elements"] == {"1": "wall"} and hmc.options["rail"] == "psu_ac"
    assert mcp.options["rails"] == {"1": "server_ac"} and mcp.options["accumulation_n"] == 1


GOOD = """\
[bench]
name = "b1"

[[device]]
kind = "powersensor3"
port = "/dev/ttyACM0"

[[device]]
kind = "wt300e"
id = "wall"
resource = "TCPIP::10.0.0.2::10001::SOCKET"
rate_s = 0.5
"""


@pytest.mark.fast
def test_nvml_streams_reach_the_record_flags() -> None:
    config = parse_bench('[[device]]\nkind = "nvml"\nsimulate = true\n'
                         'streams = ["energy", "samples"]\n', "b.toml")
    assert nvml_selection(config) == NvmlChoice("all", True, 1, 0, "energy,samples", "")
    assert nvml_selection(parse_bench('[[device]]\nkind = "nvml"\n', "b.toml")).streams == "all"


@pytest.mark.fast
def test_nvml_intervals_reach_the_record_flags_as_text_or_table() -> None:
    as_text = parse_bench('[[device]]\nkind = "nvml"\nintervals = "drain=1.8,emit=6"\n', "b.toml")
    as_table = parse_bench('[[device]]\nkind = "nvml"\nintervals = { drain = 1.8, emit = 6 }\n',
                           "b.toml")
    assert nvml_selection(as_text).intervals == "drain=1.8,emit=6"
    assert nvml_selection(as_table).intervals == "drain=1.8,emit=6"


@pytest.mark.fast
@pytest.mark.parametrize("value, named", [('"drain=3"', "longer than 2.0 s"),
                                          ("{ flush = 1 }", "no cadence named 'flush'"),
                                          ("{ emit = 0 }", "emit=0"), ("5", "a string like")])
def test_bad_nvml_intervals_name_the_file_and_the_value(value: str, named: str) -> None:
    with pytest.raises(UsageError) as e:
        parse_bench(f'[[device]]\nkind = "nvml"\nintervals = {value}\n', "b.toml")
    assert "b.toml" in str(e.value) and "intervals" in str(e.value) and named in str(e.value)


@pytest.mark.fast
def test_defaults_and_json() -> None:
    config = parse_bench(GOOD, "b.toml")
    ps3, wt = config.devices
    assert (ps3.id, ps3.line, wt.id, wt.line) == ("ps3", 4, "wall", 8)
    assert wt.options == {"resource": "TCPIP::10.0.0.2::10001::SOCKET", "rate_s": 0.5,
                          "elements": [1], "items": ["U", "I", "P"]}
    assert config.to_json()["devices"][1]["kind"] == "wt300e"
    assert config.to_json()["path"] == str(Path("b.toml").resolve())
    json.dumps(config.to_json())
    # a bench a command made has no file: its name is kept, not put under the working
    # directory (the lent H200's qualify runs stored "/work/main/<qualify --gpu>")
    assert parse_bench(GOOD, "<qualify --gpu>").to_json()["path"] == "<qualify --gpu>"


@pytest.mark.fast
@pytest.mark.parametrize(("text", "message"), [
    (GOOD.replace('port = "/dev', 'prot = "/dev'),
     "b.toml:6: device 1 (powersensor3): unknown key 'prot' (did you mean 'port'?)"),
    (GOOD.replace("rate_s = 0.5", 'rate_s = "fast"'),
     "b.toml:12: device 2 (wt300e): rate_s must be a number > 0, got 'fast'"),
    (GOOD.replace('port = "/dev/ttyACM0"\n', ""),
     "b.toml:4: device 1 (powersensor3): missing key 'port'"),
    (GOOD.replace('kind = "wt300e"', 'kind = "wt310"'),
     "b.toml:9: device 2: unknown kind 'wt310' (did you mean 'wt300e'?)"),
    (GOOD.replace('id = "wall"', 'id = "ps3"'),
     "b.toml:10: device 2: id 'ps3' is already used by the device at line 4"),
    (GOOD.replace('id = "wall"', 'id = "wall meter"'),
     "b.toml:10: device 2 (wt300e): id must be 1-64 letters"),
    (GOOD.replace('name = "b1"', 'nmae = "b1"'),
     "b.toml:2: [bench]: unknown key 'nmae' (did you mean 'name'?)"),
    (GOOD.replace("[[device]]\nkind = \"wt300e\"", "[[devices]]\nkind = \"wt300e\""),
     "b.toml:8: unknown table or key 'devices' (did you mean 'device'?)"),
    (GOOD.replace("rate_s = 0.5", "rate_s = 0.5 0.6"), "b.toml: not valid TOML"),
    ('[bench]\nname = "x"\n', "b.toml: no [[device]] table"),
    (GOOD.replace('kind = "powersensor3"\n', ""), "b.toml:4: device 1: no 'kind'"),
    ('[[device]]\nkind = "nvml"\ngpus = "first"\n',
     "b.toml:3: device 1 (nvml): gpus must be \"all\""),
    ('[[device]]\nkind = "nvml"\nstreams = ["samples", "heat"]\n',
     "b.toml:3: device 1 (nvml): streams must be \"all\" or a list of samples, power, energy, "
     "state, processes (NVML streams ['samples', 'heat']: no stream named 'heat'"),
    ('[[device]]\nkind = "nvml"\nstreams = 3\n',
     "b.toml:3: device 1 (nvml): streams must be \"all\" or a list of samples"),
])
def test_errors_name_file_line_and_key(text: str, message: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_bench(text, "b.toml")
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.fast
def test_toml_syntax_error_has_its_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(GOOD.replace("rate_s = 0.5", "rate_s = 0.5 0.6"))
    with pytest.raises(UsageError, match=r"bad.toml: not valid TOML: .*line 12"):
        load_bench(str(path))
    with pytest.raises(UsageError, match="no such bench file"):
        load_bench(str(tmp_path / "missing.toml"))


@pytest.mark.fast
def test_acquirers_from_bench() -> None:
    text = GOOD + ('\n[[device]]\nkind = "nvml"\nsimulate = true\nsimulated_gpus = 2\n'
                   '\n[[device]]\nkind = "hmc8015"\nresource = "TCPIP::h::5025::SOCKET"\n'
                   '\n[[device]]\nkind = "pmd"\nport = "/dev/ttyUSB0"\n')
    with bench_acquirers(parse_bench(text)) as found:
        kinds = [(name, type(getattr(acq, "inner", acq)).__name__) for name, acq in found]
    assert kinds == [
        ("gpu0", "NvmlAcquirer"), ("gpu1", "NvmlAcquirer"), ("ps3", "PowerSensor3Acquirer"),
        ("wall", "Wt300eAcquirer"), ("hmc", "Hmc8015Acquirer"), ("pmd", "PmdAcquirer")]


@pytest.fixture
def emulated_bench(tmp_path: Path) -> Iterator[Path]:
    ps3 = PowerSensor3Emulator(power_w=lambda t: 100.0).start()
    wt = Wt300eEmulator().start()
    try:
        path = tmp_path / "bench.toml"
        path.write_text(f"""\
[bench]
name = "emulated"

[[device]]
kind = "nvml"
simulate = true

[[device]]
kind = "powersensor3"
port = "{ps3.path}"

[[device]]
kind = "wt300e"
resource = "{wt.resource}"
""")
        yield path
    finally:
        ps3.stop()
        wt.close()


@pytest.mark.system
def test_bench_check_opens_every_device(emulated_bench: Path) -> None:
    results = {r.name: r for r in check_bench(load_bench(str(emulated_bench)))}
    assert all(r.ok for r in results.values()), {n: r.error for n, r in results.items()}
    assert set(results) == {"gpu0", "ps3", "wall"}
    ps3_total = [v for k, v in results["ps3"].first_values.items() if k.endswith("_w")]
    assert ps3_total and max(ps3_total) == pytest.approx(100.0, rel=0.05)
    assert results["wall"].streams[0]["model"] == "WT310E"
    assert results["wall"].line == 12


@pytest.mark.system
def test_cli_bench_check_reports_failures(emulated_bench: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "check", str(emulated_bench), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [d["ok"] for d in report["devices"]] == [True, True, True]
    broken = tmp_path / "broken.toml"
    broken.write_text('[[device]]\nkind = "powersensor3"\nport = "/dev/no-such-port"\n')
    assert main(["bench", "check", str(broken)]) == 1
    out = capsys.readouterr().out
    assert "[FAILED] ps3 (powersensor3, line 1)" in out and "/dev/no-such-port" in out


@pytest.mark.fast
def test_cli_bench_init(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bench.toml"
    assert main(["bench", "init", "-o", str(path)]) == 0
    assert path.read_text() == TEMPLATE
    assert main(["bench", "init", "-o", str(path)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["bench"]) == 2

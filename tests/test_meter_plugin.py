"""A meter added as a plugin, exactly as docs/meters.md's "Adding a meter" says.

Why the guide is read here: the modules installed and the entry point come from the page, so
a guide that drifts from what works fails this test. The toy meter's three modules live in
``tests/toy_meter/``; they are copied where the guide puts them, beside the ``.dist-info``
that ``pip install`` would write from the guide's ``pyproject.toml`` snippet, and every
command runs in a subprocess with that folder on its path, as an installed plugin would be
found (this process's own registry stays as shipped). The toy's driver is also tested here
as a plugin's driver test is written, with the helper wattlab ships (docs/testing-drivers.md).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import wattlab
from tests.conftest import ctrl_c, emulator_cli
from tests.toy_meter.toy_driver import ToyMeter, ToySample
from wattlab.errors import MeterProtocolError
from wattlab.testing import expected_protocol

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "meters.md"
WATTLAB_SRC = Path(wattlab.__file__).resolve().parents[1]
STEP_MODULE = re.compile(r"^\d+\. `([\w/]+\.py)`", re.M)  # "1. `toy_meter/toy_driver.py` —"
TOML_BLOCK = re.compile(r"^```toml\n(.*?)^```", re.M | re.S)
TOY_RATE = "(2.0 kB/s)"  # the toy's stream_rate, 50 rows/s of 41 bytes, as the disk check says


def guide() -> str:
    """The "Adding a meter" section of docs/meters.md, subsections included."""
    text = GUIDE.read_text(encoding="utf-8")
    start = text.index("## Adding a meter")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def guide_project() -> dict[str, Any]:
    """The guide's ``pyproject.toml`` snippet: the package and its ``wattlab.meters`` line."""
    (snippet,) = [b for b in TOML_BLOCK.findall(guide()) if "wattlab.meters" in b]
    project: dict[str, Any] = tomllib.loads(snippet)["project"]
    return project


def install(site: Path, project: dict[str, Any], modules: dict[str, str]) -> None:
    """What ``pip install`` leaves on the path: the modules, and a ``.dist-info`` folder with
    the package's metadata and its entry points (in the ``entry_points.txt`` format)."""
    for relpath, text in modules.items():
        (site / relpath).parent.mkdir(parents=True, exist_ok=True)
        (site / relpath).write_text(text, encoding="utf-8")
    name, version = project["name"], project["version"]
    dist_info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8")
    lines = []
    for group, entries in project["entry-points"].items():
        lines += [f"[{group}]", *(f"{key} = {value}" for key, value in entries.items()), ""]
    (dist_info / "entry_points.txt").write_text("\n".join(lines), encoding="utf-8")


def install_toy(site: Path) -> None:
    """The guide's steps: its three modules, then its one entry-point line."""
    modules = STEP_MODULE.findall(guide())
    assert len(modules) == 3, f"the guide should name three modules, names {modules}"
    shipped = sorted(p.name for p in (ROOT / "tests" / "toy_meter").glob("*.py"))
    assert shipped == sorted(Path(m).name for m in modules)  # nothing else is needed
    project = guide_project()
    (acquirer,) = project["entry-points"]["wattlab.meters"].values()
    assert f"{acquirer.replace('.', '/')}.py" in modules  # the line names the acquirer
    install(site, project, {m: (ROOT / "tests" / m).read_text(encoding="utf-8")
                            for m in modules})


@pytest.mark.fast
def test_the_toy_driver_in_three_lines() -> None:
    with expected_protocol(ToyMeter, [(b"READ?\n", b"7,12.000,1.5000\n")]) as toy:
        assert toy.read() == ToySample(count=7, voltage_v=12.0, current_a=1.5)


@pytest.mark.fast
def test_the_toy_driver_names_its_port_when_another_meter_answers() -> None:
    with (
        expected_protocol(ToyMeter, [(b"*IDN?\n", b"PMD-USB\n")], name="/dev/ttyUSB3") as toy,
        pytest.raises(MeterProtocolError, match="/dev/ttyUSB3: not a toy meter"),
    ):
        toy.identify()


def plugin_env(site: Path) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([str(WATTLAB_SRC), str(site)])}


def run(args: list[str], site: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` with the plugin's folder on the path, as a user's shell runs it."""
    return subprocess.run([sys.executable, *args], cwd=cwd, env={**os.environ,
                          **plugin_env(site)}, capture_output=True, text=True, timeout=90,
                          check=False)


def wattlab_cli(args: list[str], site: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run(["-m", "wattlab.cli", *args], site, cwd)


@pytest.fixture(scope="module")
def toy_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("site")
    install_toy(site)
    return site


@pytest.fixture(scope="module")
def toy_port(toy_site: Path) -> Iterator[str]:
    """``wattlab emulate toy``: the plugin's emulator, found through its registration."""
    with emulator_cli([sys.executable, "-m", "wattlab.cli", "emulate", "toy"],
                      plugin_env(toy_site)) as (proc, line):
        assert line.startswith("/dev/pts/"), "wattlab emulate toy printed no port"
        yield line.strip()
        assert ctrl_c(proc, 20) == 130  # docs/cli.md: 130 after Ctrl-C


@pytest.mark.system
def test_devices_recognises_the_toy_meter(toy_site: Path, toy_port: str, tmp_path: Path
                                          ) -> None:
    done = wattlab_cli(["devices", "--probe", toy_port, "--json"], toy_site, tmp_path)
    assert done.returncode == 0, done.stderr
    (found,) = [d for d in json.loads(done.stdout) if d["address"] == toy_port]
    assert (found["kind"], found["identity"], found["meter_spec"]) == (
        "toy", "TOY,METER,0001,1.0", f"toy:{toy_port}")


@pytest.mark.system
def test_a_bench_file_names_the_toy_meter(toy_site: Path, toy_port: str, tmp_path: Path
                                          ) -> None:
    bench = tmp_path / "bench.toml"
    bench.write_text(f'[[device]]\nkind = "toy"\nport = "{toy_port}"\ninterval_s = 0.05\n')
    done = wattlab_cli(["bench", "check", str(bench), "--json"], toy_site, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    (device,) = json.loads(done.stdout)["devices"]
    assert device["ok"] and device["kind"] == "toy"
    assert device["first_values"]["toy:voltage_v"] == 12.0
    bad = tmp_path / "bad.toml"
    bad.write_text(f'[[device]]\nkind = "toy"\nport = "{toy_port}"\ninterval_s = -1\n')
    done = wattlab_cli(["bench", "check", str(bad)], toy_site, tmp_path)
    assert done.returncode == 2 and "bad.toml:4" in done.stderr  # the registration's check


@pytest.mark.system
def test_record_writes_the_toy_meter_stream(toy_site: Path, toy_port: str, tmp_path: Path
                                            ) -> None:
    out = tmp_path / "run.h5"
    done = wattlab_cli(["record", "--meter", f"toy:{toy_port}", "--nvml", "none",
                        "--duration", "1", "--min-free-mb", "1e9", "-o", str(out)],
                       toy_site, tmp_path)
    assert done.returncode == 0, done.stderr
    assert TOY_RATE in done.stderr  # the disk check counted the rate the plugin declared
    with wattlab.open(str(out)) as recorded:
        view = recorded.source("toy")
        assert view.channel_names == ["voltage_v", "current_a", "power_w"]
        assert view.unit("power_w") == "W"
        values, counts = view.values, view.time_raw
    assert len(values) >= 10
    assert np.all(np.diff(counts) == 1)  # every reading the meter took, once
    assert np.all(values[:, 0] == 12.0)
    assert np.allclose(values[:, 2], values[:, 0] * values[:, 1])
    assert np.all((values[:, 2] > 0) & (values[:, 2] < 2000))  # a simulated GPU's power


@pytest.mark.system
def test_a_plugin_that_fails_to_import_is_named_and_left_out(tmp_path: Path) -> None:
    site = tmp_path / "site"
    install_toy(site)
    install(site, {"name": "broken-meter", "version": "0.2",
                   "entry-points": {"wattlab.meters": {"broken": "broken_meter.acquirer"}}},
            {"broken_meter/acquirer.py": "from broken_meter.driver import BrokenMeter\n"})
    warning = ("wattlab: warning: meter plugin 'broken = broken_meter.acquirer' "
               "(wattlab.meters entry point of broken-meter 0.2) was not loaded: "
               "ModuleNotFoundError: No module named 'broken_meter.driver' at "
               f"{site / 'broken_meter' / 'acquirer.py'}:1\n")
    done = wattlab_cli(["record", "--meter", "broken:/dev/null", "--nvml", "none",
                        "--duration", "1", "-o", str(tmp_path / "x.h5")], site, tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith(warning) and "Traceback" not in done.stderr
    assert "unknown meter kind 'broken'; known: " in done.stderr
    assert "powersensor3" in done.stderr and "toy" in done.stderr  # the others still work
    found = wattlab_cli(["devices", "--json"], site, tmp_path)
    assert found.returncode == 0 and found.stderr == warning
    assert isinstance(json.loads(found.stdout), list)


@pytest.mark.system
def test_a_plugin_taking_a_name_already_taken_is_left_out_whole(tmp_path: Path) -> None:
    module = ('from wattlab.acquisition.acquirers.meter_registry import MeterKind, register\n'
              'from wattlab.acquisition.acquirers.pmd_acquirer import KIND\n'
              'register(MeterKind(kind="pmd2", default_id="pmd2", help="", build=KIND.build,\n'
              '                   stream_rate=None))\n'
              'register(MeterKind(kind="elmor", default_id="pmd", help="", build=KIND.build,\n'
              '                   stream_rate=None, aliases=("pmd",)))\n')
    install(tmp_path, {"name": "dup-meter", "version": "0.3",
                       "entry-points": {"wattlab.meters": {"dup": "dup_meter.acquirer"}}},
            {"dup_meter/acquirer.py": module})
    done = run(["-c", "import json\n"
                      "from wattlab.acquisition.acquirers.meter_registry import meter_kinds\n"
                      "print(json.dumps({k: m.build.__module__ for k, m in "
                      "meter_kinds().items()}))"], tmp_path, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr == (
        "wattlab: warning: meter plugin 'dup = dup_meter.acquirer' (wattlab.meters entry "
        "point of dup-meter 0.3) was not loaded: ValueError: meter kind 'elmor': 'pmd' is "
        "taken by meter kind 'pmd' (wattlab.acquisition.acquirers.pmd_acquirer) at "
        f"{tmp_path / 'dup_meter' / 'acquirer.py'}:5\n")
    kinds = json.loads(done.stdout)
    assert kinds["pmd"] == "wattlab.acquisition.acquirers.pmd_acquirer"
    assert "pmd2" not in kinds and "elmor" not in kinds  # what it registered is taken back

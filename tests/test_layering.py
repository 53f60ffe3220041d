"""The structure docs/design.md promises, checked on the source (the import contracts
themselves run as `lint-imports` before pytest).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "wattlab"
# modules that exist only to run the simulated GPU: they may import it when imported
SIMULATOR_ONLY = {"acquisition/markers/simulated_phases.py", "layers/sim_backend.py"}
RUNTIME_EXEMPT = ("hardware/", "commands/")  # the simulators themselves; the CLI verbs


def module_level_imports(tree: ast.AST) -> list[ast.ImportFrom | ast.Import]:
    """Imports that run when the module is imported: not inside a function or lambda."""
    found: list[ast.ImportFrom | ast.Import] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                continue
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.ImportFrom | ast.Import):
                found.append(child)
            visit(child)

    visit(tree)
    return found


def imported_names(node: ast.ImportFrom | ast.Import) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    return [base] + [f"{base}.{a.name}" for a in node.names]


def simulator_imports_at_import_time(rel: str, source: str) -> list[str]:
    tree = ast.parse(source)
    return [f"{rel}:{n.lineno}" for n in module_level_imports(tree)
            if any(name.startswith("wattlab.hardware") for name in imported_names(n))]


@pytest.mark.system
def test_runtime_modules_import_no_simulator_when_imported() -> None:
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith(RUNTIME_EXEMPT) or rel in SIMULATOR_ONLY:
            continue
        offenders += simulator_imports_at_import_time(rel, path.read_text())
    assert offenders == [], ("runtime modules import a simulator at import time (import it "
                             f"inside the --simulate function instead): {offenders}")


@pytest.mark.fast
def test_the_check_sees_a_module_level_simulator_import() -> None:
    planted = ("from wattlab.hardware.simulated_gpu import SimulatedGpu\n"
               "def f():\n    from wattlab.hardware import fake_nvml\n")
    assert simulator_imports_at_import_time("x.py", planted) == ["x.py:1"]
    lazy = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from wattlab.hardware.simulated_gpu import SimulatedGpu\n")
    assert simulator_imports_at_import_time("x.py", lazy) == []


MAX_MODULES_PER_FOLDER = 15  # besides __init__/__main__; commands/ (one module per verb) aside
MAX_FUNCTION_LINES = 100
MAX_CLASS_LINES = 300
# emulators whose shape follows the instrument's command set: one handler per SCPI command
INSTRUMENT_SHAPED = {"hardware/emulators/hmc8015_emulator.py:Hmc8015Emulator",
                     "hardware/emulators/wt300e_emulator.py:Wt300eEmulator"}


def oversized(rel: str, source: str) -> list[str]:
    """Functions over 100 lines and classes over 300 in one module, as ``path:name lines``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        limit = (MAX_FUNCTION_LINES if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                 else MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else None)
        if limit is None or f"{rel}:{node.name}" in INSTRUMENT_SHAPED:
            continue
        lines = (node.end_lineno or node.lineno) - node.lineno + 1
        if lines > limit:
            found.append(f"{rel}:{node.name} {lines}")
    return found


@pytest.mark.system
def test_no_function_over_100_lines_and_no_class_over_300() -> None:
    found = [hit for path in sorted(SRC.rglob("*.py"))
             for hit in oversized(path.relative_to(SRC).as_posix(), path.read_text())]
    assert found == []


@pytest.mark.fast
def test_the_size_check_sees_a_long_function() -> None:
    def function(body_lines: int) -> str:
        return "def f():\n" + "".join(f"    x{i} = {i}\n" for i in range(body_lines))

    assert oversized("m.py", function(100)) == ["m.py:f 101"]
    assert oversized("m.py", function(99)) == []


@pytest.mark.fast
def test_no_package_folder_over_15_modules() -> None:
    crowded = {}
    for folder in [SRC, *(p for p in SRC.rglob("*") if p.is_dir())]:
        if folder.name in ("commands", "__pycache__") or not (folder / "__init__.py").exists():
            continue
        modules = [p for p in folder.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
        if len(modules) > MAX_MODULES_PER_FOLDER:
            crowded[folder.relative_to(SRC).as_posix()] = len(modules)
    assert crowded == {}


# modules outside their package's surface: run for the simulated GPU only, or as a program
OFF_SURFACE = {"wattlab.acquisition.markers.simulated_phases",
               "wattlab.acquisition.experiments.telegraph_on_gpu"}


# __all__ there is the user's API; their modules are imported one by one, so a program pays
# only for the framework it uses
USER_API = {"wattlab", "wattlab.integrations"}


def surface_packages() -> set[str]:
    """Packages whose ``__init__`` declares ``__all__`` (the rule of docs/design.md)."""
    return {".".join(("wattlab", *p.parent.relative_to(SRC).parts))
            for p in SRC.rglob("__init__.py") if "__all__" in p.read_text()} - USER_API


def imports_past_a_surface(module: str, source: str, packages: set[str]) -> list[str]:
    """``from pkg.module import name`` in a module outside ``pkg``, where pkg has a surface."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom) or not node.module:
            continue
        package = node.module.rpartition(".")[0]
        inside = module == package or module.startswith(package + ".")
        if package in packages and not inside and node.module not in OFF_SURFACE:
            found.append(f"{module}:{node.lineno} {node.module}")
    return found


@pytest.mark.system
def test_other_packages_import_through_a_package_surface() -> None:
    packages = surface_packages()
    found = []
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        module = ".".join(("wattlab", *parts[:-1])) if parts[-1] == "__init__" else ".".join(
            ("wattlab", *parts))
        found += imports_past_a_surface(module, path.read_text(), packages)
    assert found == []


@pytest.mark.fast
def test_the_surface_check_sees_an_import_past_it() -> None:
    source = "from wattlab.runfile.reader import Run\nfrom wattlab.runfile import Run\n"
    assert imports_past_a_surface("wattlab.analysis.x", source, {"wattlab.runfile"}) == [
        "wattlab.analysis.x:1 wattlab.runfile.reader"]
    assert imports_past_a_surface("wattlab.runfile.y", source, {"wattlab.runfile"}) == []


def shadowed_modules(exported: set[str], modules: set[str]) -> set[str]:
    """Names a package exports that are also its modules' names: the export hides the module."""
    return exported & modules


@pytest.mark.fast
def test_no_surface_name_hides_a_module() -> None:
    found = {}
    for init in SRC.rglob("__init__.py"):
        tree = ast.parse(init.read_text())
        exported = {elt.value for node in tree.body if isinstance(node, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
                    for elt in getattr(node.value, "elts", []) if isinstance(elt, ast.Constant)}
        modules = {p.stem for p in init.parent.glob("*.py")}
        if hidden := shadowed_modules(exported, modules):
            found[init.parent.relative_to(SRC).as_posix()] = hidden
    assert found == {}
    assert shadowed_modules({"calibrate", "Run"}, {"calibrate", "reader"}) == {"calibrate"}

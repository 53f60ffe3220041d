"""The structure docs/design.md promises, checked on the source (the import contracts
themselves run as `lint-imports` before pytest).
"""

from __future__ import annotations

import ast
from pathlib import Path

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


def test_runtime_modules_import_no_simulator_when_imported() -> None:
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith(RUNTIME_EXEMPT) or rel in SIMULATOR_ONLY:
            continue
        offenders += simulator_imports_at_import_time(rel, path.read_text())
    assert offenders == [], ("runtime modules import a simulator at import time (import it "
                             f"inside the --simulate function instead): {offenders}")


def test_the_check_sees_a_module_level_simulator_import() -> None:
    planted = ("from wattlab.hardware.simulated_gpu import SimulatedGpu\n"
               "def f():\n    from wattlab.hardware import fake_nvml\n")
    assert simulator_imports_at_import_time("x.py", planted) == ["x.py:1"]
    lazy = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from wattlab.hardware.simulated_gpu import SimulatedGpu\n")
    assert simulator_imports_at_import_time("x.py", lazy) == []

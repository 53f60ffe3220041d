#!/usr/bin/env python3
"""The code's shape against the structure issue's goals (issue 35), measured on the source.

    python bench/structure.py

Why a bench and not only tests: the tests hold each limit; this prints where the code
stands against them (largest function and class, fullest folder, cycles between
subpackages, contracts kept, files a new meter needs) and what `wattlab --help` costs to
start, so BENCHMARKS.md can show the numbers and later changes can be compared.
"""

from __future__ import annotations

import ast
import collections
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import RESULTS, machine

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "wattlab"


def sizes() -> dict[str, Any]:
    """Longest function and class, and the fullest package folder (commands/ aside)."""
    functions, classes = [], []
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                bucket = classes if isinstance(node, ast.ClassDef) else functions
                bucket.append((lines, f"{rel}:{node.name}"))
    folders = {d.relative_to(SRC).as_posix() or ".": len(
        [p for p in d.glob("*.py") if p.name not in ("__init__.py", "__main__.py")])
        for d in [SRC, *SRC.rglob("*")] if (d / "__init__.py").exists()}
    fullest = max((n, d) for d, n in folders.items() if d != "commands")
    return {"modules": sum(folders.values()), "packages": len(folders),
            "functions_over_100": sum(n > 100 for n, _ in functions),
            "classes_over_300": sum(n > 300 for n, _ in classes),
            "longest_function": max(functions), "longest_class": max(classes),
            "median_function_lines": statistics.median(n for n, _ in functions),
            "fullest_folder": fullest}


def subpackage_cycles() -> list[list[str]]:
    """Groups of subpackages that import each other (strongly connected), via grimp.

    Type-only imports are left out, as in the contracts: they never run.
    """
    import grimp

    graph = grimp.build_graph("wattlab", exclude_type_checking_imports=True)
    packages = {m for m in graph.modules if graph.find_children(m)}

    def owner(module: str) -> str:
        parts = module.split(".")
        for depth in range(len(parts), 0, -1):
            if ".".join(parts[:depth]) in packages:
                return ".".join(parts[:depth])
        return module

    edges = collections.defaultdict(set)
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            a, b = owner(module), owner(imported)
            if a != b and not b.startswith(a + ".") and not a.startswith(b + "."):
                edges[a].add(b)
    return [sorted(c) for c in strongly_connected(edges) if len(c) > 1]


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative enough for a package graph."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            found.append(component)

    for v in list(edges):
        if v not in index:
            visit(v)
    return found


def contracts() -> str:
    out = subprocess.run([str(Path(sys.executable).parent / "lint-imports")], cwd=ROOT,
                         capture_output=True, text=True)
    return next((line for line in out.stdout.splitlines() if line.startswith("Contracts:")),
                f"lint-imports failed: {out.stderr.strip()[-200:]}")


def help_start_s(repeats: int = 5) -> float:
    """Median wall time of `wattlab --help` in a fresh interpreter (start-up cost)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "wattlab.cli", "--help"], check=True,
                       capture_output=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    result = {"machine": machine(), "sizes": sizes(), "subpackage_cycles": subpackage_cycles(),
              "contracts": contracts(), "help_start_s": help_start_s()}
    s = result["sizes"]
    rows = [("modules / packages", f"{s['modules']} / {s['packages']}"),
            ("functions > 100 lines", s["functions_over_100"]),
            ("classes > 300 lines", s["classes_over_300"]),
            ("longest function", f"{s['longest_function'][1]} ({s['longest_function'][0]})"),
            ("longest class", f"{s['longest_class'][1]} ({s['longest_class'][0]})"),
            ("median function lines", s["median_function_lines"]),
            ("fullest folder (commands/ aside)",
             f"{s['fullest_folder'][1]} ({s['fullest_folder'][0]} modules)"),
            ("subpackage cycles", len(result["subpackage_cycles"])),
            ("import contracts", result["contracts"]),
            ("wattlab --help start-up (median of 5)", f"{result['help_start_s']:.2f} s")]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "structure.json").write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

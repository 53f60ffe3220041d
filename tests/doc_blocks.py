"""The docs as tests: the command and Python blocks of README.md and docs/*.md, run as shown.

Why Sybil: it is a maintained doc-testing library whose Markdown lexer finds fenced blocks
and HTML-comment directives with their line numbers, and which takes custom parsers; our
blocks are shell sessions (``$ wattlab ...`` then the output) that doctest cannot run.

A block runs when its language is ``console``/``sh``/``bash``/``shell``/``python``, when
it starts with ``$ ``, or with no language when it starts with ``wattlab `` (command lines).
In a ``console`` block (or one starting ``$ ``) each ``$ `` line is a command and the lines
up to the next one are its shown output, compared after masking (ports, pty names, paths,
dates, host); in other blocks every line is a command, output not shown.
An HTML comment just above a block sets how it runs::

    <!-- doctest: skip: needs a GPU -->       not run; the reason is reported
    <!-- doctest: tolerance 2% -->            numbers may differ by 2 % (default: exactly)
    <!-- doctest: exit 1 -->                  the last command's exit status ("exit 0 or 2":
                                                either, where a real-time run decides)
    <!-- doctest: timeout 90 -->              seconds per command (default 60)
    <!-- doctest: file demo.h5 = tests/data/demo/demo24.h5 -->   copied in before the block
    <!-- doctest: lossy -->                     real-time emulators: an exit 1 that says
                                                "data was lost" (a loaded machine) is
                                                reported as skipped, not compared

and one line anywhere in a page, ``<!-- doctest: skip-file: REASON -->``, leaves the whole
page unchecked, counted. Blocks of a page run in order in one temporary folder of their own
(a page's commands build on each other, as a reader runs them). A shown line ``…`` stands
for any lines. ``WATTLAB_DOCS_UPDATE=1`` rewrites the shown outputs with what ran.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from sybil import Document, Region
from sybil.parsers.markdown.lexers import RawFencedCodeBlockLexer

ROOT = Path(__file__).resolve().parents[1]
RUNNABLE = {"console", "sh", "bash", "shell", "python"}
UPDATE_ENV = "WATTLAB_DOCS_UPDATE"
DEFAULT_TIMEOUT_S = 60.0
ELLIPSIS = {"…", "..."}

_INFO = re.compile(r"(?P<language>[\w+-]*)[^\n]*$\n", re.M)
_DIRECTIVE = re.compile(r"<!--\s*doctest:\s*(?P<body>.*?)\s*-->")
_SKIP_FILE = re.compile(r"<!--\s*doctest:\s*skip-file:\s*(?P<reason>.*?)\s*-->")
_COMMAND_LINE = re.compile(r"wattlab [a-z][a-z-]*(\s|$)")  # not output such as "wattlab live:"
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_MASKS = [
    (re.compile(r"/dev/pts/\d+"), "/dev/pts/N"),
    (re.compile(r"(127\.0\.0\.1|localhost)(::?)\d+"), r"\1\2PORT"),
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:[+-]\d\d:\d\d|Z)?(?: on \S+)?"),
     "DATE"),
    (re.compile(r"(?<![\w.])/(?:tmp|var|private)/\S*/"), "DIR/"),
]


@dataclass
class Block:
    """One fenced block: where it is, what it runs, and how (from its directive)."""

    path: Path
    line: int
    language: str
    source: str
    source_start: int  # offset of the source in the page's text
    skip: str | None = None
    tolerance: float = 0.0
    exit_statuses: tuple[int, ...] = (0,)
    timeout_s: float = DEFAULT_TIMEOUT_S
    files: dict[str, str] = field(default_factory=dict)  # name in the folder -> repo path
    lossy: bool = False

    @property
    def runnable(self) -> bool:
        return (self.language in RUNNABLE or self.source.startswith("$ ")
                or (self.language == "" and _COMMAND_LINE.match(self.source) is not None))

    def commands(self) -> list[tuple[str, list[str]]]:
        """(command, shown output lines) in order; ``sh`` lines show no output."""
        if self.language == "python":
            return []
        if not self.source.startswith("$ ") and self.language != "console":
            return [(line, []) for line in _joined_lines(self.source)
                    if line.strip() and not line.lstrip().startswith("#")]
        steps: list[tuple[str, list[str]]] = []
        for line in self.source.rstrip("\n").split("\n"):
            if line.startswith("$ "):
                steps.append((line[2:], []))
            elif steps:
                steps[-1][1].append(line)
        return steps


def _joined_lines(source: str) -> list[str]:
    return source.replace("\\\n", " ").split("\n")


def _apply(block: Block, body: str) -> None:
    if body.startswith("skip:"):
        block.skip = body.removeprefix("skip:").strip()
    elif m := re.fullmatch(r"tolerance\s+([\d.]+)\s*%", body):
        block.tolerance = float(m.group(1)) / 100
    elif m := re.fullmatch(r"exit\s+(\d+(?:\s+or\s+\d+)*)", body):
        block.exit_statuses = tuple(int(n) for n in m.group(1).split(" or "))
    elif m := re.fullmatch(r"timeout\s+([\d.]+)", body):
        block.timeout_s = float(m.group(1))
    elif m := re.fullmatch(r"file\s+(\S+)\s*=\s*(\S+)", body):
        block.files[m.group(1)] = m.group(2)
    elif body == "lossy":
        block.lossy = True
    elif not body.startswith("skip-file:"):
        raise ValueError(f"unknown doctest directive {body!r}")


def _directives_above(text: str, start: int) -> list[str]:
    """The ``doctest:`` comments on the lines just above ``start`` (blank lines allowed)."""
    found: list[str] = []
    for line in reversed(text[:start].rstrip("\n").split("\n")):
        if not line.strip():
            continue
        m = _DIRECTIVE.fullmatch(line.strip())
        if m is None:
            break
        found.extend(part.strip() for part in m.group("body").split(";"))
    return found


class BlockParser:
    """A Sybil parser: one region per fenced block, its ``parsed`` the ``Block``."""

    def __init__(self) -> None:
        self.lexer = RawFencedCodeBlockLexer(info_pattern=_INFO)

    def __call__(self, document: Document) -> Iterable[Region]:
        for region in self.lexer(document):
            source = region.lexemes["source"]
            start = region.start + source.offset
            block = Block(Path(document.path), document.text.count("\n", 0, region.start) + 1,
                          region.lexemes["language"], str(source), start)
            for body in _directives_above(document.text, region.start):
                _apply(block, body)
            region.parsed = block
            yield region


def page_blocks(path: Path) -> list[Block]:
    """Every fenced block of a page, in order, parsed by Sybil."""
    document = Document.parse(str(path), BlockParser())
    return [example.parsed for example in document]


def skip_file_reason(path: Path) -> str | None:
    m = _SKIP_FILE.search(path.read_text(encoding="utf-8"))
    return m.group("reason") if m else None


def mask(text: str, folder: Path | None = None) -> str:
    if folder is not None:
        text = text.replace(str(folder) + "/", "DIR/").replace(str(folder), "DIR")
    for pattern, replacement in _MASKS:
        text = pattern.sub(replacement, text)
    return text


def _line_matches(shown: str, got: str, tolerance: float) -> bool:
    shown_numbers, got_numbers = _NUMBER.findall(shown), _NUMBER.findall(got)
    if (" ".join(_NUMBER.sub("#", shown).split()) != " ".join(_NUMBER.sub("#", got).split())
            or len(shown_numbers) != len(got_numbers)):
        return False
    for a, b in zip(shown_numbers, got_numbers, strict=True):
        if a == b:
            continue
        if tolerance == 0:
            return False
        x, y = float(a), float(b)
        # printed rounding aside: half a unit of each number's last digit
        if abs(x - y) > tolerance * max(abs(x), abs(y)) + (_last_digit(a) + _last_digit(b)) / 2:
            return False
    return True


def _last_digit(number: str) -> float:
    mantissa, _, exponent = number.lower().partition("e")
    if "." not in mantissa:
        return 0.0  # an integer is a count, not a rounding
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exponent or 0) - decimals)


def output_differs(shown: list[str], got: list[str], tolerance: float) -> bool:
    """Whether the output ``got`` (masked) differs from the ``shown`` lines (masked) beyond
    ``tolerance``; a shown ``…`` line stands for any lines."""
    cut = next((i for i, line in enumerate(shown) if line.strip() in ELLIPSIS), None)
    if cut is None:
        head, tail = shown, []
        if len(got) != len(shown):
            return True
    else:
        head, tail = shown[:cut], shown[cut + 1:]
        if len(got) < len(head) + len(tail):
            return True
    pairs = list(zip(head, got[:len(head)], strict=True))
    if tail:
        pairs += list(zip(tail, got[len(got) - len(tail):], strict=True))
    return any(not _line_matches(mask(a), b, tolerance) for a, b in pairs)


def updated_output(shown: list[str], got: list[str]) -> list[str]:
    """What the update mode writes: ``got``, elided where ``shown`` elides."""
    cut = next((i for i, line in enumerate(shown) if line.strip() in ELLIPSIS), None)
    if cut is None:
        return got
    tail = len(shown) - cut - 1
    return [*got[:cut], shown[cut], *(got[len(got) - tail:] if tail else [])]


Start = Callable[..., "subprocess.Popen[str]"]


@dataclass
class PageRun:
    """Runs a page's blocks in one folder; collects failures, skips and rewrites."""

    folder: Path
    start: Start
    failures: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # by a skip directive
    not_compared: list[str] = field(default_factory=list)  # lossy blocks on a loaded machine
    rewrites: list[tuple[int, int, str]] = field(default_factory=list)  # (start, end, text)

    def env(self) -> dict[str, str]:
        shims = self.folder.parent / f"{self.folder.name}-bin"
        shims.mkdir(exist_ok=True)
        # -P: as the installed `wattlab` script, the current folder is not on the path
        for name, line in (("wattlab", f"exec {shlex.quote(sys.executable)} -P -m wattlab.cli"),
                           ("python", f"exec {shlex.quote(sys.executable)}"),
                           ("python3", f"exec {shlex.quote(sys.executable)}")):
            shim = shims / name
            shim.write_text(f'#!/bin/sh\n{line} "$@"\n')
            shim.chmod(0o755)
        return {**os.environ, "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}",
                "PYTHONPATH": str(ROOT / "src"), "PYTHONUNBUFFERED": "1", "COLUMNS": "100"}

    def run_command(self, command: str, timeout_s: float) -> tuple[int, str]:
        proc = self.start(["bash", "-c", command], cwd=self.folder, env=self.env(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            return -1, f"{out}\n(timed out after {timeout_s:g} s)"
        return proc.returncode, out

    def run(self, block: Block) -> None:
        shown_path = block.path.relative_to(ROOT) if block.path.is_relative_to(ROOT) else block.path
        where = f"{shown_path}:{block.line}"
        if block.skip is not None:
            self.skipped.append(f"{where}: {block.skip}")
            return
        for name, source in block.files.items():
            (self.folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / source, self.folder / name)
        if block.language == "python":
            snippet = self.folder / f"snippet_{block.line}.py"
            snippet.write_text(block.source)
            steps: list[tuple[str, list[str]]] = [(f"python {snippet.name}", [])]
        else:
            steps = block.commands()
        offset = block.source_start
        for i, (command, shown) in enumerate(steps):
            offset += len(f"$ {command}\n")
            status, out = self.run_command(command, block.timeout_s)
            got = mask(out, self.folder).rstrip("\n").split("\n") if out.strip() else []
            expected = block.exit_statuses if i == len(steps) - 1 else (0,)
            if block.lossy and status == 1 and "data was lost" in out:
                self.not_compared.append(f"{where}: `{command}` lost data on this loaded machine; "
                                    "its output was not compared")
                continue
            if "Traceback (most recent call last)" in out or status not in expected:
                self.failures.append(f"{where}: `{command}` exited {status} "
                                     f"(expected {' or '.join(map(str, expected))}):\n"
                                     f"{out[-3000:]}")
                return
            if shown and output_differs(shown, got, block.tolerance):
                self.failures.append(f"{where}: `{command}` printed\n" + "\n".join(got)
                                     + "\nwhere the page shows\n" + "\n".join(shown))
                new = "\n".join(updated_output(shown, got)) + "\n"
                length = len("\n".join(shown)) + 1
                self.rewrites.append((offset, offset + length, new))
            offset += sum(len(line) + 1 for line in shown)


def rewrite(path: Path, rewrites: list[tuple[int, int, str]]) -> None:
    """Replace the shown outputs in the page (the update mode)."""
    text = path.read_text(encoding="utf-8")
    for start, end, new in sorted(rewrites, reverse=True):
        text = text[:start] + new + text[end:]
    path.write_text(text, encoding="utf-8")


def unchecked_count(path: Path) -> int:
    return sum(block.runnable for block in page_blocks(path))


def run_page(path: Path, folder: Path, start: Start) -> PageRun:
    page = PageRun(folder, start)
    for block in page_blocks(path):
        if block.runnable:
            page.run(block)
    if page.rewrites and os.environ.get(UPDATE_ENV) == "1":
        rewrite(path, page.rewrites)
    return page


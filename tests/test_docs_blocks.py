"""Every command and Python block of README.md and docs/*.md runs as written, and prints
what the page shows (tests/doc_blocks.py says how blocks are read and compared).

Why: the README said "every output below is real" while ``record --simulate --seed 11``
printed other joules; a page checked by hand goes stale at the next change of a number.
``WATTLAB_DOCS_UPDATE=1`` rewrites the shown outputs from what ran (then read the diff).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.doc_blocks import (
    ROOT,
    mask,
    output_differs,
    page_blocks,
    run_page,
    skip_file_reason,
    unchecked_count,
    updated_output,
)

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.system
@pytest.mark.timeout(300)
@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_runs_as_shown(page: Path, tmp_path: Path, spawn: object) -> None:
    reason = skip_file_reason(page)
    if reason is not None:
        pytest.skip(f"{unchecked_count(page)} runnable block(s) not run: {reason}")
    folder = tmp_path / "page"
    folder.mkdir()
    result = run_page(page, folder, spawn)  # type: ignore[arg-type]
    assert result.failures == [], "\n\n".join(result.failures)
    if result.not_compared:
        pytest.skip("; ".join(result.not_compared))


@pytest.mark.fast
def test_numbers_compare_exactly_unless_a_tolerance_is_written() -> None:
    shown = ["gpu0.energy     3   4593.87   0"]
    assert output_differs(shown, ["gpu0.energy     3   4554.92   0"], 0.0)
    assert not output_differs(shown, ["gpu0.energy  3  4593.87  0"], 0.0)  # spacing only
    assert not output_differs(shown, ["gpu0.energy     3   4554.92   0"], 0.01)
    assert output_differs(shown, ["gpu0.energy     3   4554.92   1"], 0.01)  # 0 vs 1
    assert output_differs(shown, ["gpu0.power      3   4593.87   0"], 0.01)  # the text
    assert not output_differs(["rate 0.20"], ["rate 0.19"], 0.05)  # rounding of 0.195..0.2
    assert output_differs(["rate 0.20"], ["rate 0.18"], 0.05)


@pytest.mark.fast
def test_ports_ptys_paths_and_dates_are_masked(tmp_path: Path) -> None:
    got = mask(f"PowerSensor3 (/dev/pts/7) WT310E (TCPIP::127.0.0.1::41234::SOCKET) "
               f"figure: {tmp_path}/demo.png created 2026-11-28T10:01:02.123+00:00 on box")
    shown = ("PowerSensor3 (/dev/pts/0) WT310E (TCPIP::127.0.0.1::46071::SOCKET) "
             "figure: /tmp/tour/demo.png created 2026-11-24T23:31:31.527597+00:00 on vm")
    assert not output_differs([shown], [got], 0.0)


@pytest.mark.fast
def test_an_ellipsis_stands_for_any_lines_and_survives_an_update() -> None:
    shown = ["head 1", "…", "last 3"]
    assert not output_differs(shown, ["head 1", "a", "b", "last 3"], 0.0)
    assert not output_differs(shown, ["head 1", "last 3"], 0.0)
    assert output_differs(shown, ["head 2", "a", "last 3"], 0.0)
    assert updated_output(shown, ["head 2", "a", "last 4"]) == ["head 2", "…", "last 4"]


@pytest.mark.fast
def test_directives_and_steps_are_read_from_the_page(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("text\n\n<!-- doctest: tolerance 2% -->\n<!-- doctest: exit 1 or 2 -->\n"
                    "```console\n$ wattlab energy a.h5\nline 1\nline 2\n$ ls\n```\n\n"
                    "<!-- doctest: skip: needs a GPU -->\n```sh\nwattlab record --nvml 0 \\\n"
                    "  -o run.h5\n# a comment\n```\n\n```\nplain output\n```\n"
                    "```python\nprint(1)\n```\n"
                    "```\nwattlab energy x.h5\n```\n```\nwattlab live: x.h5\n```\n")
    console, sh, plain, python, bare_command, bare_output = page_blocks(page)
    assert bare_command.runnable and not bare_output.runnable
    assert (console.line, console.tolerance, console.exit_statuses) == (5, 0.02, (1, 2))
    assert console.commands() == [("wattlab energy a.h5", ["line 1", "line 2"]), ("ls", [])]
    assert sh.skip == "needs a GPU"
    assert sh.commands() == [("wattlab record --nvml 0    -o run.h5", [])]
    assert not plain.runnable and python.runnable


@pytest.mark.system
def test_a_stale_output_fails_and_the_update_mode_rewrites_it(
        tmp_path: Path, spawn: object, monkeypatch: pytest.MonkeyPatch) -> None:
    page = tmp_path / "page.md"
    folder = tmp_path / "page"
    folder.mkdir()
    page.write_text("```console\n$ echo 4593.87 J\n4593.87 J\n$ echo 2\n2\n```\n")
    assert run_page(page, folder, spawn).failures == []  # type: ignore[arg-type]
    page.write_text("```console\n$ echo 4554.92 J\n4593.87 J\n$ echo 2\n1\n```\n")
    monkeypatch.setenv("WATTLAB_DOCS_UPDATE", "1")
    failures = run_page(page, folder, spawn).failures  # type: ignore[arg-type]
    assert len(failures) == 2 and f"{page}:1" in failures[0]
    assert page.read_text() == "```console\n$ echo 4554.92 J\n4554.92 J\n$ echo 2\n2\n```\n"

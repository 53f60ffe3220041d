"""The README and docs/ stand alone: every link resolves inside the repository.

Why a test: pages move (the README was split into docs/), and a link to a page or heading
that no longer exists, or to a file outside the checkout, is only noticed by a reader.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
_TEAM_FOLDER = re.compile(r"\.\.[/\\]shared")  # the project's folder beside the checkout


def _prose(text: str) -> str:
    """The page without code blocks: a link shown as code is not a link."""
    return _FENCE.sub("", text)


def links(text: str) -> list[str]:
    return _LINK.findall(_CODE_SPAN.sub("", _prose(text)))


def anchor(heading: str) -> str:
    """The anchor a heading gets on GitHub: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in _HEADING.findall(_prose(page.read_text(encoding="utf-8"))):
        base = anchor(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """Every link of ``page`` that leaves the repository, names no file, or no heading."""
    problems = []
    for target in links(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            problems.append(f"{target}: points outside the repository")
            continue
        path_part, _, fragment = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.is_relative_to(root.resolve()):
            problems.append(f"{target}: points outside the repository")
        elif not dest.exists():
            problems.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            problems.append(f"{target}: no heading #{fragment} in {dest.name}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves_inside_the_repository(page: Path) -> None:
    assert broken_links(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_points_at_the_team_folder(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert not _TEAM_FOLDER.search(text), "the team folder is outside the repository"
    assert "shared/data" not in text, "real data lives in tests/data/"


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {(ROOT / t.partition("#")[0]).resolve()
              for t in links((ROOT / "README.md").read_text(encoding="utf-8"))}
    missing = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert missing == [], f"docs pages the README does not link: {missing}"


def test_the_readme_test_command_is_what_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()[-1]
    blocks = re.findall(r"^```sh\n(.*?)^```", (ROOT / "README.md").read_text(encoding="utf-8"),
                        re.S | re.M)
    assert ci in [b.strip() for b in blocks], f"README lacks the CI command {ci!r}"


def test_the_checker_finds_what_is_broken(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "there.md").write_text("# A page: with `code`\n\n## Second one\n")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/there.md) [ok](docs/there.md#a-page-with-code) [ok](#top)\n"
        "[gone](docs/missing.md) [bad anchor](docs/there.md#third) [up](../outside.md)\n"
        "[web](https://example.org) `[in code](docs/nowhere.md)`\n\n# Top\n"
        "```\n[in a block](docs/nowhere.md)\n```\n"
    )
    (tmp_path.parent / "outside.md").write_text("x")
    assert broken_links(page, tmp_path) == [
        "docs/missing.md: no such file",
        "docs/there.md#third: no heading #third in there.md",
        "../outside.md: points outside the repository",
        "https://example.org: points outside the repository",
    ]

"""The real data ships with the repository, and nothing reads data from outside it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests import data_files

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[1]
NAMED = [getattr(data_files, name) for name in dir(data_files)
         if name.isupper() and isinstance(getattr(data_files, name), Path)]


@pytest.mark.parametrize("path", NAMED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_named_data_file_is_in_the_checkout(path: Path) -> None:
    assert path.exists(), f"{path} is named in tests/data_files.py but missing"


def test_each_published_folder_carries_its_licence() -> None:
    for folder in data_files.PUBLIC.iterdir():
        assert (folder / "LICENSE").is_file(), f"{folder}: no LICENSE beside the data"


def test_a_missing_file_fails_instead_of_skipping() -> None:
    with pytest.raises(FileNotFoundError, match="missing from the repository"):
        data_files.data_file("no/such/file.csv")
    assert data_files.data_file("h100_nvml_seed11.npz") == data_files.H100_CAPTURE


def test_nothing_in_the_repository_reads_the_team_folder() -> None:
    outside = re.compile(r"\.\./shared|parents\[2\]\s*/\s*\"shared\"")
    offenders = []
    for folder in ("src", "tests", "bench", "docs"):
        for path in (ROOT / folder).rglob("*"):
            text = (path.read_text(encoding="utf-8", errors="replace")
                    if path.suffix in {".py", ".md", ".sh", ".toml"} and path != Path(__file__)
                    else "")
            if outside.search(text):
                offenders.append(str(path.relative_to(ROOT)))
    for path in (ROOT / "README.md", ROOT / "BENCHMARKS.md"):
        if "../shared" in path.read_text(encoding="utf-8"):
            offenders.append(path.name)
    assert not offenders, f"these read data from outside the repository: {offenders}"

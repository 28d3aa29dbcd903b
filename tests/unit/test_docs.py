"""The README and the docs site link only to what is there: the site's own check (`make docs`,
mkdocs --strict) covers the pages; the README, outside the site, is checked here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")


def relative_links(text: str) -> list[str]:
    return [m[1] for m in LINK.finditer(text) if "://" not in m[1]]


@pytest.mark.parametrize("page", ["README.md"])
def test_every_relative_link_of_the_readme_leads_to_a_file(page: str) -> None:
    links = relative_links((ROOT / page).read_text())
    assert links, "the README sends its reader to the docs"
    missing = [link for link in links if not (ROOT / link).is_file()]
    assert not missing, missing


def test_the_readme_is_an_introduction_and_the_reference_is_in_the_docs() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "make demo" in readme
    assert "make test" in readme
    assert len(readme.splitlines()) < 120
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    listed = set(re.findall(r":\s+([\w-]+\.md)\s*$", nav, flags=re.M))
    assert pages == listed, pages ^ listed

"""The README stays short and its pages are there: at most 150 lines, and every relative link of the
README and of docs/ names a file of the repository (a page moved or renamed fails here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from support import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_is_read_in_five_minutes():
    assert len((REPO / "README.md").read_text().splitlines()) <= 150


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_names_a_file(page):
    targets = [t for t in LINK.findall(page.read_text()) if not re.match(r"^[a-z]+:", t)]
    missing = [t for t in targets if not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(REPO)} links to {missing}"


def test_the_readme_links_every_docs_page():
    linked = {Path(t).name for t in LINK.findall((REPO / "README.md").read_text())}
    assert {p.name for p in PAGES[1:]} <= linked

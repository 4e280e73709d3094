"""The tests' own layout holds: every helper (a function, class or fixture that is not a test) is defined
in one test file only, shared ones in tests/support/; and every test module sits in a tier folder."""

from __future__ import annotations

import ast
from collections import defaultdict

from support import REPO

TESTS = REPO / "tests"
TIERS = {"unit", "integration", "attacks", "e2e"}
# a fixture given again on purpose: the module runs another module's tests with its own version of it
OVERRIDES = {("secure", "e2e/test_cluster_secure.py")}  # test_security's checks, on a 3-node cluster


def helpers(tree: ast.Module) -> set[str]:
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and not n.name.startswith(("test_", "Test", "pytest_"))}


def test_no_helper_is_defined_in_two_test_files():
    where = defaultdict(list)
    for path in sorted(TESTS.rglob("*.py")):
        for name in helpers(ast.parse(path.read_text())):
            if (name, str(path.relative_to(TESTS))) not in OVERRIDES:
                where[name].append(str(path.relative_to(TESTS)))
    twice = {name: files for name, files in where.items() if len(files) > 1}
    assert not twice, f"defined in more than one file (put it in tests/support/ once): {twice}"


def test_every_test_module_is_in_a_tier_folder():
    misplaced = [str(p.relative_to(TESTS)) for p in TESTS.rglob("test_*.py") if p.relative_to(TESTS).parts[0] not in TIERS]
    assert not misplaced, misplaced

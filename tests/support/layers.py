"""layers: shared by the tests (tests/support: every helper defined once)."""

from __future__ import annotations

from pathlib import Path

from support import REPO


def module_name(path: Path) -> str:
    rel = path.relative_to(REPO)
    package = next(name for name, folder in FOLDERS.items() if rel.parts[0] == folder)
    parts = (*package.split("."), *rel.with_suffix("").parts[1:])
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def resolve(name: str) -> str | None:
    """The project module an import names (its longest dotted prefix that is one), else None."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in MODULES:
            return ".".join(parts[:n])
    return None


# the installed package's folders (pyproject's package-dir): runledger.<name> lives in <name>/ at the root
FOLDERS = {"runledger": "runledger", "runledger.ledger": "ledger", "runledger.queries": "queries",
           "runledger.training": "training", "runledger.agents": "agents", "runledger.ui": "ui",
           "runledger.interop": "interop", "runledger.tools": "tools", "bench": "bench"}


MODULES = {module_name(p): p for folder in FOLDERS.values() for p in sorted((REPO / folder).rglob("*.py"))}

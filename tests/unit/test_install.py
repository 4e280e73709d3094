"""The installed package as a user gets it: one import name (`runledger`), a base install without JAX,
optax, orbax or scipy that still logs, queries, verifies, replays and serves the dashboard, beside
OpenAI's Agents SDK (whose import name is `agents`) and beside a script's own `tools/`, `training/`,
`ledger/` and `agents/` folders; a command whose extra is missing says which, in one line.

The fresh-venv test installs from PyPI (pip's cache makes it about a minute): it is what `pip install .`
from a clone does, nothing of this checkout's own venv is used.
"""

from __future__ import annotations


def test_the_wheel_lists_every_package_folder():
    """Each folder of the package (an __init__.py) is in pyproject's packages, so `pip install .` ships it
    (a folder left out installs fine and fails on its first import: the transparency log once did)."""
    import tomllib
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    tools = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(tools["packages"])
    folders = {}
    for name, folder in tools["package-dir"].items():
        for init in (repo / folder).rglob("__init__.py"):
            sub = init.parent.relative_to(repo / folder).parts
            folders[".".join((name, *sub))] = init.parent
    missing = {n for n in folders if n not in listed}
    assert not missing, f"package folders pyproject does not ship: {sorted(missing)}"

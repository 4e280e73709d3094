"""The layers run one way, `runledger.ledger` <- `runledger.queries` <- `runledger.training` / `agents` /
`ui` / `interop` / the logging API <- `runledger.tools` (then `bench`), with no cycles; inside `runledger.ledger`
the concept folders run `contract` <- `storage` / `bus` <- `emit` / `check` <- `decisions` / `ingest` <- the
embedded default (`local`); no module imports the command line, and none uses another module's private names.
Read from the source's imports (ast), every import counted, a function's deferred ones too.
"""

from __future__ import annotations

import ast

import pytest

from support import REPO
from support.layers import MODULES, resolve

RANK = {"runledger.ledger": 0, "runledger.queries": 1, "runledger.training": 2, "runledger.agents": 2, "runledger": 2,
        "runledger.ui": 2, "runledger.interop": 2, "runledger.tools": 3, "bench": 4}
# inside runledger.ledger: its concept folders, and its top modules (settings, redact, local, storing) by name
LEDGER_RANK = {"redact": 0, "contract": 1, "settings": 1, "storage": 2, "bus": 2, "emit": 3, "check": 3,
               "tlog": 4, "attest": 5, "decisions": 5, "ingest": 5, "push": 5, "local": 6, "storing": 7,
               # the transparency log's signed notes and the chain heads signed with them import nothing of the
               # ledger: below emit (producers sign their chains) and check (verify checks them)
               "tlog.note": 2, "tlog.chainheads": 2.5}
ENTRY = "runledger.tools.cli"  # the command line: what a user runs, imported by no module


def layer(module: str) -> str:
    """The layer a module is in: the longest package of RANK that holds it."""
    return max((name for name in RANK if module == name or module.startswith(name + ".")), key=len)


def imports_of(module: str) -> dict[str, int]:
    """The project modules `module` imports, each with the line of its first import."""
    tree = ast.parse(MODULES[module].read_text())
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level-1 steps
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            names = [f"{base}.{a.name}" for a in node.names]  # a submodule, else resolve() takes the module
        elif (isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)) and node.args
              and getattr(node.func, "id", getattr(node.func, "attr", "")) in ("__import__", "import_module")
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names = [node.args[0].value]
        for name in names:
            target = resolve(name)
            if target is not None and target != module:
                found.setdefault(target, node.lineno)
    return found


@pytest.fixture(scope="module")
def graph() -> dict:
    """Each module's imports (read once, when a test asks: not while pytest collects, in every worker)."""
    return {m: imports_of(m) for m in MODULES}


def test_the_graph_is_read(graph):
    """A sanity check of the reader: arrows that exist are seen (else the tests below pass on nothing)."""
    assert "runledger.ledger.contract.events" in graph["runledger.ledger.storage.rows"]
    assert "runledger.queries" in graph["runledger.queries.audit"]
    assert "runledger.tools.train" in graph["runledger.tools.cli"]
    assert len(MODULES) > 40


def test_imports_run_down_the_layers(graph):
    wrong = [f"{MODULES[m].relative_to(REPO)}:{line} imports {t}"
             for m, targets in graph.items() for t, line in targets.items()
             if (a := layer(m)) != (b := layer(t)) and RANK[b] >= RANK[a]]
    assert not wrong, "imports against ledger <- queries <- training / agents / ui / interop <- tools:\n" + "\n".join(wrong)


def ledger_part(module: str) -> str | None:
    """A runledger.ledger module's concept folder (or its top module's name); None outside the ledger."""
    parts = module.split(".")
    if parts[:2] == ["runledger", "ledger"] and ".".join(parts[2:4]) in LEDGER_RANK:  # (a module ranked apart from its folder)
        return ".".join(parts[2:4])
    return parts[2] if parts[:2] == ["runledger", "ledger"] and len(parts) > 2 else None


def test_the_ledgers_folders_run_down_their_layers(graph):
    assert set(LEDGER_RANK) == {ledger_part(m) for m in MODULES if ledger_part(m)}, "a ledger folder without a rank"
    wrong = [f"{MODULES[m].relative_to(REPO)}:{line} imports {t}"
             for m, targets in graph.items() for t, line in targets.items()
             if (a := ledger_part(m)) and (b := ledger_part(t)) and a != b and LEDGER_RANK[b] >= LEDGER_RANK[a]]
    assert not wrong, "imports against the ledger's folders (see LEDGER_RANK):\n" + "\n".join(wrong)


def test_no_module_imports_the_command_line(graph):
    wrong = [f"{MODULES[m].relative_to(REPO)}:{line}" for m, targets in graph.items()
             for t, line in targets.items() if t == ENTRY]
    assert not wrong, f"{ENTRY} is imported by: " + ", ".join(wrong)


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles(graph):
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}}, [["a", "b", "c"]]),
    ({"a": {"b": 1}, "b": {}}, []),
])
def test_a_cycle_is_found(graph, expected):
    assert cycles(graph) == expected


def private_uses(module: str) -> list[tuple[int, str]]:
    """Where `module` uses another project module's private name (`_name`): `from M import _name`, or
    `alias._name` where alias is an imported project module (`from runledger import queries` ...
    `queries._scan_files`)."""
    tree = ast.parse(MODULES[module].read_text())
    aliases: dict[str, str] = {}
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and resolve(node.module):
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__"):
                    found.append((node.lineno, f"{node.module}.{a.name}"))
                if f"{node.module}.{a.name}" in MODULES:
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in MODULES:
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            value, chain = node.value, []
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in aliases:
                owner = ".".join([aliases[value.id], *reversed(chain)])
                if owner in MODULES and owner != module:
                    found.append((node.lineno, f"{owner}.{node.attr}"))
    return found


def test_no_module_uses_another_modules_private_names():
    wrong = [f"{MODULES[m].relative_to(REPO)}:{line} uses {name}" for m in MODULES for line, name in private_uses(m)]
    assert not wrong, "private names used across modules (make them public where they are defined):\n" + "\n".join(wrong)


def test_a_private_use_is_found(tmp_path, monkeypatch):
    """The reader above sees both forms (else the test passes on nothing)."""
    fake = tmp_path / "m.py"
    fake.write_text("from runledger import queries\nfrom runledger.queries.audit import _x\nqueries._y\n")
    monkeypatch.setitem(MODULES, "fake.m", fake)
    assert private_uses("fake.m") == [(2, "runledger.queries.audit._x"), (3, "runledger.queries._y")]

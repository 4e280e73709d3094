"""The layers run one way, `runledger.ledger` <- `runledger.queries` <- `runledger.training` / `agents` /
`ui` / `interop` / the logging API <- `runledger.tools` (then `bench`), with no cycles; inside `runledger.ledger`
the concept folders run `contract` <- `storage` / `bus` <- `emit` / `check` <- `decisions` / `ingest` <- the
embedded default (`local`); no module imports the command line, and none uses another module's private names.
Read from the source's imports (ast), every import counted, a function's deferred ones too.
"""

from __future__ import annotations


def test_import_runledger_loads_no_duckdb_pyarrow_or_jax():
    """The logging API's import is light: what `python -X importtime -c "import runledger"` lists, in a clean
    process outside the repository (a user's script), holds none of the heavy libraries; `init` loads them."""
    import os
    import subprocess
    import sys
    import tempfile

    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    with tempfile.TemporaryDirectory() as where:
        out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import runledger"], cwd=where, env=env,
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    loaded = {line.split("|")[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert "runledger" in loaded
    heavy = sorted(m for m in loaded if m.split(".")[0] in {"duckdb", "pyarrow", "jax", "jaxlib", "numpy", "pyiceberg"})
    assert not heavy, f"`import runledger` loads {heavy}"

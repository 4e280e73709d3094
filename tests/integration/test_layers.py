"""The layers run one way, `runledger.ledger` <- `runledger.queries` <- `runledger.training` / `agents` /
`ui` / `interop` / the logging API <- `runledger.tools` (then `bench`), with no cycles; inside `runledger.ledger`
the concept folders run `contract` <- `storage` / `bus` <- `emit` / `check` <- `decisions` / `ingest` <- the
embedded default (`local`); no module imports the command line, and none uses another module's private names.
Read from the source's imports (ast), every import counted, a function's deferred ones too.
"""

from __future__ import annotations


def modules_loaded_by(code: str) -> set[str]:
    """The modules `python -X importtime -c code` lists, in a clean process outside the repository (a user's script)."""
    import os
    import subprocess
    import sys
    import tempfile

    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    with tempfile.TemporaryDirectory() as where:
        out = subprocess.run([sys.executable, "-X", "importtime", "-c", code], cwd=where, env=env,
                             capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return {line.split("|")[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}


HEAVY = {"duckdb", "pyarrow", "jax", "jaxlib", "numpy", "pyiceberg", "fastavro", "rich", "starlette", "uvicorn"}


def test_import_runledger_loads_no_duckdb_pyarrow_or_jax():
    """The logging API's import is light: `import runledger` loads the package's own `__init__` and the standard
    library, nothing else (no duckdb, pyarrow, pyarrow.compute, numpy, JAX, nats-py, aiohttp, pydantic, psutil or
    orjson: `init` loads what it needs)."""
    import sys

    loaded = modules_loaded_by("import runledger")
    assert "runledger" in loaded
    bare = modules_loaded_by("pass")  # (what the interpreter's start loads: site, the editable install's finder)
    outside = sorted(m for m in loaded - bare if m.split(".")[0] not in sys.stdlib_module_names and m.split(".")[0] != "runledger")
    assert not outside, f"`import runledger` loads {outside}"
    assert not {"nats", "pydantic", "pyarrow.compute", "aiohttp", "psutil", "orjson"} & loaded


def test_the_first_init_loads_no_duckdb_pyarrow_or_numpy():
    """What the first `init` imports before it starts (`runledger.core`: the run's classes, the emitter, the spool)
    holds no query or storage engine: no duckdb (the threshold names and run-id slugs are read without it),
    pyarrow or pyarrow.compute (the spool's fsync, the Parquet sink's writer), numpy or JAX."""
    loaded = modules_loaded_by("import runledger.core")
    assert "runledger.core" in loaded
    heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY)
    assert not heavy, f"`import runledger.core` loads {heavy}"


def test_init_log_finish_load_no_duckdb_pyarrow_or_numpy(local_root):
    """A whole run through the embedded default, `init`, `log`, `finish` (stored and confirmed), loads none of them
    in the user's process (the root's server and ledger, in processes of their own, do the storing)."""
    import os
    import subprocess
    import sys

    code = ("import sys, runledger\n"
            "run = runledger.init(project='light', system_metrics=False)\n"
            "runledger.log({'loss': 1.0})\n"
            "assert run.finish()\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {sorted(HEAVY)!r}))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    r = subprocess.run([sys.executable, "-c", code], cwd=local_root.parent, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "[]", r.stdout

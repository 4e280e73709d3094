"""The installed package as a user gets it: one import name (`runledger`), a base install without JAX,
optax, orbax or scipy that still logs, queries, verifies, replays and serves the dashboard, beside
OpenAI's Agents SDK (whose import name is `agents`) and beside a script's own `tools/`, `training/`,
`ledger/` and `agents/` folders; a command whose extra is missing says which, in one line.

The fresh-venv test installs from PyPI (pip's cache makes it about a minute): it is what `pip install .`
from a clone does, nothing of this checkout's own venv is used.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

from support import REPO

HEAVY = ("jax", "jaxlib", "optax", "orbax", "orbax_checkpoint", "scipy", "openlineage")

SCRIPT = """
    import sys
    {first}
    import runledger

    run = runledger.init(project="install", name=sys.argv[1], config={{"lr": 0.1}}, system_metrics=False)
    for step in range(50):
        runledger.log({{"train/loss": 1.0 / (step + 1), "val/acc": step / 50}}, step=step)
    assert run.finish()
    print("logged", run.id)
"""


def test_a_command_whose_extra_is_missing_says_which_in_one_line(tmp_path):
    # As in a base install: jax cannot be imported. `runledger train` answers with the extra, exit 2.
    code = ("import sys; sys.modules['jax'] = None; from runledger.tools.cli import main; "
            f"sys.exit(main(['train', '--run-id', 'r1', '--root', {str(tmp_path / 'root')!r}, '--steps', '2']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "[train]" in lines[0] and "jax" in lines[0], out.stderr


def venv_run(venv: Path, *args: str, cwd: Path, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / args[0]), *args[1:]], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**clean_env(), **(env or {})})


def clean_env() -> dict:
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("PYTHON", "RUNLEDGER_", "VIRTUAL_ENV")) and k != "PIP_REQUIRE_VIRTUALENV"}


def test_a_base_install_beside_openai_agents_and_a_scripts_own_folders_logs_and_reads(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    started = time.monotonic()
    pip = venv_run(venv, "python", "-m", "pip", "install", "--quiet", str(REPO), cwd=tmp_path)
    assert pip.returncode == 0, pip.stderr[-3000:]
    sys.stderr.write(f"\nbase install: {time.monotonic() - started:.1f} s\n")
    site = next((venv / "lib").glob("python3.*/site-packages"))
    info = next(site.glob("runledger-*.dist-info"))
    top = info / "top_level.txt"
    if top.exists():
        assert top.read_text().split() == ["runledger"]
    installed = {line.split(",")[0].split("/")[0] for line in (info / "RECORD").read_text().splitlines()}
    assert {p for p in installed if p != ".." and not p.endswith(".dist-info")} == {"runledger"}, installed  # (..: bin/)
    present = [m for m in HEAVY if (site / m).exists()]
    assert not present, f"the base install brought {present}"

    pip = venv_run(venv, "python", "-m", "pip", "install", "--quiet", "openai-agents", cwd=tmp_path)
    assert pip.returncode == 0, pip.stderr[-3000:]

    # 1. OpenAI's `agents` and runledger in one script
    work = tmp_path / "work"
    work.mkdir()
    root = tmp_path / "root"
    env = {"RUNLEDGER_ROOT": str(root)}
    openai = work / "with_openai_agents.py"
    openai.write_text(textwrap.dedent(SCRIPT).format(first="import agents\nassert hasattr(agents, 'Agent') and hasattr(agents, 'Runner')"))
    out = venv_run(venv, "python", str(openai), "beside-openai", cwd=work, env=env, timeout=300)
    assert out.returncode == 0 and "logged" in out.stdout, out.stderr[-3000:]

    # 2. a script beside its own tools/, training/, ledger/ and agents/ packages (which would have shadowed ours)
    own = tmp_path / "own"
    for name in ("tools", "training", "ledger", "agents"):
        (own / name).mkdir(parents=True)
        (own / name / "__init__.py").write_text(f"MINE = {name!r}\n")
    script = own / "train.py"
    script.write_text(textwrap.dedent(SCRIPT).format(first="import tools, training, ledger, agents\nassert tools.MINE == 'tools' and agents.MINE == 'agents'"))
    out = venv_run(venv, "python", str(script), "beside-own-folders", cwd=own, env=env, timeout=300)
    assert out.returncode == 0 and "logged" in out.stdout, out.stderr[-3000:]

    # 3. the commands a base install must answer: sql, verify, replay, the dashboard
    try:
        sql = venv_run(venv, "runledger", "sql", "--root", str(root), "--format", "json",
                       "select count(*) as n from metrics where key = 'train/loss'", cwd=tmp_path)
        assert sql.returncode == 0, sql.stderr
        assert "100" in sql.stdout, sql.stdout
        verify = venv_run(venv, "runledger", "verify", "--root", str(root), cwd=tmp_path)
        assert verify.returncode == 0, verify.stdout + verify.stderr
        runs = venv_run(venv, "runledger", "sql", "--root", str(root), "--format", "json",
                        "select distinct run_id from runs order by run_id", cwd=tmp_path)
        run_ids = [r["run_id"] for r in json.loads(runs.stdout)] if runs.stdout.strip().startswith("[") else \
            [json.loads(line)["run_id"] for line in runs.stdout.splitlines() if line.strip()]
        assert len(run_ids) == 2, runs.stdout
        replay = venv_run(venv, "runledger", "replay", run_ids[0], "--root", str(root), cwd=tmp_path)
        assert replay.returncode == 0, replay.stderr
        port = 18000 + os.getpid() % 1000
        ui = subprocess.Popen([str(venv / "bin" / "runledger"), "ui", "--root", str(root), "--port", str(port)],
                              cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline, page = time.monotonic() + 60, None
            while page is None and time.monotonic() < deadline and ui.poll() is None:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
                        page = r.status
                except OSError:
                    time.sleep(0.3)
            assert page == 200, ui.stderr.read() if ui.poll() is not None else "no answer"
        finally:
            ui.terminate()
            ui.wait(30)
    finally:
        venv_run(venv, "runledger", "down", "--root", str(root), cwd=tmp_path, timeout=60)

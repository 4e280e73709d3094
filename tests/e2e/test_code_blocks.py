"""Every code block of README.md and docs/*.md, run as written: one test case per block, named by its
page and the line of its opening fence (`README.md:36`).

A block's fence says what it is, and so how it is run:
- `sh`, `bash`, `shell`: by bash with `set -eo pipefail` (every line must succeed), in a fresh
  directory that stands for the clone (the repository's top-level files and folders linked into it),
  with the venv's bin on PATH. There `runledger-data` (also $RUNLEDGER_ROOT) is a root where the
  README's logging example has just logged `my-run`, its embedded server and ledger still up. The
  inputs the pages' commands name that a user brings are made there too: `routes.toml` (the routes
  of docs/notify.md), `ui.json` (the tokens of docs/dashboard.md, mode 0600), `runs/mlp-1`, `mlruns`
  and `wandb` (a run each, written by TensorBoard's, MLflow's and W&B's own libraries), and
  $ONCALL_TOKEN, $PUSHOVER_TOKEN and $PUSHOVER_USER, which those routes read.
- `python`: by the venv's python, in such a directory. The README's logging example runs in one
  without `runledger-data`: it is what makes `my-run`.
- `sql`: by `runledger sql --root runledger-data "<block>"` in such a directory.
- `toml`, `json`: parsed; a routes file (`[[route]]`) is read by notify's own reader.
- `text`: pictures, file layouts and output; not run.
A block with no language, or another one, fails: each says what it is.

What cannot run inside a test is stood in for openly, by commands of the same name placed first on
PATH (SHIMS below), each saying what it checks instead:
- `make TARGET` runs `make -n TARGET` in the repository: the target exists and its recipe expands,
  and nothing is run (`make test` is this suite, `make demo` takes minutes, and both install);
- `pip install ARG...` checks that each ARG names this repository, `.`, with extras pyproject.toml
  defines, and installs nothing (it would need the network and change the venv under test);
- `runledger demo ...` is only parsed, by the CLI's own parser (it trains JAX models for minutes;
  tests/e2e/test_demo.py runs `runledger demo --quick`);
- `runledger ui|notify|agents ...` serve until stopped: each runs until its first line of output (it
  is up: on a loaded machine its imports alone can take seconds), then SERVE_S seconds more, and is then
  sent SIGTERM, and must exit 0 (one that ends sooner gives its own status; its output and error
  come out together).
Every other command is the real one.

Afterwards everything a block started is stopped: its process group, and every root under its
directory (the embedded server and ledger, a `nats up` server); then the test fails if any process is
left whose command line or working directory is in that directory.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BIN = Path(sys.executable).parent  # the venv's bin: runledger, python
SERVE_S = 5  # how long a command that serves until stopped runs before its SIGTERM
BLOCK_TIMEOUT_S = 240
SHELLS = ("sh", "bash", "shell")
RUNNABLE = (*SHELLS, "python", "sql", "toml", "json")
SHOWN = ("text",)
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)(?P<lang>[^`\s]*)\s*$")
ONCALL_TOKEN = "a-token-for-the-routes-of-docs-notify"
ROUTE_SECRETS = {"ONCALL_TOKEN": ONCALL_TOKEN, "PUSHOVER_TOKEN": "a-pushover-app-token", "PUSHOVER_USER": "a-pushover-user"}
NOT_LINKED = {".git", ".venv", "runledger-data", "__pycache__"}  # not part of a clone a user has


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository
    line: int  # of the opening fence, from 1
    lang: str
    text: str

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def blocks_of(page: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page, indented ones (inside a list item) too."""
    found, lines, i = [], page.read_text().splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, start, body = len(m["indent"]), m["fence"], i, []
        i += 1
        while i < len(lines) and not (lines[i].strip().startswith(fence[0] * len(fence)) and not lines[i].strip().strip(fence[0])):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        assert i < len(lines), f"{page.name}:{start + 1}: a code block that is never closed"
        found.append(Block(str(page.relative_to(REPO)), start + 1, m["lang"], "\n".join(body) + "\n"))
        i += 1
    return found


BLOCKS = [b for page in PAGES for b in blocks_of(page)]


def the_block(page: str, lang: str, holding: str) -> Block:
    """The one block of `page` in `lang` holding the text `holding`."""
    found = [b for b in BLOCKS if b.page == page and b.lang == lang and holding in b.text]
    assert len(found) == 1, f"{page}: expected one {lang} block holding {holding!r}, found {len(found)}"
    return found[0]


SEED = the_block("README.md", "python", 'name="my-run"')  # the logging example: it makes `my-run`


# ------------------------------------------------------------------------ stand-ins (see the docstring)

SHIMS = {
    "make": '''#!/bin/bash
# make TARGET: `make -n TARGET` in the repository (the recipe expands, nothing runs)
exec "$RUNLEDGER_DOCS_MAKE" -n -C "$RUNLEDGER_DOCS_REPO" "$@"
''',
    "pip": '''#!/bin/bash
# pip install ARG...: each ARG names this repository with extras it defines; nothing is installed
exec "$RUNLEDGER_DOCS_BIN/python" "$RUNLEDGER_DOCS_TEST" pip "$@"
''',
    "runledger": '''#!/bin/bash
# runledger: the real one, but for `demo` (parsed only) and the commands that serve until stopped
case "$1" in
  demo) exec "$RUNLEDGER_DOCS_BIN/python" "$RUNLEDGER_DOCS_TEST" parse "$@" ;;
  ui|notify|agents)  # up (its first line said, however long that takes), SERVE_S more, then SIGTERM
    log=$(mktemp)
    "$RUNLEDGER_DOCS_BIN/runledger" "$@" >"$log" 2>&1 &
    pid=$!
    for _ in $(seq 1200); do { [ -s "$log" ] || ! kill -0 $pid 2>/dev/null; } && break; sleep 0.1; done
    sleep "$RUNLEDGER_DOCS_SERVE_S"
    kill -TERM $pid 2>/dev/null
    { sleep 10; kill -KILL $pid 2>/dev/null; } &
    guard=$!
    wait $pid; rc=$?
    kill $guard 2>/dev/null
    cat "$log"; rm -f "$log"; exit $rc ;;
  *) exec "$RUNLEDGER_DOCS_BIN/runledger" "$@" ;;
esac
''',
}


def pip_stand_in(args: list[str]) -> int:
    """`pip install ARG...` checked, not run: each ARG is `.` or `.[extra,...]` of this repository."""
    if not args or args[0] != "install" or len(args) == 1:
        print(f"pip {' '.join(args)}: only `pip install` of this repository is stood in for", file=sys.stderr)
        return 2
    here = Path.cwd() / "pyproject.toml"
    extras = set(tomllib.loads(here.read_text())["project"]["optional-dependencies"]) if here.exists() else set()
    for arg in args[1:]:
        m = re.fullmatch(r"\.(?:\[([a-z0-9_,-]+)\])?", arg)
        if not here.exists() or not m:
            print(f"pip install {arg}: not this repository ('.' with its pyproject.toml here)", file=sys.stderr)
            return 2
        unknown = set((m[1] or "").split(",")) - extras - {""}
        if unknown:
            print(f"pip install {arg}: pyproject.toml defines no extra {sorted(unknown)}", file=sys.stderr)
            return 2
    print(f"pip install {' '.join(args[1:])}: checked (not installed)")
    return 0


def parse_stand_in(args: list[str]) -> int:
    """`runledger ARGS` parsed by the CLI's own parser, not run (argparse exits 2 on bad usage)."""
    from runledger.tools.cli import build_parser

    build_parser().parse_args(args)
    print(f"runledger {' '.join(args)}: parsed (not run)")
    return 0


# ------------------------------------------------------------------------ the directory a block runs in


def run_python(text: str, cwd: Path, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "python"), "-c", text], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def block_env(work: Path, shims: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RUNLEDGER_NATS", "RUNLEDGER_CREDS", "RUNLEDGER_ROOT")}
    env.update(PATH=f"{shims}{os.pathsep}{BIN}{os.pathsep}{env.get('PATH', '')}", RUNLEDGER_ROOT=str(work / "runledger-data"),
               **ROUTE_SECRETS, PYTHONDONTWRITEBYTECODE="1", RUNLEDGER_DOCS_REPO=str(REPO),
               RUNLEDGER_DOCS_BIN=str(BIN), RUNLEDGER_DOCS_TEST=str(Path(__file__).resolve()),
               RUNLEDGER_DOCS_SERVE_S=str(SERVE_S), RUNLEDGER_DOCS_MAKE=shutil.which("make") or "make")
    return env


@pytest.fixture(scope="module")
def shims(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("shims")
    for name, text in SHIMS.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder


@pytest.fixture(scope="module")
def seeded(tmp_path_factory, shims) -> Path:
    """A root where the README's logging example logged `my-run` (its server and ledger then stopped)."""
    from runledger.ledger import local

    work = tmp_path_factory.mktemp("seed")
    done = run_python(SEED.text, work, block_env(work, shims))
    try:
        assert done.returncode == 0, f"the README's logging example failed:\n{done.stderr[-3000:]}"
    finally:
        local.down(work / "runledger-data")
    return work / "runledger-data"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """What the pages' commands read that a user brings, made once."""
    folder = tmp_path_factory.mktemp("inputs")
    routes = the_block("docs/notify.md", "toml", "[[route]]")
    (folder / "routes.toml").write_text(routes.text)
    tokens = the_block("docs/dashboard.md", "json", '"token"')
    (folder / "ui.json").write_text(tokens.text)
    (folder / "ui.json").chmod(0o600)
    write_tensorboard_run(folder / "runs" / "mlp-1")
    write_mlflow_run(folder / "mlruns")
    write_wandb_run(folder)
    return folder


def write_tensorboard_run(folder: Path) -> None:
    from tensorboard.summary import Writer

    writer = Writer(str(folder))
    for step in range(20):
        writer.add_scalar("loss", 2.0 / (1 + step), step)
    writer.close()


def write_mlflow_run(folder: Path) -> None:
    code = f"""
from mlflow.tracking import MlflowClient
client = MlflowClient(tracking_uri={str(folder)!r})
run = client.create_run(client.create_experiment("mlp"))
for step in range(20):
    client.log_metric(run.info.run_id, "loss", 2.0 / (1 + step), step=step)
client.set_terminated(run.info.run_id)
"""
    env = {**os.environ, "MLFLOW_ALLOW_FILE_STORE": "true"}  # MLflow 3 writes a file store only when asked
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]


def write_wandb_run(folder: Path) -> None:
    """An offline W&B run under `folder/wandb`, written by wandb in a process of its own (its service stops with it)."""
    code = """
import wandb
run = wandb.init(project="mlp", settings=wandb.Settings(console="off", save_code=False, disable_git=True))
for step in range(20):
    run.log({"loss": 2.0 / (1 + step)}, step=step)
run.finish()
wandb.teardown()
"""
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(folder)}
    done = subprocess.run([sys.executable, "-c", code], cwd=folder, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]


def clone_at(work: Path, inputs: Path) -> None:
    """`work` made to stand for the clone: the repository's top-level entries linked in, the inputs copied."""
    for entry in REPO.iterdir():
        if entry.name not in NOT_LINKED and not entry.name.endswith(".egg-info"):
            (work / entry.name).symlink_to(entry)
    for entry in inputs.iterdir():
        if entry.is_dir():
            shutil.copytree(entry, work / entry.name, symlinks=True)
        else:
            shutil.copy2(entry, work / entry.name)


def logged_root_at(work: Path, seeded: Path) -> None:
    """`work/runledger-data`: a copy of the seeded root, with its embedded server and ledger up, as just
    after the README's logging example."""
    from runledger.ledger import local

    root = work / "runledger-data"
    shutil.copytree(seeded, root, ignore=shutil.ignore_patterns("local", "ledger.lock"))
    local.attach(root).release()  # started for the root; it outlives this lease
    # a ledger on a copied root registers its files in new tables there, and then tables.json names
    # the new place: until then other engines' readers (pyiceberg) see the tables empty
    deadline = time.monotonic() + 60
    while json.loads((root / "tables.json").read_text()).get("root") != str(root.resolve()):
        assert time.monotonic() < deadline, f"the ledger on {root} did not register its tables in 60 s"
        time.sleep(0.1)


# ------------------------------------------------------------------------ stopping what a block started


def roots_under(work: Path, depth: int = 3) -> list[Path]:
    """Folders under `work` (not through links) that hold a local supervisor's or a nats-server's state."""
    found, level = [], [work]
    for _ in range(depth):
        below = []
        for folder in level:
            for entry in folder.iterdir():
                if entry.is_dir() and not entry.is_symlink():
                    if (entry / "local").is_dir() or (entry / "nats").is_dir():
                        found.append(entry)
                    below.append(entry)
        level = below
    return found


def processes_in(work: Path) -> list[tuple[int, str]]:
    """Processes whose command line or working directory is in `work`."""
    where, found = str(work.resolve()), []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if where in cmdline or cwd == where or cwd.startswith(where + os.sep):
            found.append((int(proc.name), cmdline.strip()))
    return found


def stop_everything(work: Path, group: int | None) -> list[tuple[int, str]]:
    """Stop the block's process group, every root's embedded server and ledger and nats-server under
    `work`; return (and kill) what is still running there."""
    from runledger.ledger import local
    from runledger.ledger.bus import natsserver

    if group is not None:
        for sig, wait_s in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
            try:
                os.killpg(group, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and _group_alive(group):
                time.sleep(0.1)
    for root in roots_under(work):
        if (root / "local").is_dir():
            local.down(root)
        if (root / "nats").is_dir():
            natsserver.down(root)
    left = processes_in(work)
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


# ------------------------------------------------------------------------ the test


def run_block(block: Block, work: Path, env: dict) -> tuple[int | None, subprocess.CompletedProcess | str]:
    """Run a runnable block in `work`; (its process group, its result or what failed)."""
    if block.lang in SHELLS:
        script = work.parent / "block.sh"
        script.write_text("set -eo pipefail\n" + block.text)
        argv = ["bash", str(script)]
    elif block.lang == "python":
        script = work.parent / "block.py"
        script.write_text(block.text)
        argv = [str(BIN / "python"), str(script)]
    else:  # sql
        argv = [str(BIN / "runledger"), "sql", "--root", "runledger-data", block.text.strip()]
    proc = subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return proc.pid, f"still running after {BLOCK_TIMEOUT_S} s\n{out[-2000:]}\n{err[-3000:]}"
    return proc.pid, subprocess.CompletedProcess(argv, proc.returncode, out, err)


def check_data_block(block: Block) -> None:
    if block.lang == "json":
        json.loads(block.text)
        return
    data = tomllib.loads(block.text)
    if "route" in data:  # a routes file: as `runledger notify --routes` reads it
        from runledger.interop.routes import parse_routes

        assert parse_routes(block.text, ".toml", ROUTE_SECRETS)


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_the_code_block_runs_as_written(block, tmp_path, shims, seeded, inputs):
    assert block.lang in RUNNABLE + SHOWN, (
        f"{block.id}: a block fenced {block.lang or 'with no language'!r}; say what it is: one of {RUNNABLE + SHOWN}")
    if block.lang in SHOWN:
        return  # a picture, a layout or output: nothing to run
    if block.lang in ("toml", "json"):
        check_data_block(block)
        return
    work = tmp_path / "clone"
    work.mkdir()
    clone_at(work, inputs)
    if block != SEED:
        logged_root_at(work, seeded)
    group, done = None, None
    try:
        group, done = run_block(block, work, block_env(work, shims))
    finally:
        left = stop_everything(work, group)
    assert not isinstance(done, str), f"{block.id}: {done}"
    assert done.returncode == 0, (f"{block.id} failed (exit {done.returncode}):\n{block.text}\n"
                                  f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-5000:]}")
    assert not left, f"{block.id} left processes running: {left}"


def test_the_readme_logging_example_runs_twice_in_a_row(tmp_path, shims):
    """Run as written, then again (the most ordinary thing a user does): two runs named `my-run`, each its own id."""
    from support.reading import reader

    from runledger.ledger import local

    work = tmp_path / "clone"
    work.mkdir()
    env = block_env(work, shims)
    try:
        for _ in range(2):
            done = run_python(SEED.text, work, env)
            assert done.returncode == 0, f"the README's logging example failed:\n{done.stderr[-3000:]}"
        runs = reader(work / "runledger-data").execute("select run_id, name from run_names").fetchall()
    finally:
        local.down(work / "runledger-data")
    assert len(runs) == 2 and len({r for r, _ in runs}) == 2 and {n for _, n in runs} == {"my-run"}, runs


def test_every_page_has_its_blocks_found():
    """The fence parser sees every fence: an odd count on a page would mean a block read wrongly."""
    for page in PAGES:
        fences = sum(1 for line in page.read_text().splitlines() if FENCE.match(line))
        assert fences == 2 * len(blocks_of(page)), page.name


if __name__ == "__main__":  # the stand-ins the shims call (see the docstring)
    what, args = sys.argv[1], sys.argv[2:]
    sys.exit(pip_stand_in(args) if what == "pip" else parse_stand_in(args))

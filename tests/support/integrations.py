"""integrations: what the tests of `runledger.integrations` (tests/integration/test_integrations_*.py) read back
from a root: a run's values, its checkpoint events, a folder's hash by `sha256sum` (not by runledger's code)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from support.reading import reader


@pytest.fixture
def one_torch_thread():
    """torch on one thread for the test (its idle threads spin between ops, which on 2 shared cores slows a tiny
    model's steps several times over); as it was, after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def values_of(root: Path, run_id: str) -> dict[tuple[int, str], float]:
    """{(step, name): value} of every number the run logged, read with SQL (the latest attempt of each step). A
    name logged twice at one step (the Trainer's `epoch`, in its train and its eval log) must hold one value."""
    rows = reader(root).execute("select step, key, value from metrics where run_id = ?", [run_id]).fetchall()
    values = {(s, k): v for s, k, v in rows}
    assert len(values) == len({(s, k, v) for s, k, v in rows}), "a (step, name) stored with two values"
    return values


def checkpoints_of(root: Path, run_id: str) -> list[tuple[int, int, str, str, str | None]]:
    """(attempt, step, path, content_hash, config_hash) of the run's checkpoint events, by step."""
    return reader(root).execute("select attempt, step, path, content_hash, config_hash from checkpoints "
                                "where run_id = ? order by step", [run_id]).fetchall()


def sha256sum_manifest(folder: Path) -> str:
    """A folder's content hash by coreutils, as runledger.content documents it:
    `find . -type f | sort | xargs sha256sum | sha256sum` (paths without "./")."""
    script = "find . -type f -printf '%P\\n' | LC_ALL=C sort | xargs -d '\\n' sha256sum | sha256sum"
    done = subprocess.run(["bash", "-c", f"set -eo pipefail; {script}"], cwd=folder, capture_output=True, text=True,
                          check=True, timeout=60)
    return done.stdout.split()[0]


def started_configs(root: Path, run_id: str) -> list[tuple[int, dict, str]]:
    """(attempt, config, config_hash) of each run_started of the run."""
    rows = reader(root).execute("select attempt, config, config_hash from runs where run_id = ? order by attempt",
                                [run_id]).fetchall()
    return [(a, json.loads(c), h) for a, c, h in rows]

"""Every `runledger` subcommand, swept with missing, malformed and hostile input (issue 33, item 19).

The subcommands and their arguments are read from the parser itself, so a new command or option is
swept without a word here. For each command: every required argument left out, and each argument in
turn given what no command may accept (a negative, zero or huge number, a file that is missing or a
folder, a non-URL, a name with a newline, `../` or a control character), the others given plausible
values. Each case runs as a real process under a watchdog; the promise is a refusal: exit 2 (1 where a
check fails), one line on stderr, never a traceback, and never a hang.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from support import REPO

WATCHDOG_S = 20  # a refusal takes a second; a case still running after this is a hang (SIGKILLed)
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO|WARNING) ")
HOSTILE_TEXT = "bad\nname/../\x01x"
# arguments that are free text by design (a query, a reason): a newline or `../` in them is not an attack
FREE_TEXT = {"sql", "reason"}
# integer options where 0 is a meaning of its own, not a mistake
ZERO_OK = {"port", "cluster", "as_of_seq", "snapshot", "nan_at", "max_rows"}
FILE_IN = {"creds", "token_file", "routes", "since", "catalog_file", "src"}  # read: must exist
FILE_OUT = {"out", "record", "to"}  # written: its folder must exist
NAMES = {"run", "run_id", "target", "producer", "fork_from", "worker", "durable", "name", "runs", "ladder"}


def commands() -> dict[str, argparse.ArgumentParser]:
    from runledger.tools.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not isinstance(a, argparse._HelpAction) and a.nargs != 0]


def plausible(action: argparse.Action, tmp: Path) -> list[str]:
    """A value the argument could well take (so that another argument's hostile value is what is tested)."""
    if action.choices:
        return [str(next(iter(action.choices)))]
    d = action.dest
    if d in FILE_IN:
        f = tmp / "plausible.txt"
        f.write_text("plausible\n")
        return [str(f)]
    if d in FILE_OUT:
        return [str(tmp / "out" / f"{d}.out")]
    if d == "sql":
        return ["select 1"]
    if d == "root":
        return [str(tmp / "root")]
    if d == "nats":
        return ["nats://127.0.0.1:1"]
    return ["x1"]


def hostile_values(action: argparse.Action, tmp: Path) -> list[str]:
    """Values no command may accept for this argument."""
    if action.choices:
        return ["no-such-choice"]
    d, t = action.dest, action.type
    if t is int or getattr(t, "int_like", False):
        return ["-1", "abc", "100000000000000000000"] + ([] if d in ZERO_OK else ["0"])
    if t is float or getattr(t, "float_like", False):
        return ["-1", "nan", "inf", "abc"]
    if d in FREE_TEXT:
        return []
    if d == "nats":
        return ["not a url", "http://127.0.0.1:1", "nats://127.0.0.1:99999", HOSTILE_TEXT]
    if d == "root":
        return [str(tmp / "missing" / "deeper" / "root"), str(tmp / "a-file"), HOSTILE_TEXT]
    if d in FILE_IN:
        return [str(tmp / "missing.txt"), str(tmp / "a-dir"), HOSTILE_TEXT]
    if d in FILE_OUT:
        return [str(tmp / "missing" / "dir" / "x.out"), str(tmp / "a-dir")]
    if d in NAMES:
        return [HOSTILE_TEXT, "../../etc", "UPPER CASE"]
    return [HOSTILE_TEXT]


def cases(tmp: Path) -> list[tuple[str, list[str]]]:
    """(what, argv) for every command: each required argument missing, then each argument hostile."""
    (tmp / "a-dir").mkdir(exist_ok=True)
    (tmp / "a-file").write_text("not a folder\n")
    out = []
    for name, parser in commands().items():
        args = arguments(parser)
        required = [a for a in args if a.required or not a.option_strings]

        def argv(values: dict, left_out: argparse.Action | None = None) -> list[str]:
            line = [name]
            for a in args:
                if a is left_out:
                    continue
                if a in values:
                    vals = values[a]
                elif a.required or not a.option_strings:
                    vals = plausible(a, tmp)
                else:
                    continue
                if a.option_strings:
                    for v in vals:
                        line += [a.option_strings[0], v]
                else:
                    line += vals
            return line

        for a in required:
            out.append((f"{name}: {a.dest} missing", argv({}, left_out=a)))
        for a in args:
            for v in hostile_values(a, tmp):
                out.append((f"{name}: {a.dest}={v!r}", argv({a: [v]})))
    return out


def run_case(argv: list[str], tmp: Path, case: int = 0) -> tuple[int | None, str, str]:
    """Run `runledger ARGV` in a folder of its own (a case that wrongly goes on touches no other's)."""
    here = tmp / f"case-{case}"
    here.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNLEDGER_")}
    env.update(RUNLEDGER_ROOT=str(here / "env-root"), RUNLEDGER_NATS="nats://127.0.0.1:1", PYTHONPATH=str(REPO))
    p = subprocess.Popen([sys.executable, "-m", "runledger.tools.cli", *argv], cwd=here, env=env, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=WATCHDOG_S)
        return p.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        out, err = p.communicate()
        return None, out, err


def problem(code: int | None, err: str) -> str | None:
    """Why this outcome is not a refusal (None if it is one)."""
    said = [line for line in err.splitlines() if line.strip() and not LOG_LINE.match(line)]
    if code is None:
        return f"still running after {WATCHDOG_S}s"
    if "Traceback" in err:
        return "traceback: " + err.strip().splitlines()[-1][:200]
    if code not in (1, 2):
        return f"exit {code}"
    if len(said) != 1:
        return f"{len(said)} lines on stderr: {said[:3]}"
    return None


def cleanup(tmp: Path) -> None:
    """End whatever a case left running under `tmp` (a server a command should not have started)."""
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(str(tmp) in a for a in p.info["cmdline"] or ()):
                p.kill()
        except psutil.Error:
            continue


def test_every_subcommand_refuses_missing_malformed_and_hostile_input(tmp_path):
    all_cases = cases(tmp_path)
    assert len(all_cases) > 100
    assert {"verify", "ledger", "report", "nats", "status", "import", "notify", "ui"} <= set(commands())
    try:
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda c: run_case(c[1][1], tmp_path, c[0]), enumerate(all_cases)))
    finally:
        cleanup(tmp_path)
    failures = [f"{what}: {why}" for (what, _), (code, _, err) in zip(all_cases, results)
                if (why := problem(code, err))]
    assert not failures, f"{len(failures)} of {len(all_cases)} cases:\n" + "\n".join(failures)


@pytest.mark.parametrize("argv", [["nats", "up", "--cluster", "-1"], ["verify", "--jobs", "0"],
                                  ["ledger", "serve", "--partitions", "100000"], ["ledger", "serve", "--batch", "0"]])
def test_the_inputs_the_attack_found(argv, tmp_path):
    code, _, err = run_case(argv, tmp_path)
    cleanup(tmp_path)
    assert problem(code, err) is None and code == 2, (code, err[-1000:])

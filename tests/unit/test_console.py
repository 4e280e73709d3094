"""The script's console as events (`runledger.console`): each line written to stdout or stderr kept in order with its
number, a carriage return keeping what the terminal shows, a long line cut and counted, a flood past the rate bound
left out and counted in its place (never a silent drop, never unbounded memory), the streams put back at finish,
and `console=False` (or W&B's settings console="off") capturing nothing."""

from __future__ import annotations

import sys

import pytest

from runledger import console
from runledger.ledger.contract import events
from runledger.ledger.emit.sink import ListSink
from runledger.wandb_compat import Settings
from support.runs import listed_run


def lines_of(sink: ListSink, stream: str) -> list[tuple[int, str]]:
    return [(p["first"] + i, line) for _, p in sink.payloads("console") if p["stream"] == stream
            for i, line in enumerate(p["lines"])]


def test_the_bounds_are_the_contracts():
    assert (console.MAX_CONSOLE_LINE, console.MAX_CONSOLE_LINES) == (events.MAX_CONSOLE_LINE, events.MAX_CONSOLE_LINES)


def test_each_line_is_kept_in_order_at_the_step_and_the_streams_are_put_back(tmp_path, capsys):
    run, sink = listed_run(tmp_path, "printing")
    out, err = sys.stdout, sys.stderr
    run._console = console.Console(run).start()
    print("epoch 0")
    run.log({"loss": 1.0})
    print("a", "b", end="")
    print(" c")
    print("oops", file=sys.stderr)
    sys.stdout.write("progress 10%\rprogress 50%\rprogress 100%\n")
    print("no newline at the end", end="")
    run.finish()
    assert (sys.stdout, sys.stderr) == (out, err)
    assert lines_of(sink, "stdout") == [(0, "epoch 0"), (1, "a b c"), (2, "progress 100%"), (3, "no newline at the end")]
    assert lines_of(sink, "stderr") == [(0, "oops")]
    assert capsys.readouterr().out.startswith("epoch 0\na b c\n")  # the terminal still sees it all
    kinds = sink.kinds()
    assert kinds[-1] == "run_finished" and "console" in kinds


def test_a_flood_is_bounded_left_out_lines_are_counted_in_their_place_and_a_long_line_cut(tmp_path, monkeypatch):
    monkeypatch.setattr(console, "BURST", 100)
    monkeypatch.setattr(console, "RATE", 0.001)  # (no refill while the test runs)
    run, sink = listed_run(tmp_path, "printing")
    run._console = console.Console(run).start()
    try:
        for i in range(1000):
            print(f"line {i}")
        print("x" * (console.MAX_CONSOLE_LINE + 10))
    finally:
        run._console.stop()
    payloads = [p for _, p in sink.payloads("console")]
    kept = lines_of(sink, "stdout")
    assert kept == [(i, f"line {i}") for i in range(100)]  # the burst, then the rest left out (the long line too)
    assert payloads[-1] == {"stream": "stdout", "first": 1001, "lines": [], "dropped": 901}  # lines 100..1000 left out
    run2, sink2 = listed_run(tmp_path, "printing")
    monkeypatch.setattr(console, "RATE", 1000.0)
    run2._console = console.Console(run2).start()
    print("y" * (console.MAX_CONSOLE_LINE + 10))
    run2._console.stop()
    (p,) = [p for _, p in sink2.payloads("console")]
    assert p["cut"] == 1 and p["lines"] == ["y" * console.MAX_CONSOLE_LINE]


@pytest.mark.parametrize("given, settings, on", [(None, None, True), (False, None, False), (True, None, True),
                                                  (None, Settings(console="off"), False), (None, {"console": "wrap"}, True)])
def test_console_is_on_by_default_and_off_when_asked(given, settings, on):
    assert console.wanted(given, settings) is on

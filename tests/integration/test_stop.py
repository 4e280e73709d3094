"""Every long-running command stops on SIGTERM and on SIGINT by itself, well before a 15 s watchdog.

Each is started as a real process on a real nats-server (bench/stop.py's `start`: notify, ledger serve,
agents, ui, and a script logging through runledger.init with its embedded local server and ledger),
sent the signal once it is up, and must exit on its own with its documented code: 0 for the commands
("until SIGTERM/SIGINT"); a runledger.init script keeps Python's own ending for the signal (it finishes
its run as `stopped`, then dies of SIGINT; SIGTERM likewise ends it without a watchdog). The seconds
are bench/stop.py's to print, not asserted here.
"""

from __future__ import annotations

import signal

import pytest

from bench.stop import COMMANDS, WATCHDOG_S, start, stop, stop_hard

EXPECTED = {name: {signal.SIGTERM: (0,), signal.SIGINT: (0,)} for name in COMMANDS}
# a Python script interrupted: KeyboardInterrupt's exit (-SIGINT), or 1 if the interpreter ends by its traceback
EXPECTED["runledger.init"] = {signal.SIGTERM: (1, -signal.SIGINT, -signal.SIGTERM),
                              signal.SIGINT: (1, -signal.SIGINT)}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
@pytest.mark.parametrize("name", COMMANDS)
def test_a_long_running_command_stops_on_a_signal(tmp_path, nats_server, name, sig):
    started = start(name, tmp_path / "work", nats_server.url)
    try:
        seconds, code = stop(started, sig)
        tail = started.log.read_text(errors="replace")[-800:]
        assert seconds is not None, f"{name} still ran {WATCHDOG_S:g}s after {sig.name}: {tail}"
        assert code in EXPECTED[name][sig], f"{name} exited {code} on {sig.name}: {tail}"
    finally:
        stop_hard(started)

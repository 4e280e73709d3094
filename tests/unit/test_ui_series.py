"""A run's full-range chart points (runledger.ui.series.Series.full_range): worked out per file and kept by file,
so that a growing run's new file costs its own read; the answer after a new file equals one worked out afresh,
every spike stays, and a zoomed range is still exact."""

from __future__ import annotations

from datetime import timedelta

from support.audit_ledger import T0, Ledger
import pytest

pytestmark = pytest.mark.slow  # (among the slowest unit files: `make test` runs it, `make test-fast` leaves it out)

PX = 100


def loss(k: int) -> float:
    return {333: 50.0, 650: -5.0}.get(k, 3.0 - k * 1e-3)  # a spike up in the first file, one down in the second


def test_a_new_file_is_read_alone_and_the_answer_equals_one_worked_out_afresh(tmp_path, monkeypatch):
    from runledger.ui.data import Reader
    from runledger.ui.keys import stored_columns
    from runledger.ui.series import Series

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    led = Ledger(tmp_path / "root")
    led.emit("grow", "run_started", {"config": {}, "config_hash": "0" * 64}, 0, T0)

    def steps(first: int, last: int) -> None:
        for k in range(first, last + 1):
            led.emit("grow", "step", {"loss": loss(k), "grad_norm": 1.0, "lr": 1e-3, "tokens": 10, "step_time_s": 1.0},
                     k, T0 + timedelta(seconds=k))
        led.write()

    read = []  # the files whose buckets were read from disk (Series._buckets, spied on)
    real = Series._buckets
    monkeypatch.setattr(Series, "_buckets", staticmethod(lambda cur, f, *a: read.append(f) or real(cur, f, *a)))
    steps(1, 600)
    reader = Reader(tmp_path / "root")
    try:
        before = reader.series("grow", "step", ["loss"], PX)
        kept, had = set(reader.charts._parts), set(reader.run_files()["grow"]["step"])
        read.clear()
        steps(601, 700)  # a new file; the range 1..700 keeps the bucket width (a power of two: 8 steps)
        after = reader.series("grow", "step", ["loss"], PX)
        files = sorted(reader.run_files()["grow"]["step"])
        [added] = set(files) - had
        new = set(reader.charts._parts) - kept  # what was read for this answer: the new file's range and buckets
        assert read == [added] and len(new) == 2 and all(k[0].startswith(f"{added}:") for k in new)
        with reader.scoped(["grow"]) as cur:  # the same answer, nothing kept
            afresh = Series(reader).full_range(cur, "grow", "step", stored_columns("step", ["loss"], cur), ["loss"], PX, files)
        assert after["keys"] == afresh["keys"] and after["rows"] == 700 and after["x"] == [1, 700]
        xs, ys = after["keys"]["loss"]["0"]
        assert xs[ys.index(50.0)] == 333 and xs[ys.index(-5.0)] == 650  # every spike, at its step
        assert len(xs) <= 2 * (PX + 1) and before["keys"]["loss"]["0"][1].count(-5.0) == 0
        zoom = reader.series("grow", "step", ["loss"], PX, 640, 660)["keys"]["loss"]["0"]
        assert list(zoom) == [list(range(640, 661)), [loss(k) for k in range(640, 661)]]  # exact once zoomed in
    finally:
        reader.close()

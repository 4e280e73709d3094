"""health/throughput_floor says what its header says: on random runs (restarts, two workers, steps out of
time order, ties in time, samples on a window's very edge, short runs, a plan) its row equals a plain
Python reading of the header, one sample and one window at a time.

The query is fast by running medians and ASOF lookups (its header: cost); this test pins what those
compute to the definition, so that a faster form cannot drift from it. Values and times sit on a grid of
1/8 so that every median and floor is exact in both."""

from __future__ import annotations

import json
import random
import statistics

import duckdb
import pytest

from runledger import queries

THRESHOLDS = ("throughput_floor_ratio", "throughput_plan_floor", "throughput_window_s", "throughput_min_samples",
              "throughput_below_share", "throughput_skip_steps", "throughput_smooth_samples")


def random_run(rnd: random.Random) -> tuple[list[tuple], dict, tuple | None]:
    """(steps as (producer, attempt, step, t, mfu, tokens_per_s), thresholds, plan or None)."""
    by_mfu, rows, t = rnd.random() < 0.6, [], 0.0
    for producer in range(rnd.randint(1, 2)):
        for attempt in range(rnd.randint(1, 3)):
            first = rnd.randint(0, 30)
            for step in range(first, first + rnd.randint(0, 60)):
                t = max(0.0, t + rnd.choice([0, 0.5, 1, 2, 5, 13, -1, -3, -20]))  # ties and steps out of time order
                x = rnd.choice([1.0, 1.0, 1.0, 0.5]) * rnd.randint(4, 12) / 8
                rows.append((f"worker-{producer}", attempt, step, t, x if by_mfu and rnd.random() > 0.1 else None,
                             x * 1024 if rnd.random() > 0.1 else None))
    thresholds = dict(zip(THRESHOLDS, (rnd.choice([0.5, 0.75, 1.0]), rnd.choice([-1.0, -1.0, -1.0, 0.75]),
                                       rnd.choice([5.0, 20.0, 60.0, 900.0]), rnd.choice([0.0, 1.0, 3.0, 10.0]),
                                       rnd.choice([0.25, 0.5]), rnd.choice([0.0, 1.0, 3.0, 10.0]),
                                       rnd.choice([1.0, 3.0, 5.0]))))
    plan = (rnd.choice([0.75, None]), 1024.0) if rnd.random() < 0.7 else None
    return rows, thresholds, plan


def reference(rows: list[tuple], th: dict, plan: tuple | None) -> tuple:
    """The header, read literally: (status, value, at_step, windows_over)."""
    by_mfu = any(r[4] is not None for r in rows)
    samples = [(p, a, s, t, r[4] if by_mfu else r[5]) for r in rows for p, a, s, t in [r[:4]] if (r[4] if by_mfu else r[5]) is not None]
    if not samples:
        return ("skip", None, None, None)
    half = (int(max(th["throughput_smooth_samples"], 1)) - 1) // 2
    judged = []  # (t, step, x, smoothed x, first of its attempt)
    for p, a in sorted({(p, a) for p, a, *_ in samples}):
        mine = sorted((s for s in samples if s[:2] == (p, a)), key=lambda s: s[2])
        xs = [s[4] for s in mine]
        for nth, (_, _, step, t, x) in enumerate(mine, 1):
            smooth = statistics.median(xs[max(0, nth - 1 - half):nth + half])
            judged.append((t, step, x, smooth, nth == 1, nth > th["throughput_skip_steps"]))
    setting = [x for _, _, x, _, first, _ in judged if not first]
    if th["throughput_plan_floor"] >= 0:
        planned = plan and (plan[0] if by_mfu else plan[1])
        floor = th["throughput_plan_floor"] * planned if planned is not None else None
    else:
        floor = th["throughput_floor_ratio"] * statistics.median(setting) if setting else None
    if floor is None:
        return ("skip", None, None, None)
    judged = [j for j in judged if j[5]]
    window = th["throughput_window_s"]

    def floor_of(t: float) -> float:
        if th["throughput_plan_floor"] >= 0:
            return floor
        for side in ([x for u, _, x, _, first, _ in judged if not first and u <= t - window],
                     [x for u, _, x, _, first, _ in judged if not first and u >= t + window]):
            if len(side) >= th["throughput_min_samples"] and side:
                return th["throughput_floor_ratio"] * statistics.median(side)
        return floor

    below = {id(j): j[3] < floor_of(j[0]) for j in judged}
    windows = []  # (share below, step) of each window holding enough samples
    for t, step, *_ in judged:
        inside = [j for j in judged if t - window <= j[0] <= t]
        if len(inside) >= th["throughput_min_samples"]:
            windows.append((sum(below[id(j)] for j in inside) / len(inside), step))
    if not windows:
        return ("skip", None, None, None)
    over = [step for share, step in windows if share > th["throughput_below_share"]]
    return ("fail" if over else "ok", max(s for s, _ in windows), min(over, default=None), len(over))


@pytest.mark.parametrize("seed", range(12))
def test_the_check_is_its_header_on_random_runs(seed):
    rnd = random.Random(seed)
    con = duckdb.connect()
    con.execute("create table steps_all (run_id varchar, producer varchar, attempt bigint, step bigint, "
                "ts timestamptz, mfu double, tokens_per_s double)")
    con.execute("create table run_thresholds (run_id varchar, name varchar, value double)")
    con.execute("create table run_plan (run_id varchar, planned_mfu double, planned_tokens_per_s double)")
    con.execute("create table audit_runs (run_id varchar)")
    expected = {}
    for n in range(4):
        run = f"run-{n}"
        rows, th, plan = random_run(rnd)
        con.execute("insert into audit_runs values (?)", [run])
        con.executemany("insert into run_thresholds values (?, ?, ?)", [(run, k, v) for k, v in th.items()])
        if plan:
            con.execute("insert into run_plan values (?, ?, ?)", [run, *plan])
        if rows:
            con.executemany("insert into steps_all values (?, ?, ?, ?, to_timestamp(1800000000 + ?), ?, ?)",
                            [(run, *r) for r in rows])
        expected[run] = reference(rows, th, plan)
    rows = con.execute(queries.load_query("health/throughput_floor")).fetchall()
    got = {run: (status, value, at_step, json.loads(evidence).get("windows_over"))
           for run, _, status, value, _, at_step, evidence in rows}
    assert got == expected

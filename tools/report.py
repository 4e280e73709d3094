"""`runledger report RUN --out F.html`: one self-contained HTML file (inline SVG, no network) with the
run's plots and tables, all read from the ledger: loss against the forecast in force and its band (the
plan as registered until a decision changed it, then that decision's revision, each revision marked), grad norm,
drop fraction per layer, MFU, LR with the decisions marked on it, data mixture realised vs declared,
every metric the run logged (`runledger.log`), grouped by its prefix (`train/`, `eval/`, ...), the
decision trail and the health table.
"""

from __future__ import annotations

import argparse
import html
import json
import logging
import math
from pathlib import Path

from runledger.tools import checks
from runledger.tools.args import RUN_HELP, UsageError, add_root

log = logging.getLogger(__name__)

W, H, PAD = 540, 230, 46
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]
# each plot's data color, distinct so a screenshot can tell the plots were drawn (tests/{unit,e2e}/test_report.py)
SERIES = {"loss": "#d62728", "forecast": "#1f77b4", "grad_norm": "#2ca02c", "mfu": "#9467bd", "lr": "#ff7f0e"}
METRIC_POINTS = 1000  # points drawn of one logged metric at most (every k-th step past that: the file stays small)


def _ticks(lo: float, hi: float, n: int = 4) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 5, 10) if m * mag >= raw), default=raw)
    start = math.ceil(lo / step) * step
    return [start + i * step for i in range(int((hi - start) / step) + 1)]


def _fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.2e}"


def _tick_labels(ticks: list[float]) -> list[str]:
    """Labels of evenly spaced ticks with the digits their spacing needs (41.20, 41.21, never "41.2" twice)."""
    if len(ticks) < 2:
        return [_fmt(t) for t in ticks]
    step = ticks[1] - ticks[0]
    big = max(abs(t) for t in ticks)
    if big >= 1e4 or (0 < big < 1e-3):  # e-notation, as many mantissa digits as the step needs
        digits = max(0, math.floor(math.log10(big)) - math.floor(math.log10(step)))
        return [f"{t:.{digits}e}".replace("e+0", "e").replace("e+", "e").replace("e-0", "e-") for t in ticks]
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    return [f"{t:.{decimals}f}" for t in ticks]


def _place_labels(marks: list[tuple[float, str]], left: float, right: float, rows: int = 3) -> dict[int, tuple[float, int]]:
    """Marker labels laid out without meeting: each right of its line (or left of it, at the plot's right edge)
    in the first of `rows` rows where it meets no other label; {index in marks: (x, row)} of those placed."""
    placed: dict[int, tuple[float, int]] = {}
    boxes: list[tuple[float, float, int]] = []
    for i in sorted(range(len(marks)), key=lambda i: marks[i][0]):
        px, label = marks[i]
        w = CHAR_W * len(label) + 2
        for row in range(rows):
            x = next((x for x in (px + 3, px - 3 - w) if x >= left and x + w <= right
                      and not any(r == row and x < ox + ow + 2 and ox < x + w + 2 for ox, ow, r in boxes)), None)
            if x is not None:
                placed[i] = (x, row)
                boxes.append((x, w, row))
                break
    return placed


def line_chart(title: str, series: list[tuple[str, list, list, str]], *, band: tuple[list, list, list] | None = None,
               points: list[tuple[str, list, list, str]] = (), markers: list[tuple[float, str]] = (),
               y_label: str = "", x_label: str = "step") -> str:
    """An SVG line chart: series (name, xs, ys, color); an optional band (xs, lo, hi); points; and
    vertical markers (x, label)."""
    xs_all = [x for _, xs, ys, _ in [*series, *points] for x, y in zip(xs, ys) if y is not None]
    ys_all = [y for _, xs, ys, _ in [*series, *points] for y in ys if y is not None]
    if band:
        xs_all += band[0]
        ys_all += [v for v in band[1] + band[2] if v is not None]
    if not ys_all:
        return f'<div class="chart empty"><h3>{html.escape(title)}</h3><p>no data in the ledger</p></div>'
    x0, x1 = min(xs_all), max(xs_all)
    y0, y1 = min(ys_all), max(ys_all)
    if y1 == y0:
        y0, y1 = y0 - 0.5 * abs(y0 or 1), y1 + 0.5 * abs(y1 or 1)
    x1 = x1 if x1 > x0 else x0 + 1
    yticks = _ticks(y0, y1)
    ylabels = _tick_labels(yticks)
    pad = max(PAD, 8 + CHAR_W * max(len(t) for t in ylabels))  # the y labels' column: none cut at the left edge
    sx = lambda x: pad + (x - x0) / (x1 - x0) * (W - pad - 12)  # noqa: E731
    sy = lambda y: H - 28 - (y - y0) / (y1 - y0) * (H - 46)  # noqa: E731
    out = [f'<svg viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-label="{html.escape(title)}">']
    for t, label in zip(yticks, ylabels):
        out.append(f'<line x1="{pad}" x2="{W - 12}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" class="grid"/>'
                   f'<text x="{pad - 4}" y="{sy(t) + 4:.1f}" class="ytick">{label}</text>')
    xticks = _ticks(x0, x1, 5)
    for t, label in zip(xticks, _tick_labels(xticks)):  # (centred under its tick, kept inside the chart)
        half = CHAR_W * len(label) / 2
        out.append(f'<text x="{min(max(sx(t), half + 1), W - half - 1):.1f}" y="{H - 15}" class="xtick">{label}</text>')
    if band:
        bx, lo, hi = band
        pts = [(x, low, h) for x, low, h in zip(bx, lo, hi) if low is not None and h is not None]
        if pts:
            poly = " ".join(f"{sx(x):.1f},{sy(h):.1f}" for x, _, h in pts) + " " + \
                " ".join(f"{sx(x):.1f},{sy(low):.1f}" for x, low, _ in reversed(pts))
            out.append(f'<polygon points="{poly}" class="band"/>')
    for x, _ in markers:
        out.append(f'<line x1="{sx(x):.1f}" x2="{sx(x):.1f}" y1="14" y2="{H - 28}" class="marker"/>')
    placed = _place_labels([(sx(x), label) for x, label in markers], pad, W - 12)
    for i, (x, row) in placed.items():  # rows of labels that meet no other; the rest listed under the chart
        out.append(f'<text x="{x:.1f}" y="{24 + 13 * row}" class="mlabel">{html.escape(markers[i][1])}</text>')
    unplaced = [m for i, m in enumerate(markers) if i not in placed]
    for name, xs, ys, color in series:
        pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
        if pts:
            d = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
            out.append(f'<polyline points="{d}" fill="none" stroke="{color}" stroke-width="2.5"><title>{html.escape(name)}</title></polyline>')
    for name, xs, ys, color in points:
        for x, y in zip(xs, ys):
            if y is not None:
                out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4" fill="{color}"><title>{html.escape(name)}</title></circle>')
    out.append(f'<text x="{W - 12}" y="{H - 3}" class="axis" text-anchor="end" style="text-anchor:end">{html.escape(x_label)}</text>')
    out.append(f'<text x="4" y="10" class="axis">{html.escape(y_label)}</text></svg>')
    legend = "".join(f'<span><i style="background:{c}"></i>{html.escape(n)}</span>' for n, *_, c in [*series, *points])
    if unplaced:
        legend += "<span>also marked: " + html.escape(", ".join(f"{label} at {_fmt(x)}" for x, label in unplaced)) + "</span>"
    return f'<div class="chart"><h3>{html.escape(title)}</h3>{"".join(out)}<div class="legend">{legend}</div></div>'


CHAR_W = 6.2  # px per character of the charts' 10px labels at most (system-ui digits and lowercase are narrower)


def bar_chart(title: str, groups: list[str], series: list[tuple[str, list[float], str]]) -> str:
    """Grouped horizontal bars (e.g. data mixture declared vs realised per domain): each group's name in a
    column of its own at the left, each bar's value and name right of the bar, the bars scaled so that the
    longest label still ends inside the chart (no label over a bar, another label or the edge)."""
    if not groups:
        return f'<div class="chart empty"><h3>{html.escape(title)}</h3><p>no data in the ledger</p></div>'
    row_h = 16 * len(series) + 10
    height = 20 + row_h * len(groups)
    vmax = max([v for _, vals, _ in series for v in vals] + [1e-9])
    name_w = min(W // 3, 8 + CHAR_W * max(len(g) for g in groups))  # the groups' names' column
    texts = [[f"{v:.1%} {name}" for v in vals] for name, vals, _ in series]
    label_w = 6 + CHAR_W * max(len(t) for ts in texts for t in ts)
    bars_w = max(40.0, W - name_w - 8 - label_w)
    out = [f'<svg viewBox="0 0 {W} {height}" width="{W}" height="{height}" role="img" aria-label="{html.escape(title)}">']
    for gi, g in enumerate(groups):
        y = 10 + gi * row_h
        out.append(f'<text x="4" y="{y + 14}" class="glabel">{html.escape(g)}</text>')
        for si, (name, vals, color) in enumerate(series):
            w = bars_w * vals[gi] / vmax
            out.append(f'<rect x="{name_w:.1f}" y="{y + si * 16}" width="{w:.1f}" height="13" fill="{color}"/>'
                       f'<text x="{name_w + w + 4:.1f}" y="{y + si * 16 + 11}" class="vlabel">{html.escape(texts[si][gi])}</text>')
    out.append("</svg>")
    return f'<div class="chart"><h3>{html.escape(title)}</h3>{"".join(out)}</div>'


def table(columns: list[str], rows: list, limit: int = 200) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = []
    for r in rows[:limit]:
        cells = []
        for c, v in zip(columns, r):
            text = "" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))
            cls = f' class="s-{text}"' if c == "status" else ""
            cells.append(f"<td{cls}>{html.escape(text[:300])}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _rows(con, sql: str, **params) -> list[dict]:
    cur = con.execute(sql, params)
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def gather(root: Path, run_id: str) -> dict:
    """Everything the report shows, from the ledger's views."""
    from runledger import queries

    con = queries.connect(root)
    steps = _rows(con, "select step, loss, grad_norm, lr, mfu, tokens from steps where run_id = $r order by step", r=run_id)
    plan = _rows(con, "select tokens_per_step, data_mixture from runs where run_id = $r order by stream_seq desc limit 1", r=run_id)
    tps = (plan[0]["tokens_per_step"] if plan else None) or 1
    # the forecast in force: each plan's points where it governed the run (views.sql forecast_points)
    forecasts = _rows(con, """
        select fraction, at_tokens as target_tokens, projected_loss, band_low, band_high, band_level, revision, decision_id
        from forecast_points where run_id = $r and in_force order by at_tokens""", r=run_id)
    revisions = _rows(con, """
        select revision, decision_id, any_value(from_step) as from_step, count(*) as points,
               coalesce(any_value(horizon_tokens), max(at_tokens)) as horizon_tokens, bool_and(supported) as supported
        from forecast_points where run_id = $r group by all order by revision""", r=run_id)
    layers = _rows(con, """
        select d.step, l.layer, l.drop_fraction
        from (select * from drops where run_id = $r
              qualify row_number() over (partition by step order by attempt desc, seq desc) = 1) d,
             unnest(from_json(d.layers, '[{"layer":"BIGINT","drop_fraction":"DOUBLE"}]')) as t(l)
        order by d.step""", r=run_id)
    totals = _rows(con, """select step, drop_fraction from drops where run_id = $r
                           qualify row_number() over (partition by step order by attempt desc, seq desc) = 1
                           order by step""", r=run_id)
    decisions = _rows(con, """
        select d.step as decided_at, d.agent, d.action, d.mode, d.rationale, a.step as applied_at, a.status
        from decisions d left join decisions_applied a on a.run_id = d.run_id and a.decision_id = d.decision_id
        where d.run_id = $r and d.action not in ('approve', 'reject') order by d.stream_seq""", r=run_id)
    mixture = _rows(con, "select tokens_per_domain from data where run_id = $r", r=run_id)
    realised: dict[str, int] = {}
    for m in mixture:
        for k, v in json.loads(m["tokens_per_domain"] or "{}").items():
            realised[k] = realised.get(k, 0) + v
    declared = json.loads(plan[0]["data_mixture"]) if plan and plan[0]["data_mixture"] else {}
    health = None
    try:
        from runledger.queries.audit import run_suite

        health = run_suite(root, "health", run_id)
    except Exception as err:  # the report still shows everything else
        log.warning("health suite unavailable: %s", err)
    logged = _rows(con, "select key, step, value from metrics where run_id = $r and value is not null "
                        "order by key, step", r=run_id)
    return {"metrics": logged, "steps": steps, "tps": tps, "forecasts": forecasts, "revisions": revisions, "layers": layers, "drop_totals": totals,
            "decisions": decisions, "realised": realised, "declared": declared, "health": health}


CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px} h3{font-size:14px;margin:4px 0}
.grid-2{display:flex;flex-wrap:wrap;gap:18px} .chart{border:1px solid #ddd;border-radius:6px;padding:8px}
svg text{font-size:10px;fill:#555} .ytick{text-anchor:end} .xtick{text-anchor:middle} .vlabel,.glabel{text-anchor:start} .axis{font-size:10px}
.grid{stroke:#eee} .band{fill:#1f77b4;opacity:.18} .marker{stroke:#000;stroke-dasharray:4 3;opacity:.6}
.mlabel{font-size:10px;fill:#000} .legend span{margin-right:12px;font-size:12px} .legend i{display:inline-block;width:10px;height:10px;margin-right:4px}
table{border-collapse:collapse;font-size:12px;margin-top:6px} td,th{border:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f5f5f5} .s-ok{color:#2a7} .s-warn{color:#c80} .s-fail{color:#c00;font-weight:bold} .s-skip{color:#888}
.empty p{color:#888}
"""


def metric_groups(rows: list[dict]) -> dict[str, dict[str, tuple[list, list]]]:
    """Every metric logged (rows of key, step, value), grouped by prefix (the name up to its last `/`;
    "" for a name without one): prefix -> name -> (steps, values), at most METRIC_POINTS of each."""
    series: dict[str, tuple[list, list]] = {}
    for r in rows:
        xs, ys = series.setdefault(r["key"], ([], []))
        xs.append(r["step"])
        ys.append(r["value"])
    groups: dict[str, dict[str, tuple[list, list]]] = {}
    for name, (xs, ys) in sorted(series.items()):
        every = -(-len(xs) // METRIC_POINTS)
        picked = (xs[::every] + xs[-1:], ys[::every] + ys[-1:]) if every > 1 else (xs, ys)
        groups.setdefault(name.rpartition("/")[0], {})[name] = picked
    return groups


def metric_charts(rows: list[dict]) -> str:
    """The section of every metric the run logged, a chart each, grouped by prefix."""
    groups = metric_groups(rows)
    if not groups:
        return "<p>No metrics logged with <code>runledger.log</code>.</p>"
    out = []
    for prefix, named in groups.items():
        charts = [line_chart(name, [(name, xs, ys, PALETTE[i % len(PALETTE)])], y_label=name.rpartition("/")[2])
                  for i, (name, (xs, ys)) in enumerate(named.items())]
        out.append(f"<h3>{html.escape(prefix + '/' if prefix else '(no prefix)')}</h3><div class='grid-2'>"
                   + "".join(charts) + "</div>")
    return "".join(out)


def band_levels(points: list[dict]) -> str:
    """The forecast band's nominal level(s) in words: "95% band"; "band of no stated level" where none is."""
    levels = sorted({round(100 * p["band_level"]) for p in points if p.get("band_level") is not None})
    if not levels:
        return "band of no stated level"
    unstated = any(p.get("band_level") is None for p in points)
    return "/".join(f"{v}%" for v in levels) + " band" + (", some points of no stated level" if unstated else "")


def render(run_id: str, d: dict) -> str:
    steps = d["steps"]
    xs = [s["step"] for s in steps]
    fx = [f["target_tokens"] / d["tps"] for f in d["forecasts"] if f["target_tokens"] is not None]
    fc = [f for f in d["forecasts"] if f["target_tokens"] is not None]
    applied = [r for r in d["decisions"] if r["applied_at"] is not None]
    markers = [(r["applied_at"], r["action"].replace("set_", "")) for r in applied]
    revised = [(r["from_step"], f"forecast r{r['revision']}") for r in d.get("revisions", []) if r["revision"]]
    charts = [
        line_chart(f"Loss vs forecast in force ({band_levels(fc)})", [("loss", xs, [s["loss"] for s in steps], SERIES["loss"])],
                   band=(fx, [f["band_low"] for f in fc], [f["band_high"] for f in fc]) if fc else None,
                   points=[("forecast in force (ladder)", fx, [f["projected_loss"] for f in fc], SERIES["forecast"])] if fc else [],
                   markers=revised, y_label="loss"),
        line_chart("Grad norm", [("grad norm", xs, [s["grad_norm"] for s in steps], SERIES["grad_norm"])], y_label="‖g‖"),
    ]
    by_layer: dict[int, tuple[list, list]] = {}
    for r in d["layers"]:
        by_layer.setdefault(r["layer"], ([], []))
        by_layer[r["layer"]][0].append(r["step"])
        by_layer[r["layer"]][1].append(r["drop_fraction"])
    drop_series = [(f"layer {k}", v[0], v[1], PALETTE[(k + 2) % len(PALETTE)]) for k, v in sorted(by_layer.items())]
    if not drop_series and d["drop_totals"]:
        drop_series = [("all layers", [r["step"] for r in d["drop_totals"]], [r["drop_fraction"] for r in d["drop_totals"]], PALETTE[2])]
    charts.append(line_chart("Token drop fraction per layer", drop_series, markers=markers, y_label="dropped"))
    charts.append(line_chart("MFU", [("MFU", xs, [s["mfu"] for s in steps], SERIES["mfu"])], y_label="MFU"))
    charts.append(line_chart("Learning rate, decisions marked", [("lr", xs, [s["lr"] for s in steps], SERIES["lr"])],
                             markers=markers, y_label="lr"))
    domains = sorted(set(d["declared"]) | set(d["realised"]))
    total = sum(d["realised"].values()) or 1
    charts.append(bar_chart("Data mixture: declared vs realised", domains, [
        ("declared", [d["declared"].get(k, 0.0) for k in domains], "#bbb"),
        ("realised", [d["realised"].get(k, 0) / total for k in domains], PALETTE[0])]))
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>runledger report: {html.escape(run_id)}</title>",
             f"<style>{CSS}</style></head><body>",
             f"<h1>Run {html.escape(run_id)}</h1><p>{len(steps)} steps in the ledger; every figure below is read "
             "from it and can be re-derived with <code>runledger sql</code>.</p>",
             "<h2>Training</h2><div class='grid-2'>" + "".join(charts) + "</div>",
             "<h2>Metrics logged</h2>", metric_charts(d.get("metrics", [])),
             "<h2>Forecast plans</h2>",
             table(["revision", "decision_id", "from_step", "horizon_tokens", "points", "supported"],
                   [[r[c] for c in ("revision", "decision_id", "from_step", "horizon_tokens", "points", "supported")]
                    for r in d.get("revisions", [])]) if d.get("revisions") else "<p>No forecast.</p>",
             "<h2>Decision trail</h2>",
             table(["decided_at", "agent", "action", "mode", "applied_at", "status", "rationale"],
                   [[r[c] for c in ("decided_at", "agent", "action", "mode", "applied_at", "status", "rationale")]
                    for r in d["decisions"]]) if d["decisions"] else "<p>No decisions.</p>"]
    if d["health"] is not None:
        rows = d["health"].rows() if hasattr(d["health"], "rows") else []
        cols = ["check", "status", "value", "threshold", "at_step", "evidence"]
        parts += ["<h2>Health checklist</h2>", table(cols, [[r.get(c) for c in cols] for r in rows])]
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(root: str | Path, run_id: str, out: str | Path) -> Path:
    out = Path(out)
    out.write_text(render(run_id, gather(Path(root), run_id)))
    return out


def register(sub) -> None:
    s = sub.add_parser("report", help="a self-contained HTML report with plots")
    s.add_argument("run", type=checks.run, help=RUN_HELP)
    add_root(s)
    s.add_argument("--out", type=checks.file_out, required=True, help="the HTML file to write")
    s.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    import duckdb

    from runledger.ledger.storage.paths import event_files
    from runledger.ledger.contract.validation import check_name

    check_name(args.run, "run_id")
    if not event_files(Path(args.root), run_id=args.run):
        raise UsageError(f"no events for run {args.run!r} under {args.root}")
    try:
        path = write_report(args.root, args.run, args.out)
    except duckdb.Error as err:  # a stored file that is not Parquet, say
        raise UsageError(f"cannot read the ledger under {args.root}: {str(err).splitlines()[0]}") from None
    log.info("wrote %s", path)
    print(path)
    return 0

// runledger ui: the page's views (runs, run, compare, ladder, SQL), routed by the address's #fragment.
// Charts are uPlot; their points come downsampled (min/max per pixel bucket, in SQL) from /api/run/R/series, exact once zoomed
// in, and new points arrive over /api/live (server-sent events) once the ledger has stored them.
// The token comes once in the address (?token=T): it is kept in sessionStorage (this origin's, this tab's),
// taken out of the address, and sent in a header on every request; never in a cookie (ui/access.py).
"use strict";

const $main = document.getElementById("main");
const $live = document.getElementById("live");
const COLORS = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"];
let source = null; // the event stream of the current view ({close})
const TOKEN_KEY = "rl-token";
(function takeToken() {
  const u = new URL(location.href);
  if (!u.searchParams.has("token")) return;
  sessionStorage.setItem(TOKEN_KEY, u.searchParams.get("token"));
  u.searchParams.delete("token");
  history.replaceState(null, "", u.pathname + u.search + u.hash);
})();
window.rlCharts = []; // every chart drawn on the current view (the browser tests read them)

function esc(s) {
  return String(s ?? "").replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
}
function fmt(v) {
  if (v === null || v === undefined) return "";
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : (Math.abs(v) < 1e4 && Math.abs(v) >= 1e-3 ? v.toPrecision(4) : v.toExponential(3));
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}
function age(s) {
  if (s === null || s === undefined) return "";
  if (s < 90) return `${Math.round(s)} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  if (s < 172800) return `${Math.round(s / 3600)} h`;
  return `${Math.round(s / 86400)} d`;
}
function headers(extra) { // what every request carries: the token, if the page has one, and a header no other origin's page can send
  const h = Object.assign({"x-requested-with": "runledger"}, extra || {});
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) h["x-runledger-token"] = token;
  return h;
}
async function api(path, opts) {
  opts = Object.assign({credentials: "omit"}, opts || {});
  opts.headers = headers(opts.headers);
  const r = await fetch(path, opts);
  const text = await r.text();
  let body;
  try { body = JSON.parse(text); } catch (e) { body = {error: text || `HTTP ${r.status}`}; }
  if (!r.ok) throw new Error(body.error || `HTTP ${r.status}`);
  return body;
}
function table(columns, rows, cell) {
  const head = columns.map(c => `<th>${esc(c)}</th>`).join("");
  const body = rows.map((r, i) => "<tr>" + columns.map((c, j) => `<td>${cell ? cell(r, c, j, i) : esc(fmt(Array.isArray(r) ? r[j] : r[c]))}</td>`).join("") + "</tr>").join("");
  return `<table><thead><tr>${head}</tr></thead><tbody>${body}</tbody></table>`;
}
// The badge says one state (ui/live.py Feed.status): live via NATS, live by polling the tables, or not live
// and why; each part is written only when it changes (a reconnect that finds the same state changes nothing).
function setLive(st) {
  const text = !st.live ? `not live: ${st.reason}` :
    `live ${st.via === "nats" ? "via NATS" : "by polling the tables"} · ledger position ${st.position}`;
  const cls = "live " + (st.live ? "on" : "off"), via = st.via || "none";
  if ($live.textContent !== text) $live.textContent = text;
  if ($live.className !== cls) $live.className = cls;
  if ($live.title !== st.reason) $live.title = st.reason;
  if ($live.dataset.via !== via) $live.dataset.via = via;
}
// The live event stream (server-sent events read with fetch, which sends the token's header as EventSource
// cannot); `url` a function, asked again at each reconnect (a run's page resumes from the last seq it got).
// A stream that ends is opened again at once; the badge says the dashboard is not live only once that fails
// (the dashboard's server does not answer), and the stream's first event, its status, says the state again.
function follow(url, handlers) {
  if (source) source.close();
  const ctl = new AbortController();
  const me = {closed: false, close() { this.closed = true; ctl.abort(); }};
  source = me;
  const dispatch = (event, data) => {
    if (event === "status") setLive(data);
    else if (event === "stored") { setLive(data); handlers.stored && handlers.stored(data); }
    else if (event === "points" && handlers.points) handlers.points(data);
  };
  (async () => {
    let failed = 0; // opens of the stream that failed in a row
    while (!me.closed) {
      let opened = false, why = "";
      try {
        const r = await fetch(url(), {headers: headers(), credentials: "omit", cache: "no-store", signal: ctl.signal});
        if (!r.ok) throw new Error(`HTTP ${r.status}`);
        opened = true;
        const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
        let buf = "";
        for (;;) {
          const {value, done} = await reader.read();
          if (done) break;
          buf += value;
          for (let i = buf.indexOf("\n\n"); i >= 0; i = buf.indexOf("\n\n")) {
            let event = "message", data = "";
            for (const line of buf.slice(0, i).split("\n")) {
              if (line.startsWith("event: ")) event = line.slice(7);
              else if (line.startsWith("data: ")) data += line.slice(6);
            }
            buf = buf.slice(i + 2);
            if (data) dispatch(event, JSON.parse(data));
          }
        }
      } catch (e) { why = e.message; } // the stream broke, or could not be opened: start it again
      if (me.closed) return;
      failed = opened ? 0 : failed + 1;
      if (failed) setLive({live: false, via: null, reason: `the dashboard's server does not answer (${why}): trying again`, position: 0});
      await new Promise(r => setTimeout(r, failed ? 2000 : 200));
    }
  })();
}

// ------------------------------------------------------------------------------------- charts
const AXIS_FONT_PX = 11, AXIS_FONT = `${AXIS_FONT_PX}px system-ui, sans-serif`, MARK_FONT_PX = 10;
const TICK_SIZE = 6, TICK_GAP = 4; // an axis's tick length and the gap between a tick and its label (CSS px)
const SI = ["", "k", "M", "G", "T", "P"];
function textWidth(text, px) { // a label's width in CSS px, in the axes' font
  const ctx = textWidth.ctx || (textWidth.ctx = document.createElement("canvas").getContext("2d"));
  ctx.font = px ? `${px}px system-ui, sans-serif` : AXIS_FONT;
  return ctx.measureText(text).width;
}
// An axis's tick labels: as many digits as the ticks need to read as their values (41.20, 41.21, 41.22,
// never "41.2" four times), plain, with an SI suffix (2.5M) or in e-notation (1e18, on log axes) by size.
function tickLabels(vals, log) {
  const vs = vals.filter(v => v !== null && v !== undefined && isFinite(v));
  if (!vs.length) return vals.map(() => "");
  const big = Math.max(...vs.map(Math.abs)), nz = vs.filter(v => v !== 0).map(Math.abs);
  const small = nz.length ? Math.min(...nz) : 1;
  const sorted = [...new Set(vs)].sort((a, b) => a - b);
  let step = Infinity;
  for (let i = 1; i < sorted.length; i++) step = Math.min(step, sorted[i] - sorted[i - 1]);
  let mode = "exp", k = 0;
  if (big < 1e4 && small >= 1e-3) mode = "fixed";
  else if (!log && big >= 1e4 && big < 1e18 && (small >= 1 || step >= 1)) { mode = "si"; k = Math.min(SI.length - 1, Math.floor(Math.log10(big) / 3)); }
  const one = (v, d) => {
    if (mode === "fixed") return v.toFixed(d);
    if (mode === "si") return (v / Math.pow(1000, k)).toFixed(d) + SI[k];
    return v.toExponential(d).replace("e+", "e");
  };
  const back = (t) => mode === "si" ? parseFloat(t) * Math.pow(1000, k) : parseFloat(t);
  let out = null;
  for (let d = 0; d <= 12; d++) {
    out = vals.map(v => v === null || v === undefined || !isFinite(v) ? "" : one(v, d));
    const shown = out.filter(t => t !== "");
    const exact = vs.every((v, i) => Math.abs(back(one(v, d)) - v) <= 1e-6 * (log ? Math.abs(v) : Math.min(step, Math.abs(v) || step)));
    if (exact && new Set(shown).size === shown.length) return out;
  }
  return out;
}
function positiveSpan(values) { // the decades spanned by `values` when every one of them is > 0 (else 0)
  let lo = Infinity, hi = -Infinity;
  for (const v of values) {
    if (v === null || v === undefined || Number.isNaN(v)) continue;
    if (v <= 0) return 0;
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  return hi >= lo ? Math.log10(hi / lo) : 0;
}
const LOG_DECADES = 2; // a chart whose positive values span this many decades or more is drawn on a log axis
// A chart holds tables per series (name -> [xs, ys]) and draws them joined on x.
// Zoom (drag) asks onZoom for the range's exact points; a double-click or the "reset zoom" button puts back
// the full range's points (kept while zoomed, so nothing is fetched again); redraws that do not change the
// range fetch nothing.
class Chart {
  constructor(parent, title, opts) {
    this.el = document.createElement("div");
    this.el.className = "chart";
    this.el.dataset.title = title;
    this.el.dataset.points = "0";
    parent.appendChild(this.el);
    this.title = title;
    this.opts = opts || {};
    this.tables = new Map();
    this.markers = [];
    this.band = null; // [xs, lo, hi] drawn as a filled band
    this.plot = null;
    this.zoomed = false;
    this.full = null; // the full range's tables while zoomed
    this.asked = null; // the x range last asked of onZoom
    this.labels = {axes: [], markers: [], hidden: []}; // what the last draw wrote, with boxes in CSS px of the canvas (tests read them)
    window.rlCharts.push(this);
  }
  set(name, xs, ys) { this.tables.set(name, [xs.slice(), ys.slice()]); }
  append(name, xs, ys) {
    for (const tables of this.full ? [this.tables, this.full] : [this.tables]) {
      const t = tables.get(name) || [[], []];
      const last = t[0].length ? t[0][t[0].length - 1] : -Infinity;
      for (let i = 0; i < xs.length; i++) if (xs[i] > last) { t[0].push(xs[i]); t[1].push(ys[i]); }
      tables.set(name, t);
    }
  }
  points() { let n = 0; for (const [xs] of this.tables.values()) n += xs.length; return n; }
  fullRange() { // the x range of every point held (the full range's, while zoomed)
    let lo = Infinity, hi = -Infinity;
    for (const [xs] of (this.full || this.tables).values()) if (xs.length) { lo = Math.min(lo, xs[0]); hi = Math.max(hi, xs[xs.length - 1]); }
    if (this.band && this.band[0].length) { lo = Math.min(lo, this.band[0][0]); hi = Math.max(hi, this.band[0][this.band[0].length - 1]); }
    return [lo, hi];
  }
  data() {
    const tables = [...this.tables.keys()].map(n => this.tables.get(n));
    if (this.band) { tables.push([this.band[0], this.band[1]]); tables.push([this.band[0], this.band[2]]); }
    return tables.length === 1 ? [tables[0][0], tables[0][1]] : uPlot.join(tables);
  }
  logAxis(which) { // log when asked (opts.xLog / opts.yLog), or for y when its positive values span LOG_DECADES
    const asked = which === "x" ? this.opts.xLog : this.opts.yLog;
    if (asked !== undefined) return !!asked;
    if (which === "x") return false; // (steps from 1 to 1M span decades too: an x axis is log only when asked)
    const ys = [];
    for (const [, v] of this.tables.values()) ys.push(...v);
    if (this.band) ys.push(...this.band[1], ...this.band[2]);
    return positiveSpan(ys) >= LOG_DECADES;
  }
  draw() {
    const names = [...this.tables.keys()];
    const width = Math.max(300, this.el.clientWidth - 12 || 520);
    if (!names.length && !this.band) {
      this.el.innerHTML = `<div><b>${esc(this.title)}</b></div><div class="empty">no data in the ledger</div>`;
      return;
    }
    const bandIdx = this.band ? names.length + 1 : null;
    const data = this.data();
    const series = [{label: this.opts.xLabel || "step"}];
    names.forEach((n, i) => series.push({label: n, stroke: this.opts.colors ? this.opts.colors[i % this.opts.colors.length] : COLORS[i % COLORS.length], width: 1.25, spanGaps: true, points: {show: false}}));
    const xLog = this.logAxis("x"), yLog = this.logAxis("y");
    const labels = log => (u, vals) => tickLabels(vals, log);
    const axis = {font: AXIS_FONT, ticks: {size: TICK_SIZE}, gap: TICK_GAP};
    const opts = {
      title: this.title, width, height: 230, series,
      scales: {x: {time: !!this.opts.time, distr: xLog ? 3 : 1}, y: {distr: yLog ? 3 : 1}},
      axes: [
        // x: ticks far enough apart for their labels (the widest label of the range, and a gap)
        Object.assign({}, axis, this.opts.time ? {} : {values: labels(xLog),
          space: (u, i, lo, hi) => Math.max(50, 16 + Math.max(...tickLabels([lo, hi, (lo + hi) / 2], xLog).map(t => textWidth(t))))}),
        // y: as wide as its widest label, so none is cut at the left edge
        Object.assign({}, axis, {values: labels(yLog), size: (u, values) => Math.ceil(Math.max(24, ...(values || []).map(t => textWidth(t || "")))) + TICK_SIZE + TICK_GAP + 6}),
      ],
      legend: {live: true}, cursor: {drag: {x: true, y: false}, bind: {dblclick: () => () => { this.resetZoom(); return null; }}},
      hooks: {setScale: [(u, key) => { if (key === "x" && this._ready) this.scaled(u.scales.x.min, u.scales.x.max); }],
              draw: [u => { this.drawMarkers(u); this.measure(u); }]},
    };
    if (bandIdx !== null) {
      const name = this.bandName ? `forecast ${this.bandName}` : "forecast band"; // its level, where stated
      series.push({label: `${name} low`, stroke: "#1f77b4", dash: [4, 4], spanGaps: true, width: 1});
      series.push({label: `${name} high`, stroke: "#1f77b4", dash: [4, 4], spanGaps: true, width: 1});
      opts.bands = [{series: [bandIdx + 1, bandIdx], fill: "rgba(31,119,180,0.15)"}];
    }
    this._ready = false;
    if (this.plot) this.plot.destroy();
    this.el.innerHTML = "";
    this.plot = new uPlot(opts, data, this.el);
    this.reset = document.createElement("button");
    this.reset.className = "reset-zoom";
    this.reset.textContent = "reset zoom";
    this.reset.title = "back to the full range (or double-click the chart)";
    this.reset.onclick = () => this.resetZoom();
    this.el.appendChild(this.reset);
    this.legendEl = document.createElement("div");
    this.legendEl.className = "marker-legend muted";
    this.el.appendChild(this.legendEl);
    this.showZoom();
    this._ready = true;
    this.el.dataset.points = String(this.points());
    this.asked = null;
    if (window.rlFirstChart === undefined && this.points()) window.rlFirstChart = performance.now(); // (bench/ui.py reads it)
    this.drawMarkers(this.plot, true);
  }
  // the x scale changed: a zoom (drag) asks for the range's points; a scale over the whole data (the first
  // draw, a redraw, new data) changes nothing and fetches nothing
  scaled(lo, hi) {
    const [flo, fhi] = this.fullRange();
    if (lo <= flo && hi >= fhi) { if (this.zoomed) this.resetZoom(); return; }
    if (this.asked && this.asked[0] === lo && this.asked[1] === hi) return; // what is drawn already
    this.asked = [lo, hi];
    if (!this.zoomed) { this.zoomed = true; this.full = this.full || new Map([...this.tables].map(([n, [xs, ys]]) => [n, [xs.slice(), ys.slice()]])); }
    this.showZoom();
    if (this.onZoom) this.onZoom(lo, hi);
  }
  resetZoom() { // back to the full range: the points kept from before the zoom, drawn again (nothing fetched)
    if (!this.plot) return;
    if (this.full) { this.tables = this.full; this.full = null; }
    this.zoomed = false;
    this.asked = null;
    this._ready = false;
    this.plot.setData(this.data(), true);
    this._ready = true;
    this.el.dataset.points = String(this.points());
    this.el.dataset.zoom = "";
    this.showZoom();
  }
  showZoom() { if (this.reset) this.reset.style.display = this.zoomed ? "" : "none"; }
  // decision labels: each beside its line at the plot's top, in the first of MARKER_ROWS rows where it meets
  // no other label (left of its line when it would leave the plot); one that fits nowhere goes to the
  // line of labels under the chart
  drawMarkers(u, legendOnly) {
    if (!this.markers.length) return;
    const dpr = devicePixelRatio, left = u.bbox.left / dpr, right = (u.bbox.left + u.bbox.width) / dpr, top = u.bbox.top / dpr;
    const rows = [], placed = [], hidden = [];
    const rowH = MARK_FONT_PX + 4, maxRows = Math.max(1, Math.min(3, Math.floor((u.bbox.height / dpr) / rowH / 2)));
    for (const [x, label] of [...this.markers].sort((a, b) => a[0] - b[0])) {
      const px = u.valToPos(x, "x") + left;
      if (!(px >= left && px <= right)) continue;
      const w = textWidth(label, MARK_FONT_PX) + 4;
      let box = null;
      for (let r = 0; r < maxRows && !box; r++) {
        for (const x0 of [px + 3, px - 3 - w]) {
          const b = {x0, x1: x0 + w, y0: top + 2 + r * rowH, y1: top + 2 + r * rowH + rowH - 2, px, label};
          if (b.x0 < left || b.x1 > right) continue;
          if ((rows[r] || []).some(o => b.x0 < o.x1 + 2 && o.x0 < b.x1 + 2)) continue;
          box = b; (rows[r] = rows[r] || []).push(b); break;
        }
      }
      (box ? placed : hidden).push(box || {px, label, x});
    }
    this.labels.markers = placed;
    this.labels.hidden = hidden.map(h => h.label);
    if (this.legendEl) this.legendEl.textContent = hidden.length ? "also marked: " + hidden.map(h => `${h.label} at ${fmt(h.x)}`).join(", ") : "";
    if (legendOnly) return;
    const ctx = u.ctx;
    ctx.save();
    ctx.font = `${MARK_FONT_PX * dpr}px system-ui, sans-serif`;
    ctx.textBaseline = "top"; ctx.textAlign = "left"; // (uPlot leaves its last axis's alignment on the context)
    for (const m of [...placed, ...hidden]) {
      ctx.strokeStyle = "#000"; ctx.setLineDash([4, 3]); ctx.lineWidth = 1;
      ctx.beginPath(); ctx.moveTo(m.px * dpr, u.bbox.top); ctx.lineTo(m.px * dpr, u.bbox.top + u.bbox.height); ctx.stroke();
    }
    for (const b of placed) {
      ctx.fillStyle = "rgba(255,255,255,0.85)"; ctx.fillRect(b.x0 * dpr, b.y0 * dpr, (b.x1 - b.x0) * dpr, (b.y1 - b.y0) * dpr);
      ctx.fillStyle = "#000"; ctx.fillText(b.label, (b.x0 + 2) * dpr, (b.y0 + 1) * dpr);
    }
    ctx.restore();
  }
  // the tick labels the last draw wrote and their boxes (CSS px of the canvas): x labels centred under
  // their tick, y labels right-aligned left of theirs (uPlot's placement, with this chart's tick size and gap)
  measure(u) {
    const dpr = devicePixelRatio, left = u.bbox.left / dpr, top = u.bbox.top / dpr, bottom = (u.bbox.top + u.bbox.height) / dpr;
    this.labels.axes = u.axes.map((a, i) => {
      const key = i === 0 ? "x" : "y", texts = a._values || [], splits = a._splits || [];
      const boxes = [];
      texts.forEach((t, j) => {
        if (t === null || t === undefined || t === "") return;
        const lines = String(t).split("\n"), h = AXIS_FONT_PX * (1 + 1.5 * (lines.length - 1)); // (a time label: two lines)
        const w = Math.max(...lines.map(l => textWidth(l))), pos = u.valToPos(splits[j], key);
        if (i === 0) boxes.push({text: String(t), x0: left + pos - w / 2, x1: left + pos + w / 2, y0: bottom + TICK_SIZE + TICK_GAP, y1: bottom + TICK_SIZE + TICK_GAP + h});
        else boxes.push({text: String(t), x0: left - TICK_SIZE - TICK_GAP - w, x1: left - TICK_SIZE - TICK_GAP, y0: top + pos - h / 2, y1: top + pos + h / 2});
      });
      return {scale: key, distr: u.scales[key].distr, boxes};
    });
    this.labels.canvas = {width: u.width, height: u.height};
  }
  update() {
    if (!this.plot) return this.draw();
    const names = [...this.tables.keys()];
    if (names.length !== this.plot.series.length - 1 - (this.band ? 2 : 0)) return this.draw();
    if ((this.plot.scales.y.distr === 3) !== this.logAxis("y")) return this.draw(); // (a value <= 0 on a log axis, say)
    this._ready = false;
    this.plot.setData(this.data(), !this.zoomed);
    this._ready = true;
    this.el.dataset.points = String(this.points());
  }
}
// a window resized: each chart drawn again at its new width from the points it holds (Chart.scaled fetches
// nothing for a range already drawn)
window.addEventListener("resize", () => {
  clearTimeout(window.rlResized);
  window.rlResized = setTimeout(() => {
    for (const c of window.rlCharts) if (c.plot) c.plot.setSize({width: Math.max(300, c.el.clientWidth - 12 || 520), height: 230});
  }, 150);
});

// ------------------------------------------------------------------------------------- runs
async function viewRuns(params) {
  window.rlRunsPage = 0; // (a new filter starts at the first page; a live reload keeps the page)
  const f = Object.assign({name: "", tag: "", status: "", config: ""}, params);
  const view = window.rlRunsView = {rows: [], columns: [], metrics: [], picked: new Set(), filters: {},
    sort: params.sort || "", desc: params.desc === "1"}; // (the column filters and the selection live with the page)
  $main.innerHTML = `<h1>Runs</h1>
    <div class="filters">
      <input id="f-name" placeholder="name contains" value="${esc(f.name)}">
      <input id="f-tag" placeholder="tag" value="${esc(f.tag)}">
      <select id="f-status">${["", "running", "silent", "completed", "failed", "stopped"].map(s => `<option ${s === f.status ? "selected" : ""}>${s}</option>`).join("")}</select>
      <input id="f-config" placeholder="config key=value" value="${esc(f.config)}">
      <button id="f-go">Filter</button>
      <input id="f-metric" list="metric-names" placeholder="add a metric column"><datalist id="metric-names"></datalist>
      <button id="compare" title="select runs with the boxes on the left">Compare selected</button>
      <span id="count" class="muted"></span>
    </div><div id="runs">loading…</div>`;
  const hashOf = over => {
    const q = new URLSearchParams({name: val("f-name"), tag: val("f-tag"), status: val("f-status"), config: val("f-config")});
    q.set("metrics", (over.columns || view.columns).join(","));
    if (view.sort) { q.set("sort", view.sort); if (view.desc) q.set("desc", "1"); }
    return "#/?" + q.toString();
  };
  const go = () => { location.hash = hashOf({}); };
  view.setColumns = columns => { location.hash = hashOf({columns}); };
  document.getElementById("f-go").onclick = go;
  for (const id of ["f-name", "f-tag", "f-config"]) document.getElementById(id).onkeydown = e => { if (e.key === "Enter") go(); };
  document.getElementById("f-status").onchange = go;
  const addMetric = () => {
    const m = val("f-metric");
    if (m && view.metrics.some(x => x.name === m) && !view.columns.includes(m)) view.setColumns([...view.columns, m]);
  };
  document.getElementById("f-metric").onchange = addMetric;
  document.getElementById("f-metric").onkeydown = e => { if (e.key === "Enter") addMetric(); };
  document.getElementById("compare").onclick = () => {
    const picked = [...view.picked].slice(0, 20);
    if (picked.length) location.hash = "#/compare/" + picked.map(encodeURIComponent).join(",");
  };
  const load = async () => {
    const q = new URLSearchParams(f);
    if (params.metrics !== undefined) q.set("metrics", params.metrics);
    const data = await api("/api/runs?" + q.toString());
    Object.assign(view, {rows: data.runs, columns: data.columns, metrics: data.metrics});
    document.getElementById("metric-names").innerHTML = data.metrics.map(m => `<option value="${esc(m.name)}">${m.runs} runs</option>`).join("");
    const drawn = document.querySelector("#runs tbody") && view.drawn === data.columns.join("\n"); // (a live reload: the rows only)
    view.drawn = data.columns.join("\n");
    renderRuns(data.runs, window.rlRunsPage || 0, drawn);
  };
  await load();
  let pending = null;
  follow(() => "/api/live", {stored: () => { if (!pending) pending = setTimeout(() => { pending = null; load(); }, 1000); }});
}
function val(id) { return document.getElementById(id).value.trim(); }
const PAGE_ROWS = 100; // rows of the runs list drawn at a time (a page; its health counts come in one request)
const RUN_COLUMNS = ["run", "state", "group", "job type", "tags", "attempts", "duration", "last step", "age", "health", "alerts", "project"];
function runValue(r, c) { // what a column of the runs list sorts and filters by (a metric's column: "m:NAME")
  if (c.startsWith("m:")) return r.last ? r.last[c.slice(2)] : null;
  switch (c) {
    case "run": return r.name || r.run_id;
    case "state": return r.status;
    case "group": return r.group;
    case "job type": return r.job_type;
    case "tags": return (r.tags || []).join(" ");
    case "attempts": return r.attempts;
    case "duration": return r.duration_s;
    case "last step": return r.last_step;
    case "age": return r.age_s;
    case "alerts": return (r.alerts_fail || 0) * 1e6 + (r.alerts_warn || 0);
    case "project": return r.project;
  }
  return null;
}
function passes(r, c, text) { // a column's filter: ">0.5", "<=3", "=2" on numbers, else a part of the text (the run's: name or id)
  const m = text.match(/^(>=|<=|>|<|=)\s*(-?[0-9.]+(?:e[-+]?[0-9]+)?)$/i);
  const v = runValue(r, c);
  if (m) {
    if (typeof v !== "number") return false;
    const x = parseFloat(m[2]);
    return {">=": v >= x, "<=": v <= x, ">": v > x, "<": v < x, "=": v === x}[m[1]];
  }
  const t = text.toLowerCase();
  return String(v ?? "").toLowerCase().includes(t) || (c === "run" && r.run_id.toLowerCase().includes(t));
}
function duration(s) { return s === null || s === undefined ? "" : age(s); }
function renderRuns(runs, page, bodyOnly) { // (bodyOnly: a column filter typed into: its box stays as it is)
  const view = window.rlRunsView;
  const cols = [...RUN_COLUMNS.slice(0, 8), ...view.columns.map(m => "m:" + m), ...RUN_COLUMNS.slice(8)];
  let rows = runs.filter(r => Object.entries(view.filters).every(([c, t]) => !t || passes(r, c, t)));
  if (view.sort) {
    const dir = view.desc ? -1 : 1;
    rows = rows.slice().sort((a, b) => { // (no value last, either way)
      const x = runValue(a, view.sort), y = runValue(b, view.sort);
      if (x === null || x === undefined || x === "") return y === null || y === undefined || y === "" ? 0 : 1;
      if (y === null || y === undefined || y === "") return -1;
      return (typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y))) * dir;
    });
  }
  const pages = Math.max(1, Math.ceil(rows.length / PAGE_ROWS));
  page = Math.min(Math.max(0, page || 0), pages - 1);
  const shown = rows.slice(page * PAGE_ROWS, (page + 1) * PAGE_ROWS);
  const n = rows.length < runs.length ? `${rows.length} of ${runs.length} runs` : `${runs.length} runs`;
  document.getElementById("count").textContent = rows.length > PAGE_ROWS ? `${n} · ${page * PAGE_ROWS + 1}–${page * PAGE_ROWS + shown.length}` : n;
  const pager = pages > 1 ? `<div class="pager"><button id="p-prev" ${page ? "" : "disabled"}>‹ newer</button>
    page ${page + 1} of ${pages} <button id="p-next" ${page < pages - 1 ? "" : "disabled"}>older ›</button></div>` : "";
  const label = c => c.startsWith("m:") ? c.slice(2) : c;
  const head = `<th><input type="checkbox" id="pick-all" title="select the runs shown"></th>` + cols.map(c => c === "health" ? `<th>health</th>` :
    `<th class="sortable${view.sort === c ? (view.desc ? " desc" : " asc") : ""}" data-col="${esc(c)}" title="sort by ${esc(label(c))}">${esc(label(c))}` +
    (c.startsWith("m:") ? ` <span class="drop" data-col="${esc(c)}" title="remove this column">×</span>` : "") + `</th>`).join("");
  const filters = `<th></th>` + cols.map(c => c === "health" ? "<th></th>" :
    `<th><input class="col-filter" data-col="${esc(c)}" placeholder="${c.startsWith("m:") || ["attempts", "duration", "last step", "age"].includes(c) ? "&gt;0, &lt;5…" : "filter"}" value="${esc(view.filters[c] || "")}"></th>`).join("");
  const cell = (r, c) => {
    if (c.startsWith("m:")) return esc(fmt(runValue(r, c)));
    switch (c) {
      case "run": return `<a class="run-link" href="#/run/${encodeURIComponent(r.run_id)}" title="${esc(r.run_id)}">${esc(r.name || r.run_id)}</a>` +
        (r.name && r.name !== r.run_id ? `<div class="run-id muted">${esc(r.run_id)}</div>` : "");
      case "state": return `<span class="s-${esc(r.status)}">${esc(r.status)}</span>`;
      case "group": return esc(r.group);
      case "job type": return esc(r.job_type);
      case "tags": return (r.tags || []).map(t => `<span class="tag">${esc(t)}</span>`).join("");
      case "attempts": return esc(r.attempts);
      case "duration": return esc(duration(r.duration_s));
      case "last step": return esc(fmt(r.last_step));
      case "age": return esc(age(r.age_s));
      case "health": return `<span class="health muted" data-run="${esc(r.run_id)}">…</span>`;
      case "alerts": return (r.alerts_fail ? `<span class="s-fail">${r.alerts_fail} fail</span> ` : "") + (r.alerts_warn ? `<span class="s-warn">${r.alerts_warn} warn</span>` : "");
      case "project": return esc(r.project);
    }
    return "";
  };
  const body = shown.map(r => `<tr data-run="${esc(r.run_id)}"><td><input type="checkbox" class="pick" value="${esc(r.run_id)}" ${view.picked.has(r.run_id) ? "checked" : ""}></td>` +
    cols.map(c => `<td>${cell(r, c)}</td>`).join("") + "</tr>").join("");
  const $runs = document.getElementById("runs");
  if (bodyOnly && $runs.querySelector("tbody")) {
    $runs.querySelector("tbody").innerHTML = body;
    document.getElementById("runs-pager").innerHTML = pager;
  } else {
    $runs.innerHTML = `<div id="runs-pager">${pager}</div><table class="runs"><thead><tr>${head}</tr><tr class="col-filters">${filters}</tr></thead><tbody>${body}</tbody></table>`;
    for (const th of $runs.querySelectorAll("th.sortable")) th.onclick = e => {
      if (e.target.classList.contains("drop")) { view.setColumns(view.columns.filter(m => "m:" + m !== e.target.dataset.col)); return; }
      const c = th.dataset.col;
      view.desc = view.sort === c ? !view.desc : false;
      view.sort = c;
      renderRuns(runs, 0);
    };
    for (const input of $runs.querySelectorAll("input.col-filter")) {
      input.oninput = () => { view.filters[input.dataset.col] = input.value.trim(); clearTimeout(view.typing); view.typing = setTimeout(() => renderRuns(runs, 0, true), 200); };
    }
  }
  const picks = [...$runs.querySelectorAll("input.pick")];
  const showPicked = () => {
    const button = document.getElementById("compare");
    button.textContent = view.picked.size ? `Compare selected (${view.picked.size})` : "Compare selected";
    button.classList.toggle("prominent", view.picked.size >= 2);
  };
  for (const box of picks) box.onchange = () => { box.checked ? view.picked.add(box.value) : view.picked.delete(box.value); showPicked(); };
  document.getElementById("pick-all").checked = false;
  document.getElementById("pick-all").onchange = e => { for (const box of picks) { box.checked = e.target.checked; box.onchange(); } };
  showPicked();
  if (pages > 1) {
    document.getElementById("p-prev").onclick = () => renderRuns(runs, page - 1, true);
    document.getElementById("p-next").onclick = () => renderRuns(runs, page + 1, true);
  }
  window.rlRunsPage = page;
  fillHealth([...document.querySelectorAll(".health")]);
}
async function fillHealth(cells) {
  // the health checklist's counts of every row shown, in one request (the server runs the checks of the
  // runs it has not counted yet in one pass, and keeps each until the run's files change)
  if (!cells.length) return;
  try {
    const res = await api("/api/health?runs=" + cells.map(c => encodeURIComponent(c.dataset.run)).join(","));
    for (const cell of cells) {
      const n = res.health[cell.dataset.run];
      if (!n) { cell.textContent = "?"; cell.title = "no events"; continue; }
      cell.classList.remove("muted");
      cell.innerHTML = `<a href="#/run/${encodeURIComponent(cell.dataset.run)}"><span class="s-ok">${n.ok} ok</span> ` +
        `<span class="s-warn">${n.warn} warn</span> <span class="s-fail">${n.fail} fail</span></a>`;
    }
  } catch (e) { for (const cell of cells) { cell.textContent = "?"; cell.title = e.message; } }
}

// ------------------------------------------------------------------------------------- one run
const SPECIAL = {loss: ["loss", "train/loss"], mfu: ["mfu", "train/mfu", "throughput/mfu"], lr: ["lr", "learning_rate", "train/lr", "optim/learning_rate"]};
const X_AXES = {step: "step", tokens: "tokens", time: "wall time", rel: "relative time"}; // the page's x choice (W&B's)
function pxOf(chart) { return Math.max(200, Math.round((chart.el.clientWidth || 520) - 60)); }
// The section a run page's chart goes in (W&B's): its metric name's prefix, the part before the first "/";
// a name without one in "Charts"; the MoE panels (drops per layer, router entropy, capacity) in "MoE"; the
// typed evals in "eval"; the system samples in "System"
function sectionOf(source, key) {
  if (source === "system") return "System";
  if (source === "drops" || /(^|\/)(router_entropy|lb_loss|z_loss|[^/]*capacity[^/]*)$/.test(key)) return "MoE";
  if (source === "eval") return "eval";
  const i = key.indexOf("/");
  return i > 0 ? key.slice(0, i) : "Charts";
}
function sectionRank(name) { return name === "Charts" ? 0 : name === "MoE" ? 2 : name === "System" ? 3 : 1; }
// W&B's default smoothing: a time-weighted exponential moving average, debiased. Each point's weight decays
// by the x distance from the one before, in units of the series' mean spacing (evenly spaced points: a plain
// EMA of `weight`; a gap counts as the points it skipped). weight 0..0.99; a missing value stays missing.
function twema(xs, ys, weight) {
  const out = new Array(ys.length).fill(null);
  if (xs.length < 2 || !(weight > 0)) return ys.slice();
  const span = xs[xs.length - 1] - xs[0], unit = span > 0 ? span / (xs.length - 1) : 1;
  let acc = 0, norm = 0, prev = xs[0];
  for (let i = 0; i < ys.length; i++) {
    if (ys[i] === null || !isFinite(ys[i])) continue;
    const w = Math.pow(weight, Math.max(0, xs[i] - prev) / unit);
    acc = acc * w + ys[i]; norm = norm * w + 1; prev = xs[i];
    out[i] = acc / norm;
  }
  return out;
}
// A chart of the run page: drawn once it comes into view (a run of hundreds of metrics draws what is looked at),
// with the page's smoothing drawn on top of its points and the raw lines kept faint. The smoothed lines are
// drawn only, never kept in `tables`: the chart's points stay the exact data.
class RunChart extends Chart {
  constructor(parent, title, opts) {
    super(parent, title, opts);
    this.shown = false;
    this.smoothing = 0;
  }
  layered(fn) {
    if (this.layering || !(this.smoothing > 0) || !this.tables.size) return fn(); // (an update that draws anew: layered once)
    const raw = this.tables, colors = this.opts.colors, base = colors || COLORS, names = [...raw.keys()];
    const both = new Map(raw);
    for (const n of names) { const [xs, ys] = raw.get(n); both.set(`${n} (smoothed)`, [xs, twema(xs, ys, this.smoothing)]); }
    this.opts.colors = [...names.map((n, i) => base[i % base.length] + "44"), ...names.map((n, i) => base[i % base.length])];
    this.tables = both;
    this.layering = true;
    try { return fn(); } finally { this.layering = false; this.tables = raw; this.opts.colors = colors; this.el.dataset.points = String(this.points()); }
  }
  draw() { if (this.shown) this.layered(() => super.draw()); else this.el.dataset.points = String(this.points()); }
  update() { if (this.shown) this.layered(() => super.update()); else this.el.dataset.points = String(this.points()); }
}
let runObserver = null; // draws a run page's charts as they come into view
// The MoE capacity factors the run's applied set_capacity_factor decisions set ({cf_send, cf_recv}: [steps, values],
// each from its value before the first), or null where none was applied
function capacityFactors(decisions) {
  const applied = decisions.filter(d => d.action === "set_capacity_factor" && d.status === "applied" && d.applied_at_step !== null)
    .sort((a, b) => a.applied_at_step - b.applied_at_step);
  if (!applied.length) return null;
  const out = {};
  for (const side of ["cf_send", "cf_recv"]) {
    const xs = [], ys = [];
    const before = (applied[0].before || {})[side];
    if (typeof before === "number" && applied[0].decided_at_step !== null && applied[0].decided_at_step < applied[0].applied_at_step) { xs.push(applied[0].decided_at_step); ys.push(before); }
    for (const d of applied) {
      const v = [(d.after || {})[side], (d.params || {})[side], (d.params || {}).cf].find(v => typeof v === "number");
      if (v !== undefined && (!xs.length || d.applied_at_step > xs[xs.length - 1])) { xs.push(d.applied_at_step); ys.push(v); }
    }
    if (xs.length) out[side] = [xs, ys];
  }
  return Object.keys(out).length ? out : null;
}

// The run page's config panel: the config with every config.update applied; a key set or changed during the
// run says at which step, and its value before.
async function loadConfig(run) {
  const el = document.getElementById("config");
  try {
    const res = await api(`/api/run/${encodeURIComponent(run)}/config`);
    const changed = {};
    for (const c of res.changes) (changed[c.key] = changed[c.key] || []).push(c);
    const keys = Object.keys(res.config);
    const n = Object.keys(changed).length;
    el.innerHTML = `<summary>config (${keys.length} keys${n ? `, ${n} set during the run` : ""})</summary>` +
      table(["key", "value", "set during the run"], keys, (k, c) => c === "key" ? esc(k) : c === "value" ? `<pre>${esc(JSON.stringify(res.config[k]))}</pre>`
        : (changed[k] || []).map(x => `<span class="changed">at step ${esc(x.step ?? "?")}${x.new ? "" : `: was ${esc(JSON.stringify(x.before))}`} → ${esc(JSON.stringify(x.after))}</span>`).join("<br>"));
  } catch (e) { el.insertAdjacentHTML("beforeend", `<p class="err">${esc(e.message)}</p>`); }
}

async function viewRun(run) {
  if (runObserver) runObserver.disconnect();
  $main.innerHTML = `<h1>Run ${esc(run)}</h1><div id="info" class="muted">loading…</div>
    <h2>Charts</h2><div class="filters run-controls">
      <input id="metric-filter" type="search" placeholder="search metrics (substring or regex)" size="34">
      <label>x <select id="x-axis">${Object.entries(X_AXES).map(([v, t]) => `<option value="${v}">${t}</option>`).join("")}</select></label>
      <label>smoothing <input id="smoothing" type="range" min="0" max="0.99" step="0.01" value="0"></label> <span id="smoothing-value">0</span>
      <span id="chart-count" class="muted"></span></div>
    <div id="charts"></div>
    <h2 id="values-h" hidden>Histograms, tables and images</h2><div id="values"></div>
    <div id="console-box" hidden><h2>Console</h2><div class="filters"><input id="console-filter" type="search" placeholder="search the console" size="34">
      <span id="console-count" class="muted"></span></div><pre id="console" class="console"></pre></div>
    <h2>Decision trail</h2><div id="decisions"></div>
    <h2>Open alerts</h2><div id="alerts"></div>
    <h2>Health checklist</h2><div id="health" class="muted">running the checks…</div>
    <h2>Provenance</h2><div id="provenance" class="muted">…</div>
    <h2>Attempts</h2><div id="attempts"></div>
    <h2>Transparency log</h2><div id="tlog"><p class="muted">Every stored event is a leaf of the ledger's signed log
    (<a href="/tlog/checkpoint">checkpoint</a>). An event's inclusion proof (C2SP tlog-proof):</p>
    <input id="tlog-event" placeholder="event id" size="40"> <button id="tlog-prove">Prove</button><pre id="tlog-proof"></pre></div>`;
  document.getElementById("tlog-prove").onclick = async () => {
    const out = document.getElementById("tlog-proof"), id = document.getElementById("tlog-event").value.trim();
    if (!id) { out.textContent = "an event id, please"; return; }
    try {
      const r = await fetch(`/api/tlog/proof/${encodeURIComponent(id)}`, {headers: headers(), credentials: "omit", cache: "no-store"});
      out.textContent = await r.text();
    } catch (e) { out.textContent = e.message; }
  };
  const t0 = performance.now();
  const info = await api(`/api/run/${encodeURIComponent(run)}`);
  const tInfo = performance.now();
  const first = info.attempts[0] || {};
  document.getElementById("info").innerHTML = `${info.attempts.length} attempt(s) · project ${esc(first.project || "–")} · preset ${esc(first.preset || "–")} · ` +
    (JSON.parse(first.tags || "[]")).map(t => `<span class="tag">${esc(t)}</span>`).join("") +
    (info.fork ? ` · fork of <a id="fork-parent" href="#/run/${encodeURIComponent(info.fork.parent)}">${esc(info.fork.parent)}</a> at step ${esc(info.fork.step)}` : "") +
    ` <details id="config"><summary>config</summary><pre>${esc(JSON.stringify(JSON.parse(first.config || "{}"), null, 1))}</pre></details>`;
  loadConfig(run); // (the config with every config.update applied, and the step each key changed at)
  document.getElementById("attempts").innerHTML = table(["attempt", "producer", "time", "step", "resumed_from", "parent", "rewind", "code_commit"], info.attempts);
  renderDecisions(run, info.decisions);
  renderAlerts(run, info.alerts || []);
  if ((info.kinds || []).some(k => k === "histogram" || k === "table" || k === "media")) loadValues(run);
  if ((info.kinds || []).includes("console")) loadConsole(run);
  window.rlCharts = [];
  // what to chart: every key the run has, its title, section and x axis; the panels of the trainer's data
  // (the loss against the forecast band, LR with decisions marked, MFU, drops per layer) only where it has that data
  const keysOf = src => info.keys[src] || [];
  const specialKey = what => { for (const src of ["step", "metrics"]) { const k = SPECIAL[what].find(n => keysOf(src).includes(n)); if (k) return `${src}\n${k}`; } return null; };
  const marks = info.decisions.filter(d => d.review !== "rejected").map(d => [d.applied_at_step ?? d.decided_at_step, `${d.action.replace("set_", "")}${d.status === "applied" ? "" : " (" + d.review + ")"}`]).filter(m => m[0] !== null);
  const band = info.forecast.length ? [info.forecast.map(f => f.step), info.forecast.map(f => f.band_low), info.forecast.map(f => f.band_high)] : null;
  const titled = {};
  const loss = specialKey("loss"), mfu = specialKey("mfu"), lr = specialKey("lr");
  // the band's nominal level, as the forecast events state it (issue 45): "95% band"; none stated says so
  const levels = [...new Set(info.forecast.map(f => f.band_level == null ? null : Math.round(100 * f.band_level)))];
  const bandName = levels.filter(v => v !== null).length ? levels.filter(v => v !== null).map(v => `${v}%`).join("/") + " band" + (levels.includes(null) ? ", some points of no stated level" : "") : "band of no stated level";
  if (band && loss) titled[loss] = ["Loss vs forecast band", {band, bandName}];
  if (mfu) titled[mfu] = ["MFU", {}];
  if (lr && marks.length) titled[lr] = ["Learning rate, decisions marked", {markers: marks}];
  const stepKeys = new Set(keysOf("step"));
  const specs = [];
  if (band && !loss) specs.push({source: null, keys: [], title: "Loss vs forecast band", band, bandName, section: "Charts"});
  for (const src of ["step", "metrics", "eval", "system"]) {
    for (const k of keysOf(src)) {
      const plain = src === "step" ? k : src === "metrics" ? (stepKeys.has(k) ? `${k} (metrics)` : k) : `${src}: ${k}`;
      const [title, marked] = titled[`${src}\n${k}`] || [plain, {}];
      specs.push({source: src, keys: [k], title, ...marked, section: sectionOf(src, k), axis: src === "metrics" ? (info.step_metrics || {})[k] : null});
    }
  }
  if ((info.kinds || []).includes("drops")) specs.push({source: "drops", keys: ["drop_fraction"], title: "Token drop fraction per layer", section: "MoE"});
  const cf = capacityFactors(info.decisions);
  if (cf) specs.push({source: null, keys: ["capacity factor"], title: "Capacity factor, as decisions set it", section: "MoE", steps: cf});
  // the sections, each collapsible with its name and chart count: the user's metrics first ("Charts", then by
  // prefix), then the MoE panels and the system samples
  const holder = document.getElementById("charts");
  const sections = new Map();
  for (const name of [...new Set(specs.map(s => s.section))].sort((a, b) => sectionRank(a) - sectionRank(b) || a.localeCompare(b))) {
    const el = document.createElement("details");
    el.className = "section"; el.open = true; el.dataset.section = name;
    el.innerHTML = `<summary><b>${esc(name)}</b> <span class="count muted"></span></summary><div class="grid"></div>`;
    holder.appendChild(el);
    sections.set(name, {el, grid: el.querySelector(".grid"), count: el.querySelector(".count"), charts: []});
  }
  let xMode = "step";
  const xqOf = c => c.source === "system" ? (xMode === "step" || xMode === "tokens" ? "step" : xMode)
    : xMode === "step" ? (c.axis ? `metric:${c.axis}` : "step") : xMode;
  const xLabel = c => c.xq.startsWith("metric:") ? c.xq.slice(7) : c.xq === "rel" ? "seconds since start" : c.xq === "step" && c.source === "system" ? "time" : X_AXES[c.xq];
  const charts = []; // {chart, source, keys, axis, xq}
  for (const s of specs) {
    const sec = sections.get(s.section);
    const c = {chart: new RunChart(sec.grid, s.title), source: s.source, keys: s.keys, axis: s.axis || null, section: s.section, xq: "step",
               band: s.band || null, markers: s.markers || null, steps: s.steps || null};
    c.chart.el.dataset.keys = s.keys.join("\n");
    if (s.bandName) c.chart.bandName = s.bandName;
    sec.charts.push(c);
    charts.push(c);
  }
  const nameOf = (src, grp) => {
    if (src !== "drops") return `attempt ${grp}`;
    const [a, layer] = grp.split(":");
    return `${layer === "-1" ? "all layers" : "layer " + layer} · attempt ${a}`;
  };
  // one request per source and x axis (all its keys in one SQL pass), then per chart when zoomed
  let since = Infinity;
  const tps = Math.max(0, ...info.attempts.map(a => a.tokens_per_step || 0)); // (the server's tokens: step × this)
  let asked = 0; // (an answer to an earlier choice of x that comes after a later one's is dropped)
  const load = async () => {
    const mine = ++asked, groups = {};
    for (const c of charts) {
      c.xq = c.source ? xqOf(c) : xMode;
      const scale = c.xq === "step" ? 1 : c.xq === "tokens" ? tps : 0; // the band and decision marks are at steps
      c.chart.band = c.band && scale ? [c.band[0].map(x => x * scale), c.band[1], c.band[2]] : null;
      c.chart.markers = c.markers && scale ? c.markers.map(([x, label]) => [x * scale, label]) : [];
      if (info.fork && c.xq === "step") c.chart.markers.push([info.fork.step, `fork of ${info.fork.parent}`]);
      if (c.steps) { c.chart.tables.clear(); if (scale) for (const [n, [xs, ys]] of Object.entries(c.steps)) c.chart.set(n, xs.map(x => x * scale), ys); }
      if (!c.source) continue;
      (groups[`${c.source}|${c.xq}`] = groups[`${c.source}|${c.xq}`] || []).push(c);
    }
    await Promise.all(Object.values(groups).map(async cs => {
      const {source, xq} = cs[0];
      const keys = [...new Set(cs.flatMap(c => c.keys))];
      const got = {};
      for (let i = 0; i < keys.length; i += 256) { // (the server's bound on keys a request asks for)
        const q = new URLSearchParams({source, keys: keys.slice(i, i + 256).join(","), px: pxOf(cs[0].chart)});
        if (xq !== "step") q.set("x", xq);
        const data = await api(`/api/run/${encodeURIComponent(run)}/series?` + q.toString());
        if (mine === 1) since = Math.min(since, data.seq); // (the live feed's start: the first answers' position)
        Object.assign(got, data.keys);
      }
      // a fork: its parent's points of the same keys beside its own (the fork's history is the parent's up to the fork step)
      const parentOf = info.fork && xq === "step" && (source === "step" || source === "metrics") ?
        (await api(`/api/run/${encodeURIComponent(info.fork.parent)}/series?` + new URLSearchParams({source, keys: keys.slice(0, 256).join(","), px: pxOf(cs[0].chart)}).toString()).catch(() => ({keys: {}}))).keys : {};
      if (mine !== asked) return;
      for (const c of cs) {
        c.chart.tables.clear();
        for (const k of c.keys) for (const [grp, [xs, ys]] of Object.entries(parentOf[k] || {})) c.chart.set(`parent ${info.fork.parent} · attempt ${grp}`, xs, ys);
        for (const k of c.keys) for (const [grp, [xs, ys]] of Object.entries(got[k] || {})) c.chart.set(nameOf(source, grp), xs, ys);
        c.chart.opts.time = xq === "time" || (source === "system" && xq === "step");
        c.chart.opts.xLabel = xLabel(c);
        c.chart.zoomed = false;
        c.chart.el.dataset.x = xq;
        c.chart.onZoom = zoomer(run, c, nameOf);
      }
    }));
  };
  await load();
  const tSeries = performance.now();
  // drawn now: the charts in view; the others as they come into view (scrolled to, a section opened, a search)
  runObserver = new IntersectionObserver(entries => {
    for (const e of entries) {
      const c = e.isIntersecting && charts.find(c => c.chart.el === e.target);
      if (c && !c.chart.shown) { c.chart.shown = true; c.chart.draw(); }
    }
  }, {rootMargin: "400px"});
  for (const c of charts) {
    if (c.chart.el.getBoundingClientRect().top < innerHeight + 400) { c.chart.shown = true; c.chart.draw(); }
    runObserver.observe(c.chart.el);
  }
  window.rlParts = {info_ms: tInfo - t0, series_ms: tSeries - tInfo, draw_ms: performance.now() - tSeries};
  // the search over metric names (W&B's filter: a regular expression, else the text as it is; case ignored)
  const filter = () => {
    const q = val("metric-filter");
    let re = null;
    try { re = q ? new RegExp(q, "i") : null; } catch (e) { re = null; }
    const match = c => !q || [c.chart.title, ...c.keys].some(t => re ? re.test(t) : t.toLowerCase().includes(q.toLowerCase()));
    let shown = 0;
    for (const s of sections.values()) {
      let n = 0;
      for (const c of s.charts) { const ok = match(c); c.chart.el.hidden = !ok; n += ok ? 1 : 0; }
      s.el.hidden = !n;
      s.count.textContent = q ? `${n} of ${s.charts.length}` : String(s.charts.length);
      shown += n;
    }
    document.getElementById("chart-count").textContent = q ? `${shown} of ${charts.length} charts` : `${charts.length} charts`;
  };
  filter();
  document.getElementById("metric-filter").oninput = filter;
  const redraw = () => { for (const c of charts) if (c.chart.shown) c.chart.draw(); };
  const xSelect = document.getElementById("x-axis");
  if (!info.attempts.some(a => a.tokens_per_step)) { xSelect.querySelector("option[value=tokens]").disabled = true; xSelect.querySelector("option[value=tokens]").title = "the run declared no tokens_per_step"; }
  xSelect.onchange = async () => { xMode = xSelect.value; await load(); redraw(); };
  document.getElementById("smoothing").oninput = e => {
    const w = Math.min(0.99, Math.max(0, +e.target.value));
    document.getElementById("smoothing-value").textContent = String(w);
    for (const c of charts) c.chart.smoothing = w;
    redraw();
  };
  if (!isFinite(since)) since = 0; // no points yet: every point stored from now on is new
  let refetch = null; // the charts not drawn against the step take new points by asking again (once a second at most)
  follow(() => `/api/live?run=${encodeURIComponent(run)}&since=${since}`, {
    points: news => {
      since = Math.max(since, news.seq);
      if (news.reload) { route(); return; } // far behind: drawn again
      for (const c of charts) {
        if (!c.source) continue;
        const got = c.source === "drops" ? {drop_fraction: news.drops} : news[c.source];
        if (!got) continue;
        if (c.xq !== "step") {
          if (c.keys.some(k => got[k]) && !refetch) refetch = setTimeout(async () => { refetch = null; await load(); redraw(); }, 1000);
          continue;
        }
        let changed = false;
        for (const k of c.keys) for (const [grp, [xs, ys]] of Object.entries(got[k] || {})) { c.chart.append(nameOf(c.source, grp), xs, ys); changed = true; }
        if (changed) c.chart.update();
      }
      if ((news.kinds || []).some(k => k === "decision" || k === "decision_applied")) {
        api(`/api/run/${encodeURIComponent(run)}`).then(i => renderDecisions(run, i.decisions));
      }
    },
  });
  loadAudit(run, "health", "health");
  loadAudit(run, "provenance", "provenance");
  if (info.fork) { // a fork: the fork audit against its parent (queries/fork), after the provenance
    document.getElementById("provenance").insertAdjacentHTML("afterend", `<h2>Fork vs parent ${esc(info.fork.parent)}</h2><div id="fork-audit" class="muted">…</div>`);
    loadAudit(run, "fork", "fork-audit");
  }
}
function zoomer(run, c, nameOf) { // a zoomed range's exact points (Chart.scaled asks only for a range not drawn yet)
  let timer = null, asked = 0;
  return (lo, hi) => {
    clearTimeout(timer);
    timer = setTimeout(async () => {
      const me = ++asked;
      const stepped = !c.xq || c.xq === "step"; // (steps are whole: the range rounded out to them)
      const q = new URLSearchParams({source: c.source, keys: c.keys.join(","), px: pxOf(c.chart),
        x0: stepped ? Math.floor(lo) : lo, x1: stepped ? Math.ceil(hi) : hi});
      if (!stepped) q.set("x", c.xq); // (the run page's x axis)
      const data = await api(`/api/run/${encodeURIComponent(run)}/series?` + q.toString());
      if (me !== asked || !c.chart.zoomed) return; // zoomed again, or reset, meanwhile
      for (const name of c.chart.tables.keys()) c.chart.set(name, [], []); // a series with no point in the range: empty
      for (const k of c.keys) for (const [grp, [xs, ys]] of Object.entries(data.keys[k] || {})) c.chart.set(nameOf(c.source, grp), xs, ys);
      c.chart.update();
      c.chart.el.dataset.zoom = `${lo},${hi}`;
    }, 250);
  };
}
// the values a run logged beside numbers (ui/values.py): each histogram a heat map over steps (darker: more of
// its values in that band at that step), each table at a step with a search over its text, the newest images
async function loadValues(run) {
  const el = document.getElementById("values"), r = encodeURIComponent(run);
  let v;
  try { v = await api(`/api/run/${r}/values`); } catch (e) { el.innerHTML = `<p class="err">${esc(e.message)}</p>`; return; }
  if (!el.isConnected) return;
  document.getElementById("values-h").hidden = false;
  el.innerHTML = "";
  for (const h of v.histograms) {
    const box = document.createElement("div");
    box.className = "heat"; box.dataset.key = h.key;
    const last = h.steps[h.steps.length - 1];
    box.innerHTML = `<div><b>${esc(h.key)}</b> <span class="muted">${h.steps.length} steps (${esc(h.steps[0])} to ${esc(last)}), values ${esc(fmt(h.lo))} (bottom) to ${esc(fmt(h.hi))} (top)</span></div>`;
    const cv = document.createElement("canvas");
    cv.className = "heatmap"; cv.width = Math.max(1, h.steps.length); cv.height = h.rows;
    const ctx = cv.getContext("2d"), img = ctx.createImageData(cv.width, cv.height);
    h.cells.forEach((col, i) => {
      const most = Math.max(...col) || 1;
      col.forEach((c, j) => { const p = 4 * ((h.rows - 1 - j) * cv.width + i); img.data.set([31, 95, 191, Math.round(255 * c / most)], p); });
    });
    ctx.putImageData(img, 0, 0);
    box.appendChild(cv);
    el.appendChild(box);
  }
  if (v.histogram_keys.length > v.histograms.length) el.insertAdjacentHTML("beforeend", `<p class="muted">${v.histogram_keys.length - v.histograms.length} more histograms: SQL view histogram_buckets</p>`);
  for (const t of v.tables) {
    const box = document.createElement("div");
    box.className = "logged-table"; box.dataset.key = t.key;
    box.innerHTML = `<div><b>${esc(t.key)}</b> <label>step <select class="step"></select></label>
      <input class="search" type="search" placeholder="search its text" size="28"> <span class="count muted"></span></div><div class="rows"></div>`;
    el.appendChild(box);
    const pick = box.querySelector(".step"), search = box.querySelector(".search");
    const show = async () => {
      const step = pick.value ? `&step=${encodeURIComponent(pick.value)}` : "";
      try {
        const res = await api(`/api/run/${r}/table?key=${encodeURIComponent(t.key)}${step}&q=${encodeURIComponent(search.value)}`);
        if (!pick.options.length) pick.innerHTML = res.steps.map(s => `<option${s === res.step ? " selected" : ""}>${esc(s)}</option>`).join("");
        box.querySelector(".count").textContent = `${res.rows.length} of ${res.rows_logged} rows`;
        box.querySelector(".rows").innerHTML = table(["#", ...res.columns], res.rows.map(([i, cells]) => [i, ...cells]));
      } catch (e) { box.querySelector(".rows").innerHTML = `<p class="err">${esc(e.message)}</p>`; }
    };
    pick.onchange = show;
    let typing;
    search.oninput = () => { clearTimeout(typing); typing = setTimeout(show, 250); };
    show();
  }
  if (v.media.length) {
    const grid = document.createElement("div");
    grid.className = "media-grid";
    el.appendChild(grid);
    for (const m of v.media) {
      const fig = document.createElement("figure");
      fig.innerHTML = `<figcaption>step ${esc(m.step)} · ${esc(m.key)}${m.caption ? " · " + esc(m.caption) : ""}<br><span class="muted">${esc(m.type)}, ${esc(m.bytes)} bytes, sha256 ${esc(m.sha256.slice(0, 12))}…</span></figcaption>`;
      grid.appendChild(fig);
      if (!m.type.startsWith("image/")) continue;
      // (fetched with the token's header, which an <img src> cannot send)
      fetch(`/api/run/${r}/media/${m.sha256}`, {credentials: "omit", headers: headers()}).then(async res => {
        if (!res.ok) throw new Error(await res.text());
        const img = document.createElement("img");
        img.src = URL.createObjectURL(await res.blob()); img.alt = m.caption || m.key;
        fig.prepend(img);
      }).catch(e => fig.insertAdjacentHTML("beforeend", `<p class="err">${esc(e.message)}</p>`));
    }
  }
}
// the run's console (ui/values.py console_lines): its last lines, or those holding the search's text; stderr marked
async function loadConsole(run) {
  const box = document.getElementById("console-box"), pre = document.getElementById("console");
  const search = document.getElementById("console-filter");
  const show = async () => {
    try {
      const res = await api(`/api/run/${encodeURIComponent(run)}/console?q=${encodeURIComponent(search.value)}`);
      if (!pre.isConnected) return;
      box.hidden = false;
      document.getElementById("console-count").textContent = `${res.lines.length} of ${res.found} lines shown` +
        (res.dropped ? `, ${res.dropped} left out by the rate bound` : "");
      pre.innerHTML = res.lines.map(l => `<span class="${l.stream === "stderr" ? "stderr" : ""}">${esc(l.text)}</span>`).join("\n");
    } catch (e) { pre.textContent = e.message; }
  };
  let typing;
  search.oninput = () => { clearTimeout(typing); typing = setTimeout(show, 250); };
  show();
}
let shownDecisions = "";
function renderDecisions(run, decisions) {
  const el = document.getElementById("decisions");
  const text = JSON.stringify(decisions);
  if (text === shownDecisions && el.childElementCount) return; // unchanged: keep what a person is typing
  shownDecisions = text;
  if (!decisions.length) { el.innerHTML = `<p class="muted">No decisions.</p>`; return; }
  const me = localStorage.getItem("rl-name") || "";
  el.innerHTML = table(["decided at", "agent", "action", "params", "mode", "review", "applied", "rationale", "evidence"], decisions, (d, c) => {
    switch (c) {
      case "decided at": return `step ${esc(d.decided_at_step)}<br><span class="muted">${esc(d.decided_at)}</span>`;
      case "agent": return esc(d.agent);
      case "action": return `<b>${esc(d.action)}</b>`;
      case "params": return `<pre>${esc(JSON.stringify(d.params))}</pre>`;
      case "mode": return esc(d.mode);
      case "review":
        if (d.review === "proposed") return `<span class="s-proposed">proposed</span><div class="decide" data-id="${esc(d.decision_id)}">
          <input class="who" placeholder="your name" value="${esc(me)}"> <button class="approve">Approve</button> <button class="reject">Reject</button> <span class="msg"></span></div>`;
        return `<span class="s-${esc(d.review)}">${esc(d.review)}</span>${d.reviewed_by ? "<br>by " + esc(d.reviewed_by) : ""}`;
      case "applied": return `${esc(d.status)}${d.applied_at_step !== null ? " at step " + esc(d.applied_at_step) : ""}${d.refusal_reason ? "<br>" + esc(d.refusal_reason) : ""}`;
      case "rationale": return esc(d.rationale);
      case "evidence": return `<details><summary>evidence</summary><pre>${esc(JSON.stringify(d.evidence, null, 1))}</pre></details>`;
    }
  });
  for (const box of el.querySelectorAll(".decide")) {
    for (const action of ["approve", "reject"]) {
      box.querySelector("." + action).onclick = async () => {
        const by = box.querySelector(".who").value.trim();
        const msg = box.querySelector(".msg");
        if (!by) { msg.textContent = "your name, please"; return; }
        localStorage.setItem("rl-name", by);
        try {
          const r = await api("/api/decide", {method: "POST", headers: {"content-type": "application/json"},
            body: JSON.stringify({run, decision_id: box.dataset.id, action, by})});
          msg.textContent = r.acknowledged ? `${action}d: recorded as ${r.decision_id}` : r.note;
          msg.className = "msg s-ok";
        } catch (e) { msg.textContent = e.message; msg.className = "msg err"; }
      };
    }
  }
}
// The run's open alerts, each with who acknowledged it; Acknowledge records an alert_ack (POST /api/ack, the
// read-write token): `runledger notify` stops repeating its page once it reads it.
function renderAlerts(run, alerts) {
  const el = document.getElementById("alerts");
  if (!alerts.length) { el.innerHTML = `<p class="muted">No open alerts.</p>`; return; }
  const me = localStorage.getItem("rl-name") || "";
  el.innerHTML = table(["raised at", "severity", "alert", "agent", "message", "acknowledged"], alerts, (a, c) => {
    switch (c) {
      case "raised at": return `step ${esc(a.step)}<br><span class="muted">${esc(a.raised_at)}</span>`;
      case "severity": return `<span class="s-${esc(a.severity)}">${esc(a.severity)}</span>`;
      case "alert": return `<b>${esc(a.rule)}</b><br><span class="muted">${esc(a.alert_id)}</span>`;
      case "agent": return esc(a.agent);
      case "message": return esc(a.message);
      case "acknowledged":
        return (a.acked_by ? `by ${esc(a.acked_by)}<br><span class="muted">${esc(a.acked_at)}</span>` : "") +
          `<div class="ack" data-id="${esc(a.alert_id)}"><input class="who" placeholder="your name" value="${esc(me)}"> ` +
          `<button class="acknowledge">Acknowledge</button> <span class="msg"></span></div>`;
    }
  });
  for (const box of el.querySelectorAll(".ack")) {
    box.querySelector(".acknowledge").onclick = async () => {
      const by = box.querySelector(".who").value.trim();
      const msg = box.querySelector(".msg");
      if (!by) { msg.textContent = "your name, please"; return; }
      localStorage.setItem("rl-name", by);
      try {
        const r = await api("/api/ack", {method: "POST", headers: {"content-type": "application/json"},
          body: JSON.stringify({run, alert_id: box.dataset.id, by})});
        msg.textContent = r.acknowledged ? "acknowledged: recorded" : r.note;
        msg.className = "msg s-ok";
      } catch (e) { msg.textContent = e.message; msg.className = "msg err"; }
    };
  }
}
async function loadAudit(run, suite, id) {
  const el = document.getElementById(id);
  if (!el) return;
  try {
    const res = await api(`/api/run/${encodeURIComponent(run)}/audit/${suite}`);
    if (!el.isConnected) return; // (another view meanwhile)
    (window.rlPanels = window.rlPanels || {})[suite] = performance.now(); // (bench/ui.py reads it)
    if (res.stale) setTimeout(() => loadAudit(run, suite, id), 2000); // new files being audited: asked again
    if (suite === "health") { // only the checks that apply to the run (their inputs logged: ui/health.py)
      const rows = res.results.flatMap(r => r.rows), left = res.not_applicable || [];
      el.className = "";
      const inputs = [...new Set(left.flatMap(l => l.missing))].map(esc).join(", ");
      el.innerHTML = !rows.length ? `<p class="muted" id="health-none">No health check applies to this run: it logged none of their inputs (${inputs}).</p>`
        : table(["check", "status", "value", "threshold", "at_step", "evidence"], rows, (r, c, j) => {
          const v = r[j + 1];
          return c === "status" ? `<span class="s-${esc(v)}">${esc(v)}</span>` : esc(fmt(v));
        }) + (left.length ? `<p class="muted" id="health-left">Not listed: ${left.length} checks whose inputs this run did not log ` +
          `(${left.map(l => `${esc(l.check)}: ${l.missing.map(esc).join(", ")}`).join("; ")}).</p>` : "");
    } else {
      el.className = "";
      el.innerHTML = res.results.map(r => `<details ${r.rows.length ? "open" : ""}><summary>${esc(r.name)} (${r.rows.length} rows)</summary>${table(r.columns, r.rows.slice(0, 200))}</details>`).join("");
    }
    if (res.stale) el.insertAdjacentHTML("afterbegin", `<p class="muted stale">as of ${esc(new Date(res.computed_at * 1000).toLocaleTimeString())}: the newest steps are being checked…</p>`);
  } catch (e) { el.innerHTML = `<span class="err">${esc(e.message)}</span>`; }
}

// ------------------------------------------------------------------------------------- compare
async function viewCompare(runs, params) {
  const q = new URLSearchParams({runs: runs.join(","), px: 1000});
  const asked = params.keys || params.key; // (none: the server opens on the first section the runs share)
  if (asked) { q.set("keys", asked); q.set("source", params.source || "step"); }
  const grouped = params.group === "1";
  $main.innerHTML = `<h1>Compare ${runs.length} runs</h1>
    <div class="filters"><input id="c-search" placeholder="search metrics"> <select id="c-pick"></select>
    <label><input type="checkbox" id="c-group" ${grouped ? "checked" : ""}> group by group (mean, min–max band)</label>
    <span id="c-count" class="muted"></span></div>
    <div class="grid" id="charts"></div><h2>Config: the keys that differ</h2><div id="diff"></div>`;
  const data = await api("/api/compare?" + q.toString());
  const nameOf = r => (data.labels[r] && data.labels[r].name) || r;
  const address = over => {
    const o = Object.assign({source: data.source, keys: data.keys.join(","), group: grouped ? "1" : ""}, over);
    const p = new URLSearchParams({source: o.source, keys: o.keys});
    if (o.group) p.set("group", "1");
    return `#/compare/${runs.map(encodeURIComponent).join(",")}?` + p.toString();
  };
  // the picker: every metric the runs logged, by source; the search box narrows it
  const pick = document.getElementById("c-pick");
  const fill = text => {
    const t = text.toLowerCase();
    const bySource = {};
    for (const m of data.metrics) if (!t || m.key.toLowerCase().includes(t)) (bySource[m.source] = bySource[m.source] || []).push(m);
    const shownKey = data.keys.length === 1 ? `${data.source}\t${data.keys[0]}` : "";
    pick.innerHTML = `<option value="">${data.keys.length > 1 ? `${esc(data.keys.length)} metrics: ${esc(data.keys.join(", "))}` : "pick a metric…"}</option>` +
      Object.entries(bySource).map(([s, ms]) => `<optgroup label="${esc(s)}">` + ms.map(m =>
        `<option value="${esc(s + "\t" + m.key)}" ${s + "\t" + m.key === shownKey ? "selected" : ""}>${esc(m.key)}${m.runs < runs.length ? ` (${m.runs} of ${runs.length} runs)` : ""}</option>`).join("") + `</optgroup>`).join("");
    document.getElementById("c-count").textContent = `${data.metrics.length} metrics logged`;
  };
  fill("");
  document.getElementById("c-search").oninput = e => fill(e.target.value.trim());
  pick.onchange = () => {
    if (!pick.value) return;
    const [s, k] = pick.value.split("\t");
    location.hash = address({source: s, keys: k});
  };
  document.getElementById("c-group").onchange = e => { location.hash = address({group: e.target.checked ? "1" : ""}); };
  window.rlCharts = [];
  window.rlCompare = {source: data.source, keys: data.keys};
  const grid = document.getElementById("charts");
  if (!data.keys.length) grid.innerHTML = `<p class="muted">These runs logged no metric.</p>`;
  for (const key of data.keys) {
    const colors = [];
    const chart = new Chart(grid, key, {time: data.source === "system", xLabel: data.source === "system" ? "time" : "step", colors});
    const groups = {};
    data.runs.forEach((r, i) => {
      const g = grouped && data.labels[r] && data.labels[r].group;
      if (g) { (groups[g] = groups[g] || []).push(r); return; }
      for (const [a, [xs, ys]] of Object.entries(data.series[key][r] || {})) { chart.set(`${nameOf(r)} · attempt ${a}`, xs, ys); colors.push(COLORS[i % COLORS.length]); }
    });
    const bands = [];
    Object.entries(groups).forEach(([g, members], j) => {
      const [xs, mean, lo, hi] = groupStats(members.map(r => data.series[key][r] || {}));
      if (!xs.length) return;
      const color = COLORS[(data.runs.length + j) % COLORS.length];
      chart.set(`${g} · mean of ${members.length} runs`, xs, mean);
      chart.set(`${g} · min`, xs, lo);
      chart.set(`${g} · max`, xs, hi);
      colors.push(color, color, color);
      bands.push([chart.tables.size, color]); // (uPlot's series index of the group's max; its min is the one before)
    });
    chart.draw();
    for (const [hiIdx, color] of bands) if (chart.plot) chart.plot.addBand({series: [hiIdx, hiIdx - 1], fill: color + "33"});
    if (bands.length && chart.plot) chart.plot.setData(chart.plot.data); // (drawn again with its bands)
  }
  const heads = data.runs.map(r => `<th title="${esc(r)}">${esc(nameOf(r))}</th>`).join("");
  document.getElementById("diff").innerHTML = data.diff.length
    ? `<table><thead><tr><th>key</th>${heads}</tr></thead><tbody>` + data.diff.map(d => `<tr><td>${esc(d.key)}</td>` +
      data.runs.map(r => `<td>${esc(fmt(d.values[r]))}</td>`).join("") + "</tr>").join("") + "</tbody></table>"
    : `<p class="muted">The runs' configs are the same.</p>`;
}
// A group's runs on one x: each run's points (its attempts joined, a later attempt's value kept at a step
// both logged) interpolated at every x any of them has, within its own range; the mean, min and max there.
function groupStats(seriesOfRuns) {
  const runs = seriesOfRuns.map(byAttempt => {
    const at = new Map();
    for (const a of Object.keys(byAttempt).sort((x, y) => +x - +y)) { const [xs, ys] = byAttempt[a]; xs.forEach((x, i) => at.set(x, ys[i])); }
    const xs = [...at.keys()].sort((x, y) => x - y);
    return [xs, xs.map(x => at.get(x))];
  }).filter(([xs]) => xs.length);
  const all = [...new Set(runs.flatMap(([xs]) => xs))].sort((x, y) => x - y);
  const mean = [], lo = [], hi = [], cursor = runs.map(() => 0);
  for (const x of all) {
    const vals = [];
    runs.forEach(([xs, ys], k) => {
      if (x < xs[0] || x > xs[xs.length - 1]) return;
      let i = cursor[k];
      while (xs[i] < x) i++;
      cursor[k] = i;
      vals.push(xs[i] === x ? ys[i] : ys[i - 1] + (ys[i] - ys[i - 1]) * (x - xs[i - 1]) / (xs[i] - xs[i - 1]));
    });
    const ok = vals.filter(v => v !== null && Number.isFinite(v));
    mean.push(ok.length ? ok.reduce((s, v) => s + v, 0) / ok.length : null);
    lo.push(ok.length ? Math.min(...ok) : null);
    hi.push(ok.length ? Math.max(...ok) : null);
  }
  return [all, mean, lo, hi];
}

// ------------------------------------------------------------------------------------- ladder
async function viewLadders() {
  const data = await api("/api/ladders");
  $main.innerHTML = `<h1>Scaling ladders</h1>` + (data.ladders.length ? table(["ladder", "rungs", "targets"], data.ladders, (l, c) =>
    c === "ladder" ? `<a href="#/ladder/${encodeURIComponent(l.ladder)}">${esc(l.ladder)}</a>` : esc(fmt(l[c]))) : `<p class="muted">No ladder in this ledger.</p>`);
}
async function viewLadder(name) {
  const data = await api(`/api/ladder/${encodeURIComponent(name)}`);
  $main.innerHTML = `<h1>Ladder ${esc(name)}</h1><h2>Rungs</h2><div id="rungs"></div><h2>Fitted law and the target's forecast vs actual</h2><div class="grid" id="charts"></div><div id="targets"></div>`;
  document.getElementById("rungs").innerHTML = table(["run_id", "rung", "preset", "tokens", "flops", "last_step", "final_loss"], data.rungs, (r, c) =>
    c === "run_id" ? `<a href="#/run/${encodeURIComponent(r.run_id)}">${esc(r.run_id)}</a>` : esc(fmt(r[c])));
  window.rlCharts = [];
  const grid = document.getElementById("charts");
  const rungs = data.rungs.filter(r => r.flops && r.final_loss !== null);
  let html = "";
  for (const t of data.targets) {
    const fit = (t.fit && t.fit.fit) || {};
    if (rungs.length && fit.E !== undefined) {
      const law = new Chart(grid, `L = E + A·C^(−α): E=${fmt(fit.E)} A=${fmt(fit.A)} α=${fmt(fit.alpha)} (C: training FLOPs)`, {xLabel: "FLOPs", xLog: true}); // (rungs decades apart: a log axis)
      const cs = rungs.map(r => r.flops).sort((a, b) => a - b);
      law.set("rungs (final loss)", rungs.map(r => r.flops).sort((a, b) => a - b), rungs.slice().sort((a, b) => a.flops - b.flops).map(r => r.final_loss));
      const lo = cs[0], hi = cs[cs.length - 1] * 10, xs = [];
      for (let i = 0; i <= 40; i++) xs.push(lo * Math.pow(hi / lo, i / 40));
      law.set("fitted law", xs, xs.map(c => fit.E + fit.A * Math.pow(c, -fit.alpha)));
      law.draw();
    }
    const pts = t.points.filter(p => p.at_tokens !== null);
    const c = new Chart(grid, `${t.target}: forecast vs actual`, {xLabel: "tokens"});
    c.set("projected", pts.map(p => p.at_tokens), pts.map(p => p.projected_loss));
    const seen = pts.filter(p => p.observed_loss !== null);
    c.set("observed", seen.map(p => p.at_tokens), seen.map(p => p.observed_loss));
    c.band = [pts.map(p => p.at_tokens), pts.map(p => p.band_low), pts.map(p => p.band_high)];
    c.draw();
    html += `<h2>${esc(t.target)}</h2>` + table(["revision", "fraction", "at_tokens", "projected_loss", "band_low", "band_high", "band_level", "observed_loss", "inside_band", "in_force"], t.points);
  }
  document.getElementById("targets").innerHTML = html || `<p class="muted">No forecast for a target of this ladder yet.</p>`;
}

// ------------------------------------------------------------------------------------- SQL
function viewSql(params) {
  const q = params.q || "select run_id, count(*) as steps, min(loss), max(step) from steps group by run_id order by run_id";
  $main.innerHTML = `<h1>SQL</h1><p class="muted">Read-only queries over the ledger's views (the guard and bounds of <code>runledger sql</code>):
    steps, steps_all, metrics, metrics_all, system_metrics, drops, evals, decisions, alerts, forecasts, runs, checkpoints, data, events…</p>
    <textarea id="q" rows="6">${esc(q)}</textarea><br><button id="run">Run (Ctrl+Enter)</button> <span id="took" class="muted"></span><div id="out"></div>`;
  const run = async () => {
    const t0 = performance.now();
    const out = document.getElementById("out");
    try {
      const res = await api("/api/sql?q=" + encodeURIComponent(val("q")));
      document.getElementById("took").textContent = `${res.total} rows in ${Math.round(performance.now() - t0)} ms` + (res.truncated ? ` (${res.note})` : "");
      out.innerHTML = table(res.columns, res.rows);
    } catch (e) { out.innerHTML = `<p class="err">${esc(e.message)}</p>`; document.getElementById("took").textContent = ""; }
  };
  document.getElementById("run").onclick = run;
  document.getElementById("q").onkeydown = e => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) run(); };
  if (params.q) run();
}

// ------------------------------------------------------------------------------------- router
async function route() {
  const [path, query] = location.hash.replace(/^#/, "").split("?");
  const params = Object.fromEntries(new URLSearchParams(query || ""));
  const parts = (path || "/").split("/").filter(Boolean).map(decodeURIComponent);
  if (source) { source.close(); source = null; }
  window.rlCharts = [];
  document.body.dataset.ready = "0";
  const t0 = performance.now();
  try {
    if (parts[0] === "run" && parts[1]) await viewRun(parts[1]);
    else if (parts[0] === "compare" && parts[1]) await viewCompare(parts[1].split(","), params);
    else if (parts[0] === "ladder" && parts[1]) await viewLadder(parts[1]);
    else if (parts[0] === "ladder") await viewLadders();
    else if (parts[0] === "sql") viewSql(params);
    else await viewRuns(params);
  } catch (e) {
    $main.insertAdjacentHTML("beforeend", `<p class="err">${esc(e.message)}</p>`);
  }
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r))); // drawn and painted
  window.rlTimings = {view: parts[0] || "runs", ms: performance.now() - t0, at: performance.now()}; // (bench/ui.py reads it)
  document.body.dataset.ready = "1";
  if (!source) follow(() => "/api/live", {});
}
window.addEventListener("hashchange", route);
route();

"""An interactive report as one self-contained HTML file (inline CSS and JavaScript, no network).

:func:`search_html` renders a search: the ranked plans as a sortable, filterable table; the
Pareto front of step time against peak memory as an inline SVG where hovering or clicking a
point selects its plan; and for the selected plan the memory and time breakdowns, the pipeline
schedule, the rank mesh with its fabrics and explain's numbers per axis (collective bytes per
token and per step, seconds per step exposed and overlapped). :func:`sweep_html` renders a sweep:
its rows as the same table, and the best plan's throughput and MFU over the swept variables.

The data travels as one JSON block; the page draws itself with plain DOM and SVG code, so it
opens offline in any current browser. ``meshplan report ... --html out.html`` and
``meshplan sweep ... --html out.html`` write these files; in Jupyter,
:class:`~meshplan.SearchResult` and :class:`~meshplan.Explanation` display as HTML through
:func:`search_result_html` and :func:`explanation_html`.
"""

from __future__ import annotations

import html
import json
from typing import Any, Mapping, Optional, Sequence

from .explain import Explanation, explain
from .hardware import Cluster
from .model import Model
from .report import Evaluation, SearchResult
from .workload import Workload

MAX_EXPLAINED = 40
"""Plans of a search report that carry their full explanation (the top ones and the Pareto
front); the others show their metrics and breakdowns only."""


MAX_SCHEDULE_BLOCKS = 2000
"""Blocks of a simulated schedule a report draws: a longer schedule is cut to its first
blocks by start time, to keep the file small."""


def _json_block(data: Any) -> str:
    # "</" cannot end the script element early once escaped; the JSON stays valid.
    return json.dumps(data, separators=(",", ":")).replace("</", "<\\/")


def pareto_indices(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both coordinates (lower is better),
    sorted by the first coordinate."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    front: list[int] = []
    best = float("inf")
    for i in order:
        if points[i][1] < best:
            front.append(i)
            best = points[i][1]
    return front


def _pipeline_blocks(pipeline: Mapping[str, Any]) -> Optional[list[list[Any]]]:
    """The simulated schedule as ``[stage, kind, micro_batch, start_s, end_s]`` (None without
    matplotlib, which :mod:`meshplan.plot` needs)."""
    try:
        from .plot import schedule_timeline
    except ImportError:  # pragma: no cover - the test extra installs matplotlib
        return None
    blocks = schedule_timeline(pipeline)
    if len(blocks) > MAX_SCHEDULE_BLOCKS:
        blocks = sorted(blocks, key=lambda b: b.start)[:MAX_SCHEDULE_BLOCKS]
    return [[b.stage, b.kind, b.micro_batch, round(b.start, 6), round(b.end, 6)] for b in blocks]


def _explained(x: Explanation) -> dict[str, Any]:
    axes = []
    for a in x.axes:
        cs = a["collectives"]
        axes.append({
            "axis": a["axis"], "degree": a["degree"], "fabric": a["fabric"],
            "group_size": a["group_size"], "domains": a["domains"],
            "bytes_per_token_per_gpu": sum(c["bytes_per_token_per_gpu"] for c in cs),
            "bytes_per_step_per_gpu": sum(c["bytes_per_step_per_gpu"] for c in cs),
            "seconds_per_step": sum(c["seconds_per_step"] for c in cs),
            "exposed_s": a["exposed_s"], "overlapped_s": a["overlapped_s"],
            "collectives": [f"{c['op']} ({c['when']})" for c in cs],
        })
    return {"mesh": x.mesh, "axes": axes, "pipeline": x.pipeline,
            "blocks": _pipeline_blocks(x.pipeline)}


def _plan_record(ev: Evaluation) -> dict[str, Any]:
    return {
        "rank": ev.rank, "plan": str(ev.plan), **{k: v for k, v in ev.plan.to_dict().items()},
        "step_time_s": ev.step_time_s, "tokens_per_s_per_gpu": ev.tokens_per_s_per_gpu,
        "mfu": ev.mfu, "peak_memory_gib": ev.peak_memory_gib, "feasible": ev.feasible,
        "memory_gib": dict(ev.memory_gib), "time_s": dict(ev.time_s),
    }


def search_data(
    model: Model, cluster: Cluster, workload: Workload, result: SearchResult, title: str
) -> dict[str, Any]:
    """The JSON the search page draws from."""
    plans = [_plan_record(ev) for ev in result.plans]
    front = pareto_indices([(p["peak_memory_gib"], p["step_time_s"]) for p in plans])
    explain_these = sorted(set(range(min(len(plans), MAX_EXPLAINED))) | set(front))
    for i in explain_these:
        plans[i]["explain"] = _explained(explain(model, cluster, workload, result.plans[i].plan))
    gpu = cluster.resolved_gpu()
    return {
        "kind": "search", "title": title, "plans": plans, "pareto": front,
        "hypothetical": gpu.hypothetical, "gpu_description": gpu.description,
        "stats": result.stats.to_dict(),
    }


def sweep_data(rows: Sequence[Mapping[str, Any]], title: str = "meshplan sweep") -> dict[str, Any]:
    """The JSON the sweep page draws from."""
    from .sweep import VARIABLES

    hw = list(dict.fromkeys(k for r in rows for k in r if k.startswith("hw.")))
    axes = [v for v in (*VARIABLES, *hw) if len({str(r.get(v)) for r in rows}) > 1]
    if hw and "gpu" in axes:
        axes.remove("gpu")  # the label varies with the hw.* columns already listed
    return {"kind": "sweep", "title": title, "rows": [dict(r) for r in rows], "axes": axes,
            "hypothetical": any(r.get("hypothetical") for r in rows)}


def page(data: Mapping[str, Any]) -> str:
    """The whole HTML document for ``data`` (:func:`search_data` or :func:`sweep_data`)."""
    title = html.escape(str(data.get("title", "meshplan report")))
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{title}</title><style>{_CSS}</style></head><body>"
        f"<h1>{title}</h1><div id=\"banner\"></div><div id=\"app\"></div>"
        f"<script type=\"application/json\" id=\"data\">{_json_block(data)}</script>"
        f"<script>{_JS}</script></body></html>\n"
    )


def write_search_html(
    model: Model, cluster: Cluster, workload: Workload, result: SearchResult, title: str, out: str
) -> str:
    """Writes the search report to ``out``; returns ``out``."""
    text = page(search_data(model, cluster, workload, result, title))
    with open(out, "w", encoding="utf-8") as f:
        f.write(text)
    return out


def write_sweep_html(rows: Sequence[Mapping[str, Any]], out: str, title: str = "meshplan sweep") -> str:
    """Writes the sweep report to ``out``; returns ``out``."""
    with open(out, "w", encoding="utf-8") as f:
        f.write(page(sweep_data(rows, title)))
    return out


def search_result_html(result: SearchResult) -> str:
    """A static HTML table of the ranked plans (Jupyter's ``_repr_html_``)."""
    head = ["rank", "plan", "step s", "tok/s/GPU", "MFU %", "mem GiB"]
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in (
            ev.rank, ev.plan, f"{ev.step_time_s:.3f}", f"{ev.tokens_per_s_per_gpu:,.0f}",
            f"{100 * ev.mfu:.1f}", f"{ev.peak_memory_gib:.1f}")) + "</tr>"
        for ev in result.plans
    )
    s = result.stats
    return (
        "<div><table><thead><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead>"
        f"<tbody>{body}</tbody></table><p>{s.candidates:,} candidates, {s.feasible:,} feasible, "
        f"{s.elapsed_s:.2f} s</p></div>"
    )


def explanation_html(x: Explanation) -> str:
    """The explanation as HTML (Jupyter's ``_repr_html_``): the plan, then a table per axis."""
    ev = x.evaluation
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in (
            a["axis"], a["degree"], a["fabric"], a["group_size"],
            f"{a['bytes_per_token_per_gpu']:,.0f}", f"{a['bytes_per_step_per_gpu']:,.0f}",
            f"{a['exposed_s']:.4f}", f"{a['overlapped_s']:.4f}")) + "</tr>"
        for a in _explained(x)["axes"]
    )
    head = ["axis", "degree", "fabric", "group", "bytes/token/GPU", "bytes/step/GPU",
            "exposed s", "overlapped s"]
    return (
        f"<div><p><b>{html.escape(str(ev.plan))}</b>: step {ev.step_time_s:.3f} s, "
        f"{ev.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, MFU {100 * ev.mfu:.1f} %, "
        f"{ev.peak_memory_gib:.1f} GiB</p><table><thead><tr>"
        + "".join(f"<th>{h}</th>" for h in head) + f"</tr></thead><tbody>{rows}</tbody></table></div>"
    )


_CSS = """
body{font:14px system-ui,sans-serif;margin:16px;color:#222}
h1{font-size:18px}h2{font-size:15px;margin:14px 0 6px}
#banner{background:#fde68a;padding:4px 8px;display:none;margin-bottom:8px}
table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:2px 6px;text-align:right}
th{background:#f3f4f6;cursor:pointer;user-select:none}th.asc:after{content:" \\25B2"}
th.desc:after{content:" \\25BC"}tr.sel td{background:#dbeafe}tbody tr:hover td{background:#eef}
.wrap{max-height:360px;overflow:auto;display:inline-block}
.row{display:flex;gap:24px;flex-wrap:wrap}svg text{font-size:11px}
.pt{fill:#9ca3af;cursor:pointer}.pt.front{fill:#2563eb}.pt.sel{fill:#dc2626;stroke:#000}
.bar{fill:#60a5fa}
"""

_JS = r"""
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const app = document.getElementById("app");
const NS = "http://www.w3.org/2000/svg";
function el(tag, attrs, text) {
  const e = tag.startsWith("svg:") ? document.createElementNS(NS, tag.slice(4)) : document.createElement(tag);
  for (const k in (attrs || {})) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  return e;
}
function fmt(v, d) {
  if (v === null || v === undefined) return "-";
  if (typeof v === "number") return Number.isInteger(v) ? v.toLocaleString("en") : v.toFixed(d === undefined ? 3 : d);
  return String(v);
}
function bytes(n) {
  const u = ["B", "KB", "MB", "GB", "TB"]; let i = 0;
  while (n >= 1000 && i < u.length - 1) { n /= 1000; i++; }
  return n.toFixed(i ? 1 : 0) + " " + u[i];
}
if (D.hypothetical) {
  const b = document.getElementById("banner");
  b.style.display = "block";
  b.textContent = "HYPOTHETICAL HARDWARE" + (D.gpu_description ? ": " + D.gpu_description : " (what-if GPUs)");
}

// A sortable, filterable table; onSelect(index) when a row is clicked.
function makeTable(id, records, cols, onSelect) {
  const box = el("div");
  const filter = el("input", {id: id + "-filter", placeholder: "filter (e.g. pp=4, zb-h1)", size: 40});
  box.appendChild(filter);
  const wrap = el("div", {class: "wrap"});
  const t = el("table", {id: id});
  const head = el("tr");
  cols.forEach(c => head.appendChild(el("th", {"data-key": c[0]}, c[1])));
  t.appendChild(el("thead")).appendChild(head);
  const body = el("tbody");
  t.appendChild(body);
  wrap.appendChild(t); box.appendChild(wrap);
  let order = records.map((_, i) => i), key = null, dir = 1;
  function draw() {
    body.textContent = "";
    const q = filter.value.trim().toLowerCase();
    for (const i of order) {
      const r = records[i];
      const text = (r.plan || "") + " " + cols.map(c => String(r[c[0]])).join(" ");
      if (q && !text.toLowerCase().includes(q)) continue;
      const tr = el("tr", {"data-index": i});
      cols.forEach(c => tr.appendChild(el("td", {}, c[2] ? c[2](r[c[0]], r) : fmt(r[c[0]]))));
      tr.addEventListener("click", () => onSelect(i));
      body.appendChild(tr);
    }
  }
  head.querySelectorAll("th").forEach(th => th.addEventListener("click", () => {
    const k = th.getAttribute("data-key");
    dir = (key === k) ? -dir : 1; key = k;
    head.querySelectorAll("th").forEach(h => h.className = "");
    th.className = dir > 0 ? "asc" : "desc";
    order.sort((a, b) => {
      const x = records[a][k], y = records[b][k];
      if (x === y) return a - b;
      if (x === null || x === undefined) return 1;
      if (y === null || y === undefined) return -1;
      return (x < y ? -1 : 1) * dir;
    });
    draw();
  }));
  filter.addEventListener("input", draw);
  draw();
  return {box: box, mark: i => body.querySelectorAll("tr").forEach(tr =>
    tr.classList.toggle("sel", tr.getAttribute("data-index") === String(i)))};
}

// Horizontal bars of a breakdown {name: value}.
function bars(title, data, unit) {
  const box = el("div"); box.appendChild(el("h2", {}, title));
  const names = Object.keys(data), max = Math.max(1e-12, ...names.map(k => data[k]));
  const svg = el("svg:svg", {width: 380, height: 18 * names.length + 4});
  names.forEach((k, j) => {
    svg.appendChild(el("svg:text", {x: 0, y: 18 * j + 13}, k));
    svg.appendChild(el("svg:rect", {class: "bar", x: 130, y: 18 * j + 3, height: 12, width: Math.max(1, 170 * data[k] / max)}));
    svg.appendChild(el("svg:text", {x: 305, y: 18 * j + 13}, fmt(data[k], 3) + " " + unit));
  });
  box.appendChild(svg);
  return box;
}

function scheduleSvg(x) {
  const box = el("div"); box.appendChild(el("h2", {}, "pipeline schedule (" + x.pipeline.schedule + ", " + x.pipeline.micro_batches + " micro-batches)"));
  if (!x.blocks) { box.appendChild(el("p", {}, "(schedule drawing needs matplotlib when the report is made)")); return box; }
  const p = x.pipeline.stages.length, end = Math.max(...x.blocks.map(b => b[4])), W = 700;
  const svg = el("svg:svg", {id: "schedule", width: W + 60, height: 22 * p + 20});
  const colour = {F: "#60a5fa", B: "#f59e0b", W: "#10b981"};
  for (let s = 0; s < p; s++) svg.appendChild(el("svg:text", {x: 0, y: 22 * s + 15}, "stage " + s));
  for (const b of x.blocks) {
    const r = el("svg:rect", {x: 60 + W * b[3] / end, y: 22 * b[0] + 3, width: Math.max(0.5, W * (b[4] - b[3]) / end), height: 16, fill: colour[b[1]] || "#999"});
    r.appendChild(el("svg:title", {}, b[1] + " micro-batch " + b[2]));
    svg.appendChild(r);
  }
  svg.appendChild(el("svg:text", {x: 60, y: 22 * p + 15}, "0 s  ...  " + fmt(end, 3) + " s"));
  box.appendChild(svg);
  return box;
}

function meshSvg(x, ranks) {
  const box = el("div"); box.appendChild(el("h2", {}, "rank mesh (order " + x.mesh.order + ", " + x.mesh.domain_size + " GPUs per NVLink domain)"));
  const sel = el("select", {id: "mesh-axis"});
  x.mesh.axes.forEach(a => sel.appendChild(el("option", {value: a.axis}, a.axis + "=" + a.size)));
  box.appendChild(sel);
  const holder = el("div"); box.appendChild(holder);
  function draw() {
    holder.textContent = "";
    const axis = sel.value, n = Math.min(ranks, 1024), cols = Math.min(32, n), size = 18;
    const others = x.mesh.axes.filter(a => a.axis !== axis);
    const ids = {}, svg = el("svg:svg", {width: cols * size + 2, height: Math.ceil(n / cols) * size + 2});
    for (let r = 0; r < n; r++) {
      const key = others.map(a => Math.floor(r / a.stride) % a.size).join(",");
      if (!(key in ids)) ids[key] = Object.keys(ids).length;
      const g = ids[key], hue = (g * 137.5) % 360;
      const dom = Math.floor(r / x.mesh.domain_size);
      const rect = el("svg:rect", {x: 1 + (r % cols) * size, y: 1 + Math.floor(r / cols) * size, width: size - 2, height: size - 2,
        fill: "hsl(" + hue + ",65%," + (dom % 2 ? 45 : 65) + "%)"});
      rect.appendChild(el("svg:title", {}, "rank " + r + ": " + axis + " group " + g + ", NVLink domain " + dom));
      svg.appendChild(rect);
    }
    holder.appendChild(svg);
    holder.appendChild(el("p", {}, "colour: " + axis + " group; light/dark alternate NVLink domains" + (ranks > n ? " (first 1,024 ranks)" : "")));
  }
  sel.addEventListener("change", draw); draw();
  const fab = el("ul");
  x.mesh.groups.forEach(g => fab.appendChild(el("li", {}, g.axis + ": " + g.size + " ranks, " + g.members_per_domain +
    " per domain over " + g.domains + " domain(s), " + (g.crosses_domain ? "crosses domains (network)" : "inside one domain (NVLink)"))));
  box.appendChild(fab);
  return box;
}

function axesTable(x) {
  const box = el("div"); box.appendChild(el("h2", {}, "per axis (explain)"));
  const t = el("table", {id: "axes"}), h = el("tr");
  ["axis", "degree", "fabric", "group", "bytes/token/GPU", "bytes/step/GPU", "comm s/step", "exposed s", "overlapped s"].forEach(c => h.appendChild(el("th", {}, c)));
  t.appendChild(h);
  x.axes.forEach(a => {
    const tr = el("tr");
    [a.axis, a.degree, a.fabric, a.group_size, bytes(a.bytes_per_token_per_gpu), bytes(a.bytes_per_step_per_gpu),
     fmt(a.seconds_per_step, 4), fmt(a.exposed_s, 4), fmt(a.overlapped_s, 4)].forEach(c => tr.appendChild(el("td", {}, String(c))));
    tr.title = a.collectives.join("; ");
    t.appendChild(tr);
  });
  box.appendChild(t);
  return box;
}

function searchPage() {
  const plans = D.plans, front = new Set(D.pareto);
  const detail = el("div", {id: "detail"});
  const ranks = plans.length ? ["dp", "tp", "pp", "cp"].reduce((m, k) => m * (plans[0][k] || 1), 1) : 0;
  let table, circles = [];
  function select(i) {
    const p = plans[i];
    table.mark(i);
    circles.forEach(c => c.classList.toggle("sel", c.getAttribute("data-index") === String(i)));
    detail.textContent = "";
    detail.appendChild(el("h2", {id: "selected-plan", "data-index": i}, "plan " + (p.rank || "-") + ": " + p.plan));
    detail.appendChild(el("p", {}, "step " + fmt(p.step_time_s) + " s, " + fmt(Math.round(p.tokens_per_s_per_gpu)) +
      " tokens/s per GPU, MFU " + (100 * p.mfu).toFixed(1) + " %, peak memory " + fmt(p.peak_memory_gib, 1) + " GiB"));
    const row = el("div", {class: "row"});
    row.appendChild(bars("memory per GPU", p.memory_gib, "GiB"));
    row.appendChild(bars("time per step", p.time_s, "s"));
    detail.appendChild(row);
    if (p.explain) {
      detail.appendChild(axesTable(p.explain));
      detail.appendChild(scheduleSvg(p.explain));
      detail.appendChild(meshSvg(p.explain, ranks));
    } else {
      detail.appendChild(el("p", {}, "(explanations are embedded for the top plans and the Pareto front)"));
    }
  }
  const cols = [["rank", "rank"], ["dp", "dp"], ["tp", "tp"], ["pp", "pp"], ["ep", "ep"], ["cp", "cp"], ["vpp", "vpp"],
    ["micro_batch", "mb"], ["zero", "zero"], ["recompute", "recompute"], ["sequence_parallel", "sp"], ["schedule", "schedule"],
    ["order", "order"], ["step_time_s", "step s"], ["tokens_per_s_per_gpu", "tok/s/GPU", v => fmt(Math.round(v))],
    ["mfu", "MFU %", v => (100 * v).toFixed(1)], ["peak_memory_gib", "mem GiB", v => fmt(v, 1)]];
  table = makeTable("plans", plans, cols, select);
  app.appendChild(el("p", {}, plans.length + " plans shown of " + fmt(D.stats.feasible) + " feasible, " + fmt(D.stats.candidates) + " candidates"));
  const top = el("div", {class: "row"});
  top.appendChild(table.box);
  // Pareto: peak memory (x) against step time (y).
  const W = 460, H = 320, L = 50, B = 30;
  const svg = el("svg:svg", {id: "pareto", width: W, height: H});
  if (plans.length) {
    const xs = plans.map(p => p.peak_memory_gib), ys = plans.map(p => p.step_time_s);
    const x0 = Math.min(...xs), x1 = Math.max(...xs) || 1, y0 = Math.min(...ys), y1 = Math.max(...ys) || 1;
    const sx = v => L + (W - L - 10) * (x1 > x0 ? (v - x0) / (x1 - x0) : 0.5);
    const sy = v => H - B - (H - B - 10) * (y1 > y0 ? (v - y0) / (y1 - y0) : 0.5);
    svg.appendChild(el("svg:line", {x1: L, y1: H - B, x2: W - 5, y2: H - B, stroke: "#000"}));
    svg.appendChild(el("svg:line", {x1: L, y1: 5, x2: L, y2: H - B, stroke: "#000"}));
    svg.appendChild(el("svg:text", {x: L, y: H - 8}, "peak memory GiB: " + fmt(x0, 1) + " .. " + fmt(x1, 1)));
    svg.appendChild(el("svg:text", {x: 2, y: 12}, "step s " + fmt(y0) + " .. " + fmt(y1)));
    const pts = D.pareto.map(i => sx(xs[i]) + "," + sy(ys[i])).join(" ");
    svg.appendChild(el("svg:polyline", {points: pts, fill: "none", stroke: "#2563eb"}));
    // The front is drawn last so that its points lie on top of plans at the same spot.
    const drawOrder = plans.map((_, i) => i).filter(i => !front.has(i)).concat(D.pareto);
    drawOrder.forEach(i => {
      const p = plans[i];
      const c = el("svg:circle", {class: "pt" + (front.has(i) ? " front" : ""), cx: sx(xs[i]), cy: sy(ys[i]), r: front.has(i) ? 5 : 3.5, "data-index": i});
      c.appendChild(el("svg:title", {}, p.plan));
      c.addEventListener("click", () => select(i));
      c.addEventListener("mouseenter", () => select(i));
      circles.push(c); svg.appendChild(c);
    });
  }
  const pbox = el("div"); pbox.appendChild(el("h2", {}, "Pareto front: step time vs peak memory (blue: the front)")); pbox.appendChild(svg);
  top.appendChild(pbox);
  app.appendChild(top);
  app.appendChild(detail);
  if (plans.length) select(0); else detail.appendChild(el("p", {}, "no feasible plan"));
}

function lineChart(id, rows, x, yKey, scale, label, series) {
  const W = 460, H = 260, L = 55, B = 30;
  const svg = el("svg:svg", {id: id, width: W, height: H});
  const xsAll = [...new Set(rows.map(r => String(r[x])))];
  const numeric = rows.every(r => typeof r[x] === "number");
  if (numeric) xsAll.sort((a, b) => Number(a) - Number(b));
  const ok = rows.filter(r => r.status === "ok");
  const ys = ok.map(r => r[yKey] * scale), y1 = Math.max(1e-12, ...ys);
  const sx = v => L + (W - L - 15) * (xsAll.length > 1 ? xsAll.indexOf(String(v)) / (xsAll.length - 1) : 0.5);
  const sy = v => H - B - (H - B - 10) * v / y1;
  svg.appendChild(el("svg:line", {x1: L, y1: H - B, x2: W - 5, y2: H - B, stroke: "#000"}));
  svg.appendChild(el("svg:text", {x: 2, y: 12}, label + " (max " + fmt(y1, 1) + ")"));
  xsAll.forEach(v => svg.appendChild(el("svg:text", {x: sx(v) - 8, y: H - 12}, v)));
  const groups = {};
  ok.forEach(r => { const k = series.map(s => s + "=" + r[s]).join(", "); (groups[k] = groups[k] || []).push(r); });
  Object.keys(groups).forEach((k, j) => {
    const rs = groups[k].slice().sort((a, b) => xsAll.indexOf(String(a[x])) - xsAll.indexOf(String(b[x])));
    const colour = "hsl(" + (j * 67) % 360 + ",70%,45%)";
    svg.appendChild(el("svg:polyline", {points: rs.map(r => sx(r[x]) + "," + sy(r[yKey] * scale)).join(" "), fill: "none", stroke: colour}));
    rs.forEach(r => { const c = el("svg:circle", {cx: sx(r[x]), cy: sy(r[yKey] * scale), r: 3, fill: colour}); c.appendChild(el("svg:title", {}, k + " " + x + "=" + r[x] + ": " + fmt(r[yKey] * scale, 2))); svg.appendChild(c); });
  });
  return svg;
}

function sweepPage() {
  const rows = D.rows, axes = D.axes;
  const x = axes.find(a => rows.every(r => typeof r[a] === "number")) || axes[0] || "gpus";
  const series = axes.filter(a => a !== x);
  const detail = el("div", {id: "detail"});
  let table;
  function select(i) {
    table.mark(i);
    const r = rows[i];
    detail.textContent = "";
    detail.appendChild(el("h2", {id: "selected-plan", "data-index": i}, axes.concat(["gpus"]).filter((v, j, a) => a.indexOf(v) === j).map(a => a + "=" + r[a]).join(", ")));
    detail.appendChild(el("p", {}, r.status === "ok" ? "best plan " + r.plan + ": " + fmt(Math.round(r.tokens_per_s_per_gpu)) +
      " tokens/s per GPU, MFU " + (100 * r.mfu).toFixed(1) + " %, " + fmt(r.peak_memory_gib, 1) + " GiB" : r.status + " " + (r.error || "")));
  }
  const cols = ["model", "gpu", "gpus", "global_batch", "seq_len"].concat(axes.filter(a => a.startsWith("hw."))).map(c => [c, c]).concat([
    ["status", "status"], ["tokens_per_s_per_gpu", "tok/s/GPU", v => v === null ? "-" : fmt(Math.round(v))],
    ["mfu", "MFU %", v => v === null ? "-" : (100 * v).toFixed(1)], ["peak_memory_gib", "mem GiB", v => fmt(v, 1)], ["plan", "plan"]]);
  table = makeTable("plans", rows, cols, select);
  const charts = el("div", {class: "row"});
  charts.appendChild(lineChart("throughput", rows, x, "tokens_per_s_per_gpu", 1, "best tokens/s per GPU vs " + x, series));
  charts.appendChild(lineChart("mfu", rows, x, "mfu", 100, "MFU % of the best plan vs " + x, series));
  app.appendChild(el("p", {}, rows.length + " points; swept: " + (axes.join(", ") || "nothing")));
  app.appendChild(charts);
  app.appendChild(table.box);
  app.appendChild(detail);
  if (rows.length) select(0);
}

if (D.kind === "search") searchPage(); else sweepPage();
"""

__all__ = [
    "page", "search_data", "sweep_data", "write_search_html", "write_sweep_html",
    "search_result_html", "explanation_html", "pareto_indices", "MAX_EXPLAINED",
]

"""The ``ctbuild tune --report`` page: one self-contained HTML file (inline SVG, no JS).

One section per kernel, for the hundreds of records a `Dim` kernel set makes: a chart of every
workload's (bucket's) winner and its speed-up over the default config, a table with the ties,
the rule that chose and the regret inside each bucket, and per workload, collapsed, the bar
chart of every measured candidate (mean with its 95% CI; winner and default marked), the ties,
the regret at each interior size and the failed candidates with their errors. The data is
written beside it as ``PATH.json`` and embedded in the page.
"""
from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from ..atomic_write import write_json, write_text
from ..waves import describe
from .choice import DEFAULT_BAND_PERCENT

WINNER, DEFAULT, OTHER, FAIL = "#2e7d32", "#1565c0", "#9e9e9e", "#c62828"

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;
max-width:1100px;color:#212121;padding:0 16px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 2px}
.meta{color:#616161;margin-bottom:14px} .wl{color:#616161;font-family:monospace;font-size:12px}
table{border-collapse:collapse;margin:10px 0 18px} th,td{padding:4px 10px;text-align:left;
border-bottom:1px solid #e0e0e0;vertical-align:top} th{background:#fafafa}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.tuned{color:#2e7d32;font-weight:600} .failed{color:#c62828;font-weight:600}
.skipped{color:#757575;font-weight:600}
.card{border:1px solid #e0e0e0;border-radius:8px;padding:10px 16px 14px;margin:16px 0}
.fail{color:#c62828;font-family:monospace;font-size:12px;white-space:pre-wrap}
.legend span{display:inline-block;margin-right:14px} .sw{display:inline-block;width:11px;
height:11px;border-radius:2px;margin-right:4px;vertical-align:-1px}
.big{font-size:15px} code{font-size:12px}
details{border-top:1px solid #eeeeee;padding:6px 0} summary{cursor:pointer}
svg{max-width:100%;height:auto} .index{columns:3;margin:8px 0 0}
.fail,.wl,code,li{overflow-wrap:anywhere}
"""


def _esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _cfg(cfg: Any) -> str:
    if not isinstance(cfg, dict):
        return str(cfg)
    return ", ".join(f"{k}={v}" for k, v in cfg.items())


def _us(v: Any) -> str:
    return "–" if v is None else f"{v:,.1f}"


def chart(record: dict[str, Any], width: int = 900) -> str:
    """Horizontal bars, fastest first: mean time with a CI whisker; winner green, default blue."""
    cands = sorted(record.get("candidates", []), key=lambda c: c["mean_us"])
    if not cands:
        return "<p><em>No candidate could be measured.</em></p>"
    default = record.get("default", {}).get("config")
    winner = record.get("config")
    labels = [_clip(_cfg(c["config"]), MAX_LABEL) for c in cands]
    label_w = int(max(len(x) for x in labels) * CHAR_W) + 16
    right_w, row_h, top = 230, 20, 24
    width = max(width, label_w + right_w + 300)
    plot_w = width - label_w - right_w
    step = _nice_step(max(c["mean_us"] + (c.get("ci_us") or 0) for c in cands) / 5)
    vmax = step * (int(max(c["mean_us"] + (c.get("ci_us") or 0) for c in cands) / step) + 1)
    nticks = int(round(vmax / step))
    digits = 0 if step >= 1 else len(f"{step:.6f}".rstrip("0").split(".")[1])
    height = top + row_h * len(cands) + 24
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="candidate times" '
           'font-family="system-ui,sans-serif" font-size="12">']
    # grid lines and axis ticks
    for i in range(nticks + 1):
        v = step * i
        x = label_w + plot_w * v / vmax
        out.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{height - 20}" '
                   'stroke="#eeeeee"/>')
        out.append(f'<text x="{x:.1f}" y="{height - 6}" text-anchor="middle" fill="#757575">'
                   f'{v:,.{digits}f} µs</text>')
    out.append('<text x="4" y="14" fill="#424242">screening pass: mean time per launch (bar) '
               'and 95% confidence interval (whisker); shorter is better</text>')
    for i, (c, label) in enumerate(zip(cands, labels)):
        y = top + i * row_h
        is_w, is_d = c["config"] == winner, c["config"] == default
        color = WINNER if is_w else DEFAULT if is_d else OTHER
        w = max(1.0, plot_w * c["mean_us"] / vmax)
        ci = c.get("ci_us") or 0.0
        x0, x1 = label_w + plot_w * max(0.0, c["mean_us"] - ci) / vmax, \
            label_w + plot_w * (c["mean_us"] + ci) / vmax
        tag = " ★ winner" if is_w else ""
        tag += " (default)" if is_d else ""
        weight = ' font-weight="600"' if (is_w or is_d) else ""
        out.append(f'<text x="{label_w - 8}" y="{y + 14}" text-anchor="end"{weight} '
                   f'fill="#212121">{_esc(label)}</text>')
        out.append(f'<rect x="{label_w}" y="{y + 3}" width="{w:.1f}" height="{row_h - 6}" '
                   f'rx="2" fill="{color}"><title>{_esc(_cfg(c["config"]))}: '
                   f'{c["mean_us"]:.2f} ± {ci:.2f} µs, {c.get("samples", "?")} samples'
                   '</title></rect>')
        out.append(f'<line x1="{x0:.1f}" y1="{y + row_h / 2:.1f}" x2="{x1:.1f}" '
                   f'y2="{y + row_h / 2:.1f}" stroke="#212121" stroke-width="1.3"/>')
        for xe in (x0, x1):
            out.append(f'<line x1="{xe:.1f}" y1="{y + 5}" x2="{xe:.1f}" y2="{y + row_h - 5}" '
                       'stroke="#212121" stroke-width="1.3"/>')
        out.append(f'<text x="{label_w + plot_w + 8}" y="{y + 14}"{weight} fill="{color}">'
                   f'{c["mean_us"]:,.1f} ± {ci:,.1f} µs{tag}</text>')
    out.append("</svg>")
    return "".join(out)


def _nice_step(raw: float) -> float:
    """1, 2 or 5 times a power of ten, at least ``raw``."""
    import math
    if raw <= 0:
        return 1.0
    base = 10 ** math.floor(math.log10(raw))
    return next(m * base for m in (1, 2, 5, 10) if m * base >= raw)


def _workload(record: dict[str, Any] | None, fallback: str) -> str:
    if not record or not record.get("workload"):
        return fallback
    parts = []
    for name, spec in record["workload"].items():
        if isinstance(spec, dict) and "tensor" in spec:
            parts.append(f"{name}: {spec['dtype']}[{'×'.join(map(str, spec['tensor']))}]")
        elif isinstance(spec, dict) and "scalar" in spec:
            parts.append(f"{name}: {spec['scalar']}")
        else:
            parts.append(f"{name}={spec}")
    return ", ".join(parts)


#: Colours of the winners in a kernel's chart (a config keeps its colour within the kernel).
PALETTE = ("#2e7d32", "#1565c0", "#ef6c00", "#6a1b9a", "#00838f", "#ad1457", "#5d4037",
           "#9e9d24")
#: Width of one character of the charts' 12px labels, for sizing their columns: a capital
#: letter's (the widest), so that no label is clipped whatever its letters.
CHAR_W = 8.6
#: Labels longer than this are shortened with an ellipsis (the whole text is the tooltip).
MAX_LABEL = 56


def _bucket(rec: dict[str, Any], fallback: str) -> str:
    """A short name of the entry: its bucket (``M<=1024``) with what tells two workloads over
    the same Dim apart (the first tensor's dtype and other sizes), or its workload."""
    regret = rec.get("regret") or {}
    if not regret.get("bucket"):
        return _workload(rec, fallback)
    bucket = ", ".join(f"{k}≤{v}" for k, v in regret["bucket"].items())
    first = next((v for v in (rec.get("workload") or {}).values()
                  if isinstance(v, dict) and "tensor" in v), None)
    if first is None:
        return bucket
    varying = set(regret["bucket"].values())
    static = [str(n) for n in first["tensor"] if n not in varying]
    return f"{bucket} · {first.get('dtype', '?')}" + (f" ×{'×'.join(static)}" if static else "")


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n - 1] + "…"


def winners_chart(entries: list[dict[str, Any]]) -> str:
    """One row per workload (bucket) of a kernel: speed-up of its winner over the default
    config, coloured by the winning config."""
    rows = [(s, s.get("record") or {}) for s in entries]
    rows = [(s, r) for s, r in rows if r.get("config")]
    if not rows:
        return "<p><em>No winner recorded.</em></p>"
    colours: dict[str, str] = {}
    labels = [_clip(_bucket(r, s.get("workload", "")), MAX_LABEL) for s, r in rows]
    notes = [_clip(_cfg(r["config"]), MAX_LABEL) for _, r in rows]
    speeds = [(s.get("speedup_vs_default") or 1.0) for s, _ in rows]
    label_w = int(max(len(x) for x in labels) * CHAR_W) + 16
    right_w = int(max(len(x) for x in notes) * CHAR_W) + 70
    width = max(720, label_w + right_w + 320)
    plot_w = width - label_w - right_w
    vmax = max(1.0, max(speeds)) * 1.05
    row_h, top = 20, 24
    height = top + row_h * len(rows) + 24
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="winners per workload" '
           'font-family="system-ui,sans-serif" font-size="12">',
           '<text x="4" y="14" fill="#424242">speed-up of the winner over the default config '
           '(1.00× = the default wins); colour = winning config</text>']
    one = label_w + plot_w / vmax
    out.append(f'<line x1="{one:.1f}" y1="{top - 4}" x2="{one:.1f}" y2="{height - 20}" '
               'stroke="#bdbdbd" stroke-dasharray="3,3"/>')
    out.append(f'<text x="{one:.1f}" y="{height - 6}" text-anchor="middle" fill="#757575">'
               '1.00×</text>')
    for i, ((_, r), label, note, speed) in enumerate(zip(rows, labels, notes, speeds)):
        y = top + i * row_h
        key = json.dumps(r["config"], sort_keys=True)
        colour = colours.setdefault(key, PALETTE[len(colours) % len(PALETTE)])
        w = max(1.0, plot_w * speed / vmax)
        out.append(f'<text x="{label_w - 8}" y="{y + 14}" text-anchor="end" fill="#212121">'
                   f'{_esc(label)}</text>')
        out.append(f'<rect x="{label_w}" y="{y + 3}" width="{w:.1f}" height="{row_h - 6}" '
                   f'rx="2" fill="{colour}"><title>{_esc(_cfg(r["config"]))}: '
                   f'{speed:.2f}× the default</title></rect>')
        out.append(f'<text x="{label_w + plot_w + 8}" y="{y + 14}" fill="{colour}">'
                   f'{speed:.2f}×  {_esc(note)}</text>')
    out.append("</svg>")
    return "".join(out)


def served_worst(regret: dict[str, Any]) -> float:
    """The largest loss a call of a raced size is served with (a wave table's choice where
    its class has one), else the split's worst loss (a record from before ``max_pct``): what
    the report and the CLI's bucket line flag against the band."""
    worst = regret.get("max_pct")
    if not isinstance(worst, (int, float)):
        worst = regret.get("worst_pct")
    return float(worst) if isinstance(worst, (int, float)) else 0.0


def record_band(rec: dict[str, Any]) -> float:
    """The tie band a record was chosen with, in percent (the default where it says none)."""
    return float(((rec.get("choice") or {}).get("band") or {}).get("percent",
                                                                   DEFAULT_BAND_PERCENT))


def _regret_cell(rec: dict[str, Any]) -> str:
    """The winner's worst loss over its bucket's sizes, flagged above the tie band (with why
    the bucket was not split further as its tooltip)."""
    regret = rec.get("regret") or {}
    worst = regret.get("max_pct")
    if worst is None:
        return "–"
    band = record_band(rec)
    if worst <= band:
        return f"{worst:.1f}%"
    why = regret.get("unsplit") or "tuned before ctbuild split buckets"
    return f'<span class="failed" title="{_esc(why)}">⚠ {worst:.1f}%</span>'



def _ties_cell(rec: dict[str, Any]) -> str:
    choice = rec.get("choice") or {}
    if not choice:
        return "–"
    return f'{len(choice.get("ties", []))} · {_esc(choice.get("rule", ""))}'


def _entry_row(i: int, s: dict[str, Any]) -> str:
    rec = s.get("record") or {}
    st = s.get("status", "?")
    speed = s.get("speedup_vs_default")
    return (f'<tr><td class="wl"><a href="#e{i}">{_esc(_bucket(rec, s.get("workload", "")))}'
            f'</a></td><td class="{_esc(st)}">{_esc(st)}</td>'
            f'<td>{_esc(_cfg(s.get("winner"))) if s.get("winner") else "–"}</td>'
            f'<td class="num">{_us(s.get("mean_us"))}</td>'
            f'<td class="num">{_us(s.get("default_us"))}</td>'
            f'<td class="num">{f"{speed:.2f}×" if speed else "–"}</td>'
            f'<td>{_ties_cell(rec)}</td><td class="num">{_regret_cell(rec)}</td>'
            f'<td class="num">{len(s.get("failures") or [])}</td></tr>')


def _details(i: int, s: dict[str, Any]) -> str:
    """An entry's details, collapsed: candidate chart, ties, regret sizes, failures."""
    rec = s.get("record") or {}
    st = s.get("status", "?")
    body = [f'<details id="e{i}"><summary><b>{_esc(_bucket(rec, s.get("workload", "")))}'
            f'</b> <span class="{_esc(st)}">· {_esc(st)}</span></summary>'
            f'<div class="wl">{_esc(_workload(rec, s.get("workload", "")))}</div>']
    if s.get("note"):
        body.append(f"<p>{_esc(s['note'])}</p>")
    if rec:
        d = rec.get("default", {})
        if rec.get("config"):
            verdict = ""
            if rec.get("mean_us") and d.get("mean_us"):
                gain = (d["mean_us"] - rec["mean_us"]) / d["mean_us"] * 100
                verdict = (f" — <b>{gain:.1f}% faster</b> than the default "
                           f"({_us(d['mean_us'])} µs)" if rec["config"] != d.get("config")
                           else " — the default config is the winner")
            elif d.get("mean_us") is None:
                verdict = " — the default config could not be measured"
            body.append(f'<p class="big">Winner <b>{_esc(_cfg(rec["config"]))}</b>: '
                        f'{_us(rec.get("mean_us"))} ± {_us(rec.get("ci_us"))} µs{verdict}</p>')
        body.append(_choice_text(rec))
        body.append('<div class="legend"><span><i class="sw" style="background:'
                    f'{WINNER}"></i>winner</span><span><i class="sw" style="background:'
                    f'{DEFAULT}"></i>default config</span><span><i class="sw" '
                    f'style="background:{OTHER}"></i>other candidates</span></div>')
        body.append(chart(rec))
        body.append(_regret_text(rec))
        sp = rec.get("space", {})
        body.append(f'<p class="meta">{len(rec.get("candidates", []))} measured of '
                    f'{sp.get("kept", "?")} candidates (space {sp.get("total", "?")}, '
                    f'{sp.get("pruned", "?")} after the constraint) · '
                    f'{rec.get("seconds", "?")} s · compiled during tune: '
                    f'{rec.get("compiled_during_tune", 0)} · compiles during measurement: '
                    f'{rec.get("compiles_during_measurement", 0)} · tuning key '
                    f'<code>{_esc(json.dumps(rec.get("tuning_key")))}</code></p>')
    fails = s.get("failures") or []
    if fails:
        items = "".join(f'<li><b>{_esc(_cfg(f.get("config")))}</b>: '
                        f'<span class="fail">{_esc(str(f.get("error", ""))[:600])}</span></li>'
                        for f in fails)
        body.append(f'<p style="color:{FAIL}"><b>{len(fails)} failed</b></p><ul>{items}</ul>')
    body.append("</details>")
    return "".join(body)


def _choice_text(rec: dict[str, Any]) -> str:
    choice = rec.get("choice") or {}
    if not choice:
        return ""
    band = choice.get("band", {}).get("percent")
    ties = ", ".join(f'{_esc(_cfg(t["config"]))} ({_us(t["mean_us"])} µs)'
                     for t in choice.get("ties", []))
    runoff = rec.get("runoff") or {}
    rounds = (f' Finalists ran off over {runoff["rounds"]} interleaved rounds '
              f'({_esc(runoff.get("stopped", ""))}).' if runoff else "")
    return (f'<p>Chosen by the tie rule: <b>{_esc(choice.get("rule", ""))}</b> (band {band}% '
            f'or 95% CIs overlapping within twice it). Ties, in space order: {ties}.{rounds}</p>')


def _regret_text(rec: dict[str, Any]) -> str:
    regret = rec.get("regret") or {}
    if not regret.get("sizes"):
        return ""
    cells = "".join(f'<tr><td class="wl">{_esc(json.dumps(x["sizes"]))}</td>'
                    f'<td class="num">{x["regret_pct"]:.2f}%</td>'
                    f'<td>{_esc(_cfg(x["fastest"]))}</td></tr>' for x in regret["sizes"])
    refined = rec.get("refined")
    refined = refined if isinstance(refined, dict) else {}
    splits = [x.get("sizes") for x in refined.get("splits") or [] if isinstance(x, dict)]
    split_text = "" if not splits else (
        "<p>Split into sub-buckets up to "
        + "; ".join(_esc(", ".join(f"{k}≤{v}" for k, v in sz.items())) for sz in splits
                    if isinstance(sz, dict))
        + ", each served from its own record.</p>")
    by_class = rec.get("by_class") if isinstance(rec.get("by_class"), dict) else {}
    if by_class:
        split_text += ("<p>A winner per layout class (a size divisible by 16 runs another CUBIN "
                       "than one that is not): " + "; ".join(
                           f"{_esc(str(k))} "
                           f"{_esc(_cfg(v.get('config') if isinstance(v, dict) else v))}"
                           f"{_esc(describe(v))}"
                           for k, v in sorted(by_class.items(), key=lambda kv: str(kv[0])))
                       + ".</p>")
    if regret.get("unsplit") and served_worst(regret) > record_band(rec):
        split_text += f'<p class="failed">Not split further: {_esc(regret["unsplit"])}.</p>'
    return ("<p>Loss of the winner at the sizes its bucket serves (its time over the fastest "
            "candidate's there; a size of a layout class with its own winner: that one's):"
            "</p><table><tr><th>size</th><th>loss</th><th>fastest there</th></tr>" + cells
            + "</table>" + split_text)


def _kernel_section(name: str, items: list[tuple[int, dict[str, Any]]]) -> str:
    speeds = [float(s["speedup_vs_default"]) for _, s in items if s.get("speedup_vs_default")]
    tuned = sum(s.get("status") == "tuned" for _, s in items)
    head = (f'<section class="card" id="k-{_esc(name)}"><h2>{_esc(name)}</h2>'
            f'<p class="meta">{len(items)} workload(s), {tuned} tuned now'
            + (f' · speed-up over the default: median {sorted(speeds)[len(speeds) // 2]:.2f}×, '
               f'best {max(speeds):.2f}×' if speeds else "") + "</p>")
    table = ("<table><tr><th>workload / bucket</th><th>status</th><th>winner</th><th>µs</th>"
             "<th>default µs</th><th>speed-up</th><th>ties · rule</th><th>regret</th>"
             "<th>failed</th></tr>" + "".join(_entry_row(i, s) for i, s in items) + "</table>")
    details = "".join(_details(i, s) for i, s in items)
    return head + winners_chart([s for _, s in items]) + table + details + "</section>"


def render_html(result: dict[str, Any]) -> str:
    """The whole page for a ``ctbuild tune --json`` result: one section per kernel."""
    by_kernel: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for i, s in enumerate(result.get("entries", [])):
        by_kernel.setdefault(s["kernel"], []).append((i, s))
    index = "".join(f'<li><a href="#k-{_esc(k)}">{_esc(k)}</a> ({len(v)})</li>'
                    for k, v in by_kernel.items())
    head = (f'{_esc(result.get("gpu", "?"))} ({_esc(result.get("arch", "?"))}), driver '
            f'{_esc(result.get("driver", "?"))} · toolchain '
            f'<code>{_esc(str(result.get("toolchain", ""))[:16])}</code> · cache '
            f'<code>{_esc(result.get("cache", ""))}</code> · {result.get("tuned", 0)} tuned, '
            f'{result.get("skipped", 0)} skipped, {result.get("failed", 0)} failed in '
            f'{result.get("seconds", "?")} s · compiles during measurement: '
            f'<b>{result.get("compiles_during_measurement", 0)}</b>')
    data = json.dumps(result, default=str).replace("</", "<\\/")
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<title>ctbuild tune report</title>"
            f"<style>{CSS}</style></head><body><h1>ctbuild tune report</h1>"
            f'<div class="meta">{head}</div><ul class="index">{index}</ul>'
            + "".join(_kernel_section(k, v) for k, v in by_kernel.items())
            + f'<script type="application/json" id="ctbuild-tune-data">{data}</script>'
            "</body></html>")


def write_report(path: Path, result: dict[str, Any]) -> tuple[Path, Path]:
    """Write the HTML page at ``path`` and the data at ``path + '.json'``, each whole or not at
    all and only as a regular file (`ctbuild.atomic_write`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, render_html(result))
    json_path = path.with_name(path.name + ".json")
    write_json(json_path, result)
    return path, json_path

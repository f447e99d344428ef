"""The ``ctbuild tune --report`` page: one self-contained HTML file (inline SVG, no JS).

Per kernel x workload: a bar chart of every measured candidate (mean with its 95% CI), the
winner and the default config marked, and the failed candidates with their errors. The data
is written beside it as ``PATH.json`` and embedded in the page.
"""
from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

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
"""


def _esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _cfg(cfg: Any) -> str:
    if not isinstance(cfg, dict):
        return str(cfg)
    return ", ".join(f"{k}={v}" for k, v in cfg.items())


def _us(v: Any) -> str:
    return "–" if v is None else f"{v:,.1f}"


def chart(record: dict[str, Any], width: int = 1000) -> str:
    """Horizontal bars, fastest first: mean time with a CI whisker; winner green, default blue."""
    cands = sorted(record.get("candidates", []), key=lambda c: c["mean_us"])
    if not cands:
        return "<p><em>No candidate could be measured.</em></p>"
    default = record.get("default", {}).get("config")
    winner = record.get("config")
    label_w, right_w, row_h, top = 290, 210, 20, 24
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
    out.append(f'<text x="{label_w}" y="14" fill="#424242">mean time per launch '
               '(bar) and 95% confidence interval (whisker); shorter is better</text>')
    for i, c in enumerate(cands):
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
                   f'fill="#212121">{_esc(_cfg(c["config"]))}</text>')
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


def render_html(result: dict[str, Any]) -> str:
    """The whole page for a ``ctbuild tune --json`` result."""
    entries = result.get("entries", [])
    rows, cards = [], []
    for i, s in enumerate(entries):
        rec = s.get("record") or {}
        st = s.get("status", "?")
        speed = s.get("speedup_vs_default")
        nfail = len(s.get("failures") or [])
        rows.append(
            f'<tr><td><a href="#e{i}">{_esc(s["kernel"])}</a></td>'
            f'<td class="wl">{_esc(_workload(rec, s.get("workload", "")))}</td>'
            f'<td class="{_esc(st)}">{_esc(st)}</td>'
            f'<td>{_esc(_cfg(s.get("winner"))) if s.get("winner") else "–"}</td>'
            f'<td class="num">{_us(s.get("mean_us"))}</td>'
            f'<td class="num">{_us(s.get("default_us"))}</td>'
            f'<td class="num">{f"{speed:.2f}×" if speed else "–"}</td>'
            f'<td class="num">{len(rec.get("candidates", []))}</td>'
            f'<td class="num">{nfail}</td></tr>')
        body = [f'<div class="card" id="e{i}"><h2>{_esc(s["kernel"])} '
                f'<span class="{_esc(st)}">· {_esc(st)}</span></h2>'
                f'<div class="wl">{_esc(_workload(rec, s.get("workload", "")))}</div>']
        if s.get("note"):
            body.append(f"<p>{_esc(s['note'])}</p>")
        if rec:
            d = rec.get("default", {})
            verdict = ""
            if rec.get("mean_us") and d.get("mean_us"):
                gain = (d["mean_us"] - rec["mean_us"]) / d["mean_us"] * 100
                verdict = (f" — <b>{gain:.1f}% faster</b> than the default "
                           f"({_us(d['mean_us'])} µs)" if rec["config"] != d.get("config")
                           else " — the default config is the winner")
            elif rec.get("config") and d.get("mean_us") is None:
                verdict = " — the default config could not be measured"
            if rec.get("config"):
                body.append(f'<p class="big">Winner <b>{_esc(_cfg(rec["config"]))}</b>: '
                            f'{_us(rec.get("mean_us"))} ± {_us(rec.get("ci_us"))} µs{verdict}</p>')
            body.append('<div class="legend"><span><i class="sw" style="background:'
                        f'{WINNER}"></i>winner</span><span><i class="sw" style="background:'
                        f'{DEFAULT}"></i>default config</span><span><i class="sw" '
                        f'style="background:{OTHER}"></i>other candidates</span></div>')
            body.append(chart(rec))
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
        body.append("</div>")
        cards.append("".join(body))
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
            f'<div class="meta">{head}</div>'
            "<table><tr><th>kernel</th><th>workload</th><th>status</th><th>winner</th>"
            "<th>µs</th><th>default µs</th><th>speed-up</th><th>measured</th><th>failed</th></tr>"
            + "".join(rows) + "</table>" + "".join(cards)
            + f'<script type="application/json" id="ctbuild-tune-data">{data}</script>'
            "</body></html>")


def write_report(path: Path, result: dict[str, Any]) -> tuple[Path, Path]:
    """Write the HTML page at ``path`` and the data at ``path + '.json'``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(result), encoding="utf-8")
    json_path = path.with_name(path.name + ".json")
    json_path.write_text(json.dumps(result, indent=2, default=str), encoding="utf-8")
    return path, json_path

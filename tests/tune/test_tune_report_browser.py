"""The tune report in a real headless browser: hundreds of records stay readable.

A report of 3 kernels x 40 Dim buckets (long config names, regret, ties, failures) is rendered by
Debian's chromium; a script in the page measures, after layout, every chart label against its
chart's box and every table cell against its width, and the test reads the verdict from the DOM
chromium dumps. Skips without chromium (``apt-get install chromium``)."""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

#: Runs after layout: lists every SVG text outside its SVG's box and every clipped table cell.
CHECK = """<script>
window.addEventListener('load', () => {
  for (const d of document.querySelectorAll('details')) d.open = true;
  const bad = [];
  for (const svg of document.querySelectorAll('svg')) {
    const box = svg.getBoundingClientRect();
    for (const t of svg.querySelectorAll('text')) {
      const r = t.getBoundingClientRect();
      if (r.left < box.left - 0.5 || r.right > box.right + 0.5 || r.width === 0)
        bad.push('svg text: ' + t.textContent);
    }
  }
  for (const td of document.querySelectorAll('td, th'))
    if (td.scrollWidth > td.clientWidth + 1) bad.push('cell: ' + td.textContent);
  const out = document.createElement('pre');
  out.id = 'verdict';
  out.textContent = JSON.stringify({bad: bad, svgs: document.querySelectorAll('svg').length,
                                    width: document.documentElement.scrollWidth});
  document.body.appendChild(out);
});
</script>"""


def many_records() -> dict:
    entries = []
    for k, kernel in enumerate(("attention_with_a_long_kernel_name", "rmsnorm", "silu_mul")):
        for b in range(40):
            cfg = {"BLOCK_M": 64 << (b % 3), "BLOCK_N": 128, "BLOCK_K": 32 + k,
                   "num_ctas": 1 + b % 2, "occupancy": 2, "num_worker_warps": 4}
            default = {**cfg, "BLOCK_M": 64}
            rec = {"kernel": kernel, "config": cfg, "mean_us": 10.0 + b, "ci_us": 0.2,
                   "default": {"config": default, "mean_us": 11.0 + b, "ci_us": 0.3},
                   "workload": {"X": {"tensor": [1 << (b % 14), 8192], "dtype": "bfloat16",
                                      "strides": [8192, 1], "align": 256}},
                   "candidates": [{"config": c, "mean_us": 10.0 + b + i, "ci_us": 0.2,
                                   "samples": 25} for i, c in enumerate((cfg, default))],
                   "choice": {"rule": "first in space order among ties",
                              "band": {"percent": 2.0, "ci_overlap": True},
                              "ties": [{"config": cfg, "mean_us": 10.0 + b, "ci_us": 0.2,
                                        "samples": 25}]},
                   "runoff": {"rounds": 7, "stopped": "decided", "finalists": []},
                   "regret": {"bucket": {"TOKENS_IN_A_BATCH": 1 << b % 14},
                              "sizes": [{"sizes": {"TOKENS_IN_A_BATCH": 3}, "regret_pct": 4.2,
                                         "fastest": default, "winner_us": 1, "fastest_us": 1}],
                              "max_pct": 4.2, "problems": []},
                   "failures": [{"config": default, "error": "RuntimeError: " + "x" * 300}],
                   "space": {"total": 96, "pruned": 48, "kept": 24}, "tuning_key": [b]}
            entries.append({"kernel": kernel, "workload": "X=...", "status": "tuned",
                            "winner": cfg, "mean_us": 10.0 + b, "ci_us": 0.2,
                            "default_us": 11.0 + b, "speedup_vs_default": (11.0 + b) / (10.0 + b),
                            "failures": rec["failures"], "record": rec})
    return {"gpu": "NVIDIA H100 80GB HBM3", "arch": "sm_90", "driver": "580", "toolchain": "f",
            "cache": "/cache", "tuned": 120, "skipped": 0, "failed": 0, "seconds": 3.0,
            "entries": entries}


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium: apt-get install chromium")
def test_report_of_120_records_has_no_clipped_label(tmp_path):
    from ctbuild.tune.report import render_html
    page = render_html(many_records()).replace("</body>", CHECK + "</body>")
    path = tmp_path / "report.html"
    path.write_text(page, encoding="utf-8")
    r = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                        "--disable-quic", "--no-first-run", "--disable-background-networking",
                        "--disable-component-update", "--disable-sync",
                        f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,900",
                        "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120)
    dom = r.stdout
    assert 'id="verdict"' in dom, r.stderr[-2000:]
    verdict = json.loads(dom.split('id="verdict">', 1)[1].split("</pre>", 1)[0]
                         .replace("&quot;", '"').replace("&amp;", "&"))
    assert verdict["bad"] == [], verdict["bad"][:10]
    assert verdict["svgs"] == 3 + 120          # a winners chart per kernel, one per record
    assert verdict["width"] <= 1280            # no horizontal scrolling at this width

"""Driver-side rendering for ``ctbuild precompile``: a progress bar and the summary table.

On a terminal: one bar redrawn in place (done/total, rate, ETA, failures). Otherwise (CI logs,
``docker build``): a plain line every few seconds and one at the end, never a carriage return.
"""
from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, Iterable, TextIO

BAR_WIDTH = 28


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    """Counts finished jobs and draws them; feed it `record` per job and `tick` while waiting."""

    def __init__(self, total: int, stream: TextIO, *, tty: bool | None = None,
                 interval: float = 5.0, enabled: bool = True) -> None:
        self.total = total
        self.stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self.interval = interval
        self.enabled = enabled
        self.done = self.failed = self.cached = 0
        self.start = time.monotonic()
        self.work_start: float | None = None  # when the first worker was ready to compile
        self._last_line = self.start
        self._last_draw = 0.0
        self._phase = ""
        self._drawn = False
        self._last_done = -1

    def phase(self, text: str) -> None:
        """A status shown until the first job finishes (e.g. 'starting 8 workers')."""
        self._phase = text
        if not self.enabled:
            return
        if self.tty:
            self._draw(force=True)
        else:
            self._write(f"precompile: {text}\n")

    def workers_ready(self) -> None:
        """Compiling starts now: the rate and ETA count from here, not from Ray's start-up."""
        if self.work_start is None:
            self.work_start = time.monotonic()

    def record(self, rec: Any) -> None:
        self.done += 1
        if rec.status == "failed":
            self.failed += 1
        elif rec.status == "cached":
            self.cached += 1
        self._phase = ""
        self.tick(force=self.done == self.total)

    def tick(self, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if self.tty:
            if force or now - self._last_draw >= 0.1:
                self._draw()
        elif force or now - self._last_line >= self.interval:
            self._last_line = now
            self._last_done = self.done
            self._write(f"precompile: {self.status_text()}\n")

    def status_text(self) -> str:
        pct = 100.0 * self.done / self.total if self.total else 100.0
        text = f"{self.done}/{self.total} ({pct:.0f}%)"
        worked = self.done - self.cached
        now = time.monotonic()
        elapsed = now - self.start
        working = now - self.work_start if self.work_start is not None else 0.0
        if worked > 0 and working > 0:
            rate = worked / working
            text += f"  {rate:.1f} cfg/s"
            if self.done < self.total:
                text += f"  ETA {_duration((self.total - self.done) / rate)}"
        text += f"  elapsed {_duration(elapsed)}"
        if self.failed:
            text += f"  failed {self.failed}"
        if self._phase:
            text += f"  ({self._phase})"
        return text

    def _draw(self, force: bool = False) -> None:
        self._last_draw = time.monotonic()
        filled = int(BAR_WIDTH * self.done / self.total) if self.total else BAR_WIDTH
        bar = "#" * filled + "-" * (BAR_WIDTH - filled)
        self._write(f"\r\x1b[Kprecompile [{bar}] {self.status_text()}")
        self._drawn = True

    def close(self) -> None:
        if not self.enabled:
            return
        if self.tty and self._drawn:
            self._draw()
            self._write("\n")
        elif not self.tty and self.done and self._last_done != self.done:
            self._write(f"precompile: {self.status_text()}\n")

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()


def kernel_summary(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per-kernel counts from per-job rows (``kernel``, ``status``, ``seconds``)."""
    table: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"jobs": 0, "compiled": 0, "cached": 0, "failed": 0, "compile_seconds": 0.0})
    for row in rows:
        t = table[row["kernel"]]
        t["jobs"] += 1
        t[row["status"]] += 1
        t["compile_seconds"] += row.get("seconds") or 0.0
    out = []
    for name, t in table.items():
        t["compile_seconds"] = round(t["compile_seconds"], 3)
        t["mean_seconds"] = round(t["compile_seconds"] / t["compiled"], 3) if t["compiled"] else None
        out.append({"kernel": name, **t})
    return out


def render_summary(kernels: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    """The human summary printed at the end of a precompile: failures one line per cause
    (``summary["causes"]``, `ctbuild.compile.failures`)."""
    from .failures import cause_line
    lines = [f"{'kernel':<20} {'jobs':>5} {'compiled':>9} {'cached':>7} {'failed':>7} "
             f"{'compile s':>10} {'mean s':>7}"]
    for k in kernels:
        mean = f"{k['mean_seconds']:.3f}" if k["mean_seconds"] is not None else "-"
        lines.append(f"{k['kernel']:<20} {k['jobs']:>5} {k['compiled']:>9} {k['cached']:>7} "
                     f"{k['failed']:>7} {k['compile_seconds']:>10.2f} {mean:>7}")
    where = summary.get("address") or "embedded Ray"
    workers = f"{summary['workers']} workers on {where}"
    if summary.get("farm") == "local":
        workers = f"{summary['early_workers']} local worker processes, no Ray"
    elif summary.get("early_workers"):  # local workers bridged Ray's start-up
        workers = (f"{workers}, {summary['early_workers']} local while it started"
                   if summary["workers"] else
                   f"{summary['early_workers']} local worker"
                   f"{'s' if summary['early_workers'] > 1 else ''} while the {where} started")
    how = f"{workers}; start-up {summary['startup_seconds']:.1f}s"
    if not summary["workers"] and not summary.get("early_workers"):
        how = "nothing to compile: no worker started"
    lines.append("")
    lines.append(
        f"{summary['jobs']} jobs: {summary['compiled']} compiled, {summary['cached']} cached, "
        f"{summary['failed']} failed in {summary['seconds']:.1f}s ({how}) "
        f"for {', '.join(summary['archs'])}; cache {summary['cache']}")
    if causes := summary.get("causes"):
        lines.append("")
        lines.append(f"FAILED ({summary['failed']} jobs, {len(causes)} "
                     f"cause{'s' if len(causes) > 1 else ''}):")
        lines += [f"  {cause_line(c)}" for c in causes]
        lines.append("failed configs are not cached; fix or prune them (or pass "
                     "--allow-failures to exit 0), then run precompile again")
    if summary.get("fatal"):
        lines.append("")
        lines.append(f"ABORTED: {summary['fatal']}")
    return "\n".join(lines)

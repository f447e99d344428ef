"""What a miss says and where it is counted: the messages naming the fix, the per-process miss
counts (each key logged once), and the ``CTBUILD_RECORD`` file of distinct misses that
``ctbuild precompile --from-record FILE`` builds from. What a miss *does* is `miss_policy`'s."""
from __future__ import annotations

import json
import logging
import os
import stat
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..records import MissRecord
from ..specs import spec_to_json

log = logging.getLogger("ctbuild.runtime")

#: Bytes at the end of an existing record file the first miss reads to skip lines already
#: recorded: a bound, so a huge or endless file costs the serving path no more than this.
RECORD_TAIL_BYTES = 2**20

#: Cache directories a read failed on (damaged index or value file) -> what failed; filled by the
#: runtime context from its store, read by the miss messages so strict mode says why it missed.
_DAMAGED: dict[Path, str] = {}


def note_damage(cache_dir: Path, detail: str | None) -> None:
    """Record (``detail``) or forget (None: a fresh context) that a cache is damaged."""
    if detail is None:
        _DAMAGED.pop(Path(cache_dir), None)
    else:
        _DAMAGED[Path(cache_dir)] = detail


def damage_note(cache_dir: Path) -> str:
    """A closing line saying the cache is damaged and how to repair it ('' when it is not)."""
    detail = _DAMAGED.get(Path(cache_dir))
    if detail is None:
        return ""
    return (f"\n  The cache is DAMAGED ({detail}): that is why this lookup missed. Repair it with "
            f"`ctbuild cache verify --repair --cache {cache_dir}`, then `ctbuild precompile` rebuilds "
            "what was lost.")


def _short(text: str, n: int = 16) -> str:
    return text if len(text) <= n else text[:n]


def tuning_miss_message(*, kernel: str, module: str, tuning_key: Any, arch: str, gpu: str,
                        key: str, toolchain_fp: str | None, cache_dir: Path,
                        workload: dict[str, Any]) -> str:
    where = (f"toolchain {_short(toolchain_fp)}" if toolchain_fp else
             "no toolchain recorded in the cache for this cuda-tile version and env")
    return (
        f"ctbuild: no tuning record for kernel {kernel!r} ({module}) on {arch} ({gpu}): "
        f"tuning key {json.dumps(tuning_key)}, record key {key}, {where}, cache {cache_dir}.\n"
        f"  workload: {json.dumps(workload)}\n"
        f"  Fix: add this workload to the kernel's workloads=[...] (or record misses with "
        f"CTBUILD_RECORD=misses.jsonl and use `ctbuild precompile --from-record misses.jsonl "
        f"--arch {arch}`), then run `ctbuild precompile --config ctbuild.toml --arch {arch}` "
        f"and `ctbuild tune --config ctbuild.toml` on a {gpu} with CTBUILD_CACHE_DIR="
        f"{cache_dir}.\n"
        f"  Or set CTBUILD_MODE=default (default config, JIT) or CTBUILD_MODE=tune (tune online)."
        + damage_note(cache_dir))


def cubin_miss_message(*, kernel: str, module: str, config: Any, arch: str, key: str,
                       toolchain_fp: str | None, cache_dir: Path, workload: dict[str, Any] | None,
                       why: str = "") -> str:
    where = (f"toolchain {_short(toolchain_fp)}" if toolchain_fp else
             "no toolchain recorded in the cache for this cuda-tile version and env")
    shown = f"\n  workload: {json.dumps(workload)}" if workload is not None else ""
    return (
        f"ctbuild: no CUBIN in the cache for kernel {kernel!r} ({module}) config "
        f"{json.dumps(config)} on {arch}: compile key {key}, {where}, cache {cache_dir}"
        f"{' (' + why + ')' if why else ''}.{shown}\n"
        f"  Fix: `ctbuild precompile --config ctbuild.toml --arch {arch}` with CTBUILD_CACHE_DIR="
        f"{cache_dir} (add this workload to workloads=[...], or record misses with "
        f"CTBUILD_RECORD=misses.jsonl and use `ctbuild precompile --from-record misses.jsonl "
        f"--arch {arch}`).\n"
        f"  Or set CTBUILD_MODE=default to JIT-compile it (needs tileiras)." + damage_note(cache_dir))


@dataclass
class MissLog:
    """Counts every miss, logs each key once, appends distinct misses to the record file."""
    record: Path | None = None
    counts: Counter = field(default_factory=Counter)
    _logged: set = field(default_factory=set)
    _recorded: set | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, what: str, kernel: str, key: str, message: str,
             workload: dict[str, Any] | None, arch: str) -> None:
        """Count and log a miss, and record its workload (when known) for the next build."""
        self.miss(what, kernel, key, message)
        if workload is not None:
            self.write_record(kernel, workload, arch)

    def miss(self, what: str, kernel: str, key: str, message: str) -> bool:
        """Count a miss; log it the first time this (what, kernel, key) is seen. Returns
        whether it was the first time."""
        with self._lock:
            self.counts[(kernel, what)] += 1
            first = (what, kernel, key) not in self._logged
            self._logged.add((what, kernel, key))
        if first:
            log.warning("%s", message.splitlines()[0])
        return first

    def write_record(self, kernel: str, workload: dict[str, Any], arch: str) -> bool:
        """Append ``{"kernel", "workload", "arch"}`` once per distinct triple (also across
        processes appending to the same file: lines already near its end are not repeated).
        Workloads that differ only in what cannot change the CUBIN (alignment >= 16 bytes,
        scalar example values) count as one: the first one seen is written. A record path that
        is not a regular file is refused at the first miss with one error line; the process
        serves on without recording."""
        if self.record is None:
            return False
        line = json.dumps(MissRecord(kernel, workload, arch).to_json())
        canon = _canonical_line(line)
        with self._lock:
            if self._recorded is not None and canon in self._recorded:
                return False
            try:
                fd = _open_record(self.record)
            except _NotARecordFile as exc:
                log.error("ctbuild: CTBUILD_RECORD=%s: %s; misses are not recorded by this process",
                          self.record, exc)
                self.record = None
                return False
            except OSError as exc:
                log.error("ctbuild: cannot append to CTBUILD_RECORD=%s: %s", self.record, exc)
                return False
            try:
                return self._append(fd, line, canon)
            finally:
                os.close(fd)

    def _append(self, fd: int, line: str, canon: str) -> bool:
        """Write ``line`` unless the file's end holds it already (read once, at the first miss)."""
        if self._recorded is None:
            self._recorded = _tail_lines(fd)
            if canon in self._recorded:
                return False
        self._recorded.add(canon)
        try:
            os.write(fd, (line + "\n").encode())
        except OSError as exc:
            log.error("ctbuild: cannot append to CTBUILD_RECORD=%s: %s", self.record, exc)
            return False
        return True

    def total(self, kernel: str | None = None) -> dict[str, int]:
        with self._lock:
            out: Counter = Counter()
            for (k, what), n in self.counts.items():
                if kernel is None or k == kernel:
                    out[what] += n
            return dict(out)


class _NotARecordFile(Exception):
    """The record path names a FIFO, a device or a directory: nothing is written to it."""


def _open_record(path: Path) -> int:
    """A descriptor appending to (and reading) the record file, created if absent. Only a
    regular file (or a link to one) is opened: a FIFO would block the serving thread until
    someone reads it, a device such as /dev/zero has no end to read. The check is
    `ctbuild.cache.user_files`' (imported here: only a process that records needs it); the
    open does not block on a FIFO swapped in after it (O_NONBLOCK), which fstat then refuses."""
    from ctbuild.cache.user_files import NotAFileError, file_target
    try:
        target = file_target(path)[0]
    except NotAFileError as exc:
        raise _NotARecordFile(str(exc)) from None
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY
                 | os.O_CLOEXEC, 0o644)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _NotARecordFile(f"{path} is not a regular file; give the path of one")
    return fd


def _tail_lines(fd: int) -> set[str]:
    """The canonical lines in the last `RECORD_TAIL_BYTES` of the record file: the first miss
    reads that much at most, whatever the file's size (a line cut by the start is skipped;
    one older than the tail may be written again, and --from-record deduplicates it)."""
    size = os.fstat(fd).st_size
    start = max(0, size - RECORD_TAIL_BYTES)
    lines = os.pread(fd, size - start, start).split(b"\n")[1 if start else 0:]
    return {_canonical_line(raw.decode("utf-8", "replace")) for raw in lines if raw.strip()}


def _canonical_line(text: str) -> str:
    """What makes two record lines the same miss: alignments of 16 bytes or more are one
    (the launch signature only sees pointer % 16), scalar example values do not count."""
    try:
        return json.dumps(_compile_relevant(json.loads(text)), sort_keys=True)
    except ValueError:
        return text.strip()


def _compile_relevant(value: Any) -> Any:
    if isinstance(value, dict):
        out = {k: _compile_relevant(v) for k, v in value.items()
               if not (k == "example" and "scalar" in value)}
        if "tensor" in out and isinstance(out.get("align"), int):
            out["align"] = min(out["align"], 16)
        return out
    if isinstance(value, list):
        return [_compile_relevant(v) for v in value]
    return value


def workload_json(spec_workload: Mapping[str, Any]) -> dict[str, Any]:
    """A workload of specs as the record file and the miss messages write it."""
    return {name: spec_to_json(v) for name, v in spec_workload.items()}

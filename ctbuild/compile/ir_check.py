"""The backstop behind the kernel fingerprint: before a build or a tune relies on a cached CUBIN,
derive its TileIR again from these sources and compare with the digest recorded when it was
compiled.

The compile key trusts the kernel fingerprint: equal fingerprints must mean equal compiled code.
When the fingerprint misses something the code depends on (a hole), an edit keeps the key and
the cache would serve the old CUBIN. cuTile's front end sees everything the code depends on, so
its output, anonymized (`ctbuild.tileir`), tells: a different digest is a hole. The entry is
removed (the build compiles it again) and a warning names the kernel, the hole and the project
modules changed since the last check.

Cost: ~10 ms of front end per entry, spread over helper processes (`ir_derive`). A check is
remembered (``ctbuild-ir-checked.json`` in the cache directory) per project, under a digest of
the state the front end reads: every project module's source file (by location, as the
fingerprint tells a project module from a library; not the program's entry point), the
installed distributions, the toolchain and ctbuild's version. While that state holds, an entry
verified (or compiled) with the same recorded digest is not derived again; any edit to a
project file derives every entry again, whatever the fingerprint says. A kernel whose identity
rests on its TileIR (`ctbuild.fingerprint.by_tileir`: it reads environment variables, data
files or installed code the fingerprint cannot follow) is remembered under what it reads too
(`ByTileIR.state`: the variables' values, the files' contents), and never where it reads
something it cannot name.
An entry without a recorded digest (a cache written before digests were) is unverifiable:
nothing tells what code it is, so it is rebuilt.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection, Iterable, Sequence

import xxhash

from .. import __version__
from ..declare import registered
from ..fingerprint import by_tileir, is_project_module
from ..records import CompileMeta, RecordFormatError
from ..tileir import TILEIR_FORMAT
from ..user_code import LIBRARY_DIRS
from .ir_derive import Setup, derive_all

MEMO_FILE = "ctbuild-ir-checked.json"
MEMO_FORMAT = 1
#: A memo larger than this is ignored (a shared cache is not trusted with our memory).
MEMO_MAX_BYTES = 64 << 20
#: Projects one cache remembers checks for (the least recently checked are dropped).
MEMO_PROJECTS = 16
#: The names a running program's entry point has in ``sys.modules``.
ENTRY_POINTS = ("__main__", "__mp_main__")


@dataclass
class IrCheck:
    """What one check found. ``mismatches``: entries whose recorded TileIR these sources do not
    give, or that record none (``unverifiable`` counts those): removed when the check
    rebuilds."""
    relied_on: int = 0
    derived: int = 0
    remembered: int = 0
    unverifiable: int = 0
    stale: int = 0
    mismatches: list[dict[str, Any]] = field(default_factory=list)
    changed_modules: list[str] | None = None
    helpers: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {k: (round(v, 3) if isinstance(v, float) else v)
                for k, v in self.__dict__.items()}

    def warnings(self) -> list[str]:
        """One line per mismatched kernel and config: what it is and what to do. A marked
        kernel's mismatch is expected (what it reads changed); any other is a hole."""
        changed = ", ".join(self.changed_modules or []) or (
            "none recorded" if self.changed_modules is not None else "unknown (no earlier check)")
        lines = []
        for m in self.mismatches:
            head = (f"kernel {m['kernel']} ({m['module']}) config {json.dumps(m['config'])} "
                    f"{m['arch']}: its cached CUBIN {m['key'][:16]}")
            if m.get("unrecorded"):
                lines.append(f"note: {head} records no TileIR digest (a cache written before "
                             "they were), so nothing tells what code it is; rebuilding it.")
                continue
            if m.get("marked"):
                lines.append(f"note: {head} is not what these sources and this environment "
                             f"compile to ({m['why']}; {m['marked']}); rebuilding it.")
                continue
            lines.append(
                f"warning: {head} was built from other code than these sources compile to "
                f"({m['why']}), but its fingerprint did not change: a fingerprint hole (the "
                f"kernel depends on something its fingerprint misses; project modules changed "
                f"since the last check: {changed}); rebuilding it. Please report the edit that "
                "caused it.")
        return lines


def source_state(toolchain_fp: str, declared: Sequence[str] = ()) -> tuple[str, dict[str, str]]:
    """(digest of what the front end reads besides the kernel fingerprint, per-module digests):
    the source of every loaded project module, the installed distributions, the toolchain.

    Not the entry point (``__main__``, and ``__mp_main__``, multiprocessing's name for it),
    unless the project ``declared`` it: a project's kernels come from its declared modules,
    and counting the entry point made every check started another way (``ctbuild tune``
    after a ``precompile`` whose local farm adds ``__mp_main__``, a script) derive every
    entry again. Nor a module whose file is a bare name with no import spec (``torch.ops``):
    no file of the project's."""
    modules: dict[str, str] = {}
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if not file or not is_project_module(module):
            continue
        if name in ENTRY_POINTS and name not in declared:
            continue
        if getattr(module, "__spec__", None) is None and not os.path.isabs(file):
            continue
        try:
            modules[name] = xxhash.xxh3_128_hexdigest(Path(file).read_bytes())
        except OSError as exc:
            modules[name] = f"unreadable: {exc.errno}"
    dists: list[str] = []
    for where in sorted(set(LIBRARY_DIRS)):
        try:
            dists += [n for n in os.listdir(where) if n.endswith((".dist-info", ".egg-info"))]
        except OSError:
            continue
    state = json.dumps([TILEIR_FORMAT, __version__, toolchain_fp, sorted(modules.items()),
                        sorted(dists)])
    return xxhash.xxh3_128_hexdigest(state.encode()), modules


class Memo:
    """The checks remembered in one cache directory, for one project."""

    def __init__(self, cache_dir: Path, project: str) -> None:
        self.path = Path(cache_dir) / MEMO_FILE
        self.project = project
        self.all = self._load()
        mine = self.all.get(project)
        self.mine: dict[str, Any] = mine if isinstance(mine, dict) else {}

    def _load(self) -> dict[str, Any]:
        try:
            if self.path.stat().st_size > MEMO_MAX_BYTES:
                return {}
            found = json.loads(self.path.read_text())
        except (OSError, ValueError, RecursionError):
            return {}
        if not isinstance(found, dict) or found.get("format") != MEMO_FORMAT or \
                not isinstance(found.get("projects"), dict):
            return {}
        return dict(found["projects"])

    def verified(self, state: str) -> dict[str, str]:
        """Key -> recorded digest of the entries verified under ``state``."""
        got = self.mine.get("verified") if self.mine.get("state") == state else None
        return {k: v for k, v in got.items() if isinstance(v, str)} if isinstance(got, dict) \
            else {}

    def changed_modules(self, modules: dict[str, str]) -> list[str] | None:
        before = self.mine.get("modules")
        if not isinstance(before, dict):
            return None
        return sorted(n for n in set(before) | set(modules) if before.get(n) != modules.get(n))

    def save(self, state: str, modules: dict[str, str], verified: dict[str, str]) -> None:
        """Remember ``verified`` under ``state`` (atomically; a cache we cannot write just
        checks again next time)."""
        self.all[self.project] = {"state": state, "modules": modules, "verified": verified,
                                  "time": time.time()}
        newest = sorted(self.all, key=lambda p: -float(self.all[p].get("time", 0))
                        if isinstance(self.all[p], dict) else 0.0)[:MEMO_PROJECTS]
        doc = {"format": MEMO_FORMAT, "projects": {p: self.all[p] for p in newest}}
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{MEMO_FILE}.", dir=self.path.parent)
        except OSError:
            return
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f)
            os.replace(tmp, self.path)
        except OSError:
            Path(tmp).unlink(missing_ok=True)


class IrGuard:
    """The check as a build or a tune runs it: `check` the cached entries it relies on before
    it compiles what is missing, `remember` what it compiled afterwards."""

    def __init__(self, cache_dir: Path, modules: Sequence[str], paths: Sequence[str],
                 toolchain_fp: str, bytecode_version: str | None) -> None:
        self.setup = Setup([str(p) for p in paths], list(modules), toolchain_fp,
                           bytecode_version)
        project = xxhash.xxh3_128_hexdigest(json.dumps(sorted(modules)).encode())
        self.memo = Memo(cache_dir, project)
        self.state, self.modules = source_state(toolchain_fp, modules)
        self.verified = self.memo.verified(self.state)
        self.marked = _marked()

    def _memo_value(self, job: dict[str, Any], digest: str) -> str | None:
        """What the memo holds for a verified entry: its recorded digest, and for a marked
        kernel the state of what it reads (None: it reads what it cannot name; never
        remembered)."""
        marked = self.marked.get(_kernel_of(job))
        if marked is None:
            return digest
        return None if marked[1] is None else f"{digest} {marked[1]}"

    def check(self, store: Any, jobs: Iterable[dict[str, Any]], workers: int | None = None,
              rebuild: bool = True) -> IrCheck:
        """Check every job whose key ``store`` holds; with ``rebuild``, remove the entries
        that mismatch (the caller then compiles them as missing)."""
        started = time.perf_counter()
        report = IrCheck()
        stored = dict(store.compile_entries())
        todo, recorded = [], {}
        for job in jobs:
            if job["key"] not in stored:
                continue
            report.relied_on += 1
            digest = _recorded(stored[job["key"]])
            if digest is None:
                report.unverifiable += 1
                report.mismatches.append({**self._naming(job), "unrecorded": True,
                                          "why": "no TileIR digest recorded"})
            elif (memo := self._memo_value(job, digest)) and self.verified.get(job["key"]) == memo:
                report.remembered += 1
            else:
                todo.append(job)
                recorded[job["key"]] = digest
        results, report.helpers = derive_all(todo, self.setup, workers) if todo else ({}, 0)
        for job in todo:
            found = results.get(job["key"], {"error": "not derived"})
            self._compare(job, recorded[job["key"]], found, report)
        if report.mismatches:
            report.changed_modules = self.memo.changed_modules(self.modules)
            if rebuild:
                for m in report.mismatches:
                    store.remove_kernel(m["kernel"], m["key"])
        report.derived = len(todo) - report.stale
        self.memo.save(self.state, self.modules, self.verified)
        report.seconds = time.perf_counter() - started
        return report

    def settled(self, store: Any, arch: str, kernels: Collection[tuple[str, str]]) -> bool:
        """Whether every entry ``store`` holds of ``kernels`` ((module, kernel) pairs) for
        ``arch`` under this toolchain is one this memo verified under these sources: then
        `check` has nothing to do on any plan of them. A tune asks before it plans: planning
        its jobs (cuTile's name mangling for every candidate) was most of its check, about a
        second of its start on an H200 host, spent to find nothing to derive."""
        fp = self.setup.toolchain
        for key, meta in store.compile_entries():
            if _kernel_of(meta) not in kernels or meta.get("arch", arch) != arch or \
                    meta.get("toolchain", fp) != fp:  # one saying nothing must be verified
                continue
            digest = _recorded(meta)
            memo = self._memo_value(meta, digest) if digest is not None else None
            if memo is None or self.verified.get(key) != memo:
                return False
        return True

    def _compare(self, job: dict[str, Any], recorded: str, found: dict[str, Any],
                 report: IrCheck) -> None:
        if found.get("stale"):
            report.stale += 1
        elif found.get("digest") == recorded:
            self._remember(job, recorded)
        else:
            why = (f"recorded TileIR {recorded[:16]}, now {found['digest'][:16]}"
                   if "digest" in found else f"the front end now fails: {found.get('error')}")
            report.mismatches.append({**self._naming(job), "why": why})
            self.verified.pop(job["key"], None)

    def _naming(self, job: dict[str, Any]) -> dict[str, Any]:
        """What a mismatch says of its job (``marked``: why its identity rests on its TileIR,
        when it does)."""
        marked = self.marked.get(_kernel_of(job))
        return {**{k: job[k] for k in ("kernel", "module", "config", "arch", "key")},
                "marked": marked and marked[0]}

    def _remember(self, job: dict[str, Any], digest: str) -> None:
        if (memo := self._memo_value(job, digest)) is not None:
            self.verified[job["key"]] = memo
        else:
            self.verified.pop(job["key"], None)

    def remember(self, store: Any, keys: Iterable[str]) -> None:
        """Remember entries compiled from these sources (their recorded digest is this
        state's by construction) so the next run does not derive them again."""
        wanted = set(keys)
        if not wanted:
            return
        for key, meta in store.compile_entries():
            if key in wanted and (digest := _recorded(meta)) is not None:
                self._remember({"key": key, "module": meta.get("module"),
                                "kernel": meta.get("kernel")}, digest)
        self.memo.save(self.state, self.modules, self.verified)


def _kernel_of(job: dict[str, Any]) -> tuple[str, str]:
    """(module, kernel) of a job or an entry's metadata."""
    return str(job.get("module") or ""), str(job.get("kernel") or "")


def _marked() -> dict[tuple[str, str], tuple[str, str | None]]:
    """(module, kernel) -> (why its identity rests on its TileIR, the state of what it reads:
    `ByTileIR.state`), for each declared kernel so marked; one that fails its fingerprint is
    not marked (the build reports it)."""
    found: dict[tuple[str, str], tuple[str, str | None]] = {}
    for tuned in registered():
        try:
            marks = by_tileir(tuned)
        except Exception:  # noqa: BLE001 - see the docstring
            continue
        if marks is not None:
            found[(tuned.module, tuned.name)] = (marks.note, marks.state())
    return found


def _recorded(meta: dict[str, Any]) -> str | None:
    """The entry's recorded TileIR digest when it is one this ctbuild derives, else None."""
    try:
        digest, fmt = CompileMeta.from_json(meta).tileir_digest
    except RecordFormatError:
        return None
    return digest if fmt == TILEIR_FORMAT else None


def check_cached(cache_dir: Path, modules: Sequence[str], paths: Sequence[str],
                 toolchain_fp: str, jobs: Iterable[dict[str, Any]], workers: int | None,
                 bytecode_version: str | None = None,
                 settled: tuple[str, Collection[tuple[str, str]]] | None = None
                 ) -> tuple[IrGuard, IrCheck]:
    """The check ``precompile`` and ``tune`` run on the cached entries they rely on (``jobs``:
    `CompileJob` JSON): warnings on stderr, mismatched entries removed so the caller compiles
    them again as missing. ``bytecode_version`` None: the one the cache's profile of
    ``toolchain_fp`` records (a tuning node needs no tileiras for it). ``settled`` (an arch,
    (module, kernel) pairs): nothing is checked, and ``jobs`` is never iterated, where every
    entry of those kernels for that arch is verified under these sources (`IrGuard.settled`):
    ``tune`` passes its plan lazily, so it plans nothing where nothing changed. Afterwards a
    build hands the keys it compiled to `remember_build`."""
    from ctbuild.cache import Store
    with Store(cache_dir, readonly=False) as store:
        if bytecode_version is None:
            bytecode_version = (store.get_toolchain(toolchain_fp) or {}).get("bytecode_version")
        guard = IrGuard(cache_dir, modules, paths, toolchain_fp, bytecode_version)
        if settled is not None and guard.settled(store, *settled):
            return guard, IrCheck()
        report = guard.check(store, jobs, workers)
    for line in report.warnings():
        print(line, file=sys.stderr)
    return guard, report


def remember_build(guard: IrGuard, cache_dir: Path, compiled: Iterable[str]) -> None:
    """After the build: remember the entries it compiled (see `IrGuard.remember`)."""
    from ctbuild.cache import Store
    with Store(cache_dir, readonly=False) as store:
        guard.remember(store, compiled)


__all__ = ["IrCheck", "IrGuard", "MEMO_FILE", "check_cached", "remember_build",
           "source_state"]

"""``ctbuild cache prune``: remove the entries of kernel versions the project no longer plans."""
from __future__ import annotations

import argparse
import time
from typing import Any

from ..project import load_project
from .common import fail, guarded, print_json


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds)) if seconds else "unknown"


def _size(n: int) -> str:
    return f"{n} B" if n < 1024 else f"{n / 1024:.1f} KiB" if n < 1 << 20 else \
        f"{n / (1 << 20):.1f} MiB"


@guarded
def run_prune(args: argparse.Namespace) -> int:
    from ctbuild.cache import ReadOnlyCacheError, Store

    from ..compile.prune import plan_prune

    project = load_project(args.config, cache_dir=args.cache_dir)
    if not project.cache_dir.is_dir():
        return fail(f"no cache at {project.cache}: pass --cache DIR or set CTBUILD_CACHE_DIR")
    planned = {k.name: k.fingerprint for k in project.kernels()}
    try:
        with Store(project.cache_dir, readonly=True if args.dry_run else False) as store:
            plan = plan_prune(planned, store.compile_entries(), store.tuning_records(),
                              args.keep)
            removed = store.drop(plan.compile_keys, plan.tuning_keys, dry_run=args.dry_run)
    except ReadOnlyCacheError:
        return fail(f"cache {project.cache} is read-only here: prune removes entries, so run it "
                    "where the cache is writable (or add --dry-run)")
    report: dict[str, Any] = {
        "cache": str(project.cache), "dry_run": args.dry_run, "keep": args.keep,
        "kept": {k: [v.to_json() for v in vs] for k, vs in plan.kept.items()},
        "dropped": [v.to_json() for v in plan.dropped], "removed": removed,
        "undeclared": plan.undeclared, "unversioned": plan.unversioned}
    if args.json:
        print_json(report)
        return 0
    lines = [f"cache: {project.cache}"]
    for kernel, versions in plan.kept.items():
        kept = ", ".join(f"{v.fingerprint[:12]}" + (" (planned)" if v.fingerprint ==
                                                    planned[kernel] else f" ({_when(v.newest)})")
                         for v in versions)
        gone = [v for v in plan.dropped if v.kernel == kernel]
        lines.append(f"{kernel}: keep {kept}" + "".join(
            f"; {'would remove' if args.dry_run else 'remove'} {v.fingerprint[:12]} "
            f"({_when(v.newest)}: {len(v.compile_keys)} compile entries, "
            f"{len(v.tuning_keys)} tuning records)" for v in gone))
    if plan.undeclared:
        lines.append(f"left alone: entries of kernels {', '.join(sorted(plan.undeclared))} "
                     f"({sum(plan.undeclared.values())}), which {project.where} does not declare")
    if plan.unversioned:
        lines.append(f"left alone: {plan.unversioned} entries that record no kernel fingerprint "
                     "(written by hand or by an older ctbuild)")
    verb = "would remove" if args.dry_run else "removed"
    lines.append(f"{verb} {removed['compile_entries']} compile entries, "
                 f"{removed['tuning_records']} tuning records, {removed['blobs']} CUBINs "
                 f"({_size(removed['bytes'])})" + (" (dry run: nothing removed)" if args.dry_run
                                                   else ""))
    print("\n".join(lines))
    return 0

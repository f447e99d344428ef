"""``ctbuild doctor``: is this machine able to build, tune or serve, and if not, why."""
from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

from .. import cutile, settings
from ..toolchain import (
    ToolchainError,
    cuda_home_problem,
    cutile_version,
    find_tileiras,
    probe,
    recorded_mismatch,
    select_recorded,
    stripped_env_vars,
)
from .common import fail, print_json

EPILOG = """\
exit status: 0 when the machine can do its job, 1 otherwise (each problem is printed).
  build machine (default): tileiras works, CUDA_HOME does not break it, the cache is writable;
    a GPU is reported, never required. CUDA_ROOT/CUDA_HOME/CUDA_PATH that ctbuild removes from
    every compile's environment (they would make tileiras use another ptxas/libnvvm) are
    reported as stripped, not as problems.
  serving node (--serving): no compiler needed; the cache exists, holds a toolchain profile
    matching this cuda-tile and env, a GPU is visible, and the CTBUILD_* variables the runtime
    reads at its first call (CTBUILD_MODE, CTBUILD_MAX_LAYOUTS, CTBUILD_VERIFY, ...) are valid.
    It also says which hot path warm calls run: the C module (ctbuild/serve/_fast_path.c) or
    the slower Python path, and why; never a problem, since both serve the same kernels.
"""


def add_parser(sub: argparse._SubParsersAction, name: str, summary: str) -> None:
    p = sub.add_parser(name, help=summary, description=summary, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", metavar="PATH", help="config file whose cache_dir to check (default: $CTBUILD_CONFIG, "
                   "else the ctbuild.toml found upward from the current directory)")
    p.add_argument("--cache", metavar="DIR", help="cache directory to check")
    p.add_argument("--module", metavar="MODULE",
                   help="a kernel module the service imports (e.g. demo_kernels.matmul): the "
                        "ctbuild.toml found upward from its folder chooses the cache, as it "
                        "does for the service")
    p.add_argument("--serving", action="store_true",
                   help="check a serving node (precompiled kernels only, no tileiras needed)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--ledger", metavar="PATH",
                   help="print the cold-start ledger a serving process wrote to PATH "
                        "(CTBUILD_LEDGER=PATH): time per phase of its first call, and the "
                        "tuning and compile seconds its cache saved")
    p.set_defaults(run=run)


def _gpu() -> dict[str, Any]:
    """GPU visibility through the CUDA driver, without torch (it may not be installed)."""
    try:
        return {"visible": True, "arch": str(cutile.current_arch(0))}
    except Exception as exc:  # no libcuda, no device: both are normal on a build machine
        return {"visible": False, "reason": str(exc).splitlines()[0] if str(exc) else
                type(exc).__name__}


def _hot_path() -> str:
    """What a warm kernel call runs here (C or Python, and why): the runtime's own check."""
    from ..serve.layout_guard import native_status
    return native_status()


def _cache_dir(args: argparse.Namespace) -> settings.CacheChoice:
    """The cache to check, chosen as every command and the runtime choose it
    (`settings.choose_cache`: --cache, CTBUILD_CACHE_DIR, the config's cache_dir, default);
    with --module, the config is looked for upward from that module's folder first, as a
    serving process looks from its first kernel's."""
    near = _module_folder(args.module) if args.module else None
    return settings.choose_cache(args.cache, config=args.config, near=near)


def _module_folder(name: str) -> Path:
    """The folder of a module's file, found on sys.path and the current directory without
    running the module (its packages are imported, as any import of it would)."""
    import importlib.util
    import sys
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin or not Path(spec.origin).is_file():
        raise settings.SettingsError(f"--module {name}: no such module here; run doctor with "
                                     "the service's PYTHONPATH, or pass --config")
    return Path(spec.origin).parent


def _writable(path: Path) -> tuple[bool, str]:
    probe_dir = path if path.exists() else next((p for p in path.parents if p.exists()), path)
    try:
        with tempfile.NamedTemporaryFile(dir=probe_dir):
            return True, "writable"
    except OSError as exc:
        return False, f"not writable: {exc.strerror}"


def _runtime_setting_problems() -> list[str]:
    """The ``CTBUILD_*`` variables a serving process reads at its first kernel call, checked
    now: a bad one would raise `RuntimeConfigError` there (the first bad one of the settings,
    and ``CTBUILD_VERIFY``)."""
    from ..serve.miss_policy import RuntimeConfigError, Settings
    problems = []
    try:
        Settings.from_env()
    except RuntimeConfigError as exc:
        problems.append(str(exc).removeprefix("ctbuild: "))
    try:
        settings.verify_mode()
    except ValueError as exc:
        problems.append(str(exc))
    return problems


def _serving_problems(cache: Path, report: dict[str, Any]) -> list[str]:
    """What would stop a serving node from launching precompiled kernels."""
    problems = _runtime_setting_problems()
    if not report["gpu"]["visible"]:
        problems.append("no GPU visible: the runtime launches on CUDA devices")
    if not cache.is_dir():
        hint = "" if not report["cache"]["from"].startswith("the default") else (
            "; a service also finds its ctbuild.toml upward from its kernels' folder: pass "
            "--module KERNEL_MODULE to check the cache that one names")
        return problems + [f"no cache at {cache}: mount it and set {settings.CACHE_DIR_ENV}"
                           f"{hint}"]
    from ctbuild.cache import CacheError, Store
    try:
        with Store(cache) as store:
            profiles = store.toolchains()
    except CacheError as exc:
        return problems + [f"cache {cache}: {exc}"]
    chosen = select_recorded(profiles)
    report["cache"]["toolchain"] = chosen
    report["cache"]["built_with"] = sorted({str(p.get("cuda_tile")) for p in profiles.values()})
    if chosen is None:
        why, fix = recorded_mismatch(profiles)
        problems.append(f"cache {cache} {why}: {fix}")
    return problems


def _ledger(args: argparse.Namespace) -> int:
    """Print a cold-start ledger file (see `ctbuild.serve.ledger`)."""
    from ..serve.ledger import format_ledger, read_ledger
    try:
        data = read_ledger(args.ledger)
    except ValueError as exc:
        return fail(str(exc))
    print_json(data) if args.json else print(format_ledger(data))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.ledger:
        return _ledger(args)
    report: dict[str, Any] = {"cuda_tile": cutile_version(), "problems": []}
    if not args.serving:  # the toolchain probe needs no torch: about 2 s sooner
        from ..cutile import load_compiler_without_torch
        load_compiler_without_torch()
    try:
        path, uses_home = find_tileiras()
        report["tileiras"] = {"path": path, "uses_cuda_home": uses_home}
        tc = probe()
        report["toolchain"] = {"fingerprint": tc.fingerprint, "paths": tc.paths,
                               "tileiras": tc.profile["tileiras"].splitlines()[-2:],
                               "bytecode_version": tc.profile["bytecode_version"],
                               "env": tc.profile["env"]}
    except ToolchainError as exc:
        if not args.serving:
            report["problems"].append(f"toolchain: {exc}")
    if (problem := cuda_home_problem()):
        report["problems"].append(problem)
    report["cuda_home"] = os.environ.get("CUDA_HOME")
    report["stripped_env"] = {v: os.environ[v] for v in stripped_env_vars() if v in os.environ}
    report["gpu"] = _gpu()
    if args.serving:  # imports torch: only where kernels are served
        report["hot_path"] = _hot_path()
    chosen = _cache_dir(args)
    cache = chosen.path
    ok, why = _writable(cache)
    report["cache"] = {"dir": str(cache), "from": chosen.why, "writable": ok, "status": why}
    if args.serving:
        report["problems"] += _serving_problems(cache, report)
    elif not ok:
        report["problems"].append(f"cache dir {cache} is {why}: precompile and tune need to "
                                  "write; serving can use it read-only")
    if args.json:
        print_json(report)
    else:
        print(f"cuda-tile      {report['cuda_tile']}")
        if "toolchain" in report:
            t = report["toolchain"]
            print(f"tileiras       {t['paths']['tileiras']}")
            print(f"ptxas          {t['paths']['ptxas']}")
            print(f"libnvvm        {t['paths']['libnvvm']}")
            print(f"version        {' '.join(t['tileiras'])}")
            print(f"bytecode       {t['bytecode_version']}")
            print(f"fingerprint    {t['fingerprint']}")
        print(f"CUDA_HOME      {report['cuda_home'] or '(unset)'}")
        for var, value in report["stripped_env"].items():
            print(f"{var:<14} {value} (stripped from compiles: tileiras uses the ptxas/libnvvm "
                  "beside it)")
        gpu = report["gpu"]
        print(f"GPU            {gpu['arch'] if gpu['visible'] else 'none (' + gpu['reason'] + ')'}")
        if "hot_path" in report:
            print(f"hot path       {report['hot_path']}")
        print(f"cache          {cache} ({chosen.why}; {why})")
        for p in report["problems"]:
            print(f"PROBLEM: {p}")
        print("ok" if not report["problems"] else f"{len(report['problems'])} problem(s)")
    return 0 if not report["problems"] else 1

"""The one place ctbuild reaches into cuTile's private API, and the check that it still fits.

ctbuild serves precompiled CUBINs through hooks cuTile does not promise to keep: the kernel
object's ``_compile`` (the dispatcher calls it on a miss of its in-memory launch cache), a
``ct.kernel``'s ``_pyfunc``, ``_annotated_function`` and ``_compiler_options``, functions of
``cuda.tile._cext``, and for the build the compiler entry points of ``cuda.tile._compile``.
They changed between cuda-tile 1.6 and 1.7, so ctbuild pins one version and `check` runs at
import: an unsupported cuda-tile fails at once, with one error naming every hook that changed,
rather than mis-launching later or being chased through the code one hook at a time.

Serve hooks are checked on the live objects. Build hooks are checked from their module's
source (names defined there), because importing cuTile's compiler costs seconds and the serve
path never needs it; `compiler` imports it when a build does.
"""
from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import inspect
from collections.abc import Callable
from types import ModuleType
from typing import Any

import cuda.tile as ct

SUPPORTED_CUTILE = "1.7.0"

#: ``kernel._compile``'s leading parameters, which `ServedKernel` overrides and calls.
COMPILE_PARAMS = ["self", "signature", "context", "compute_capability"]
#: Fields of a kernel's compiler options that configs set as hints.
OPTION_FIELDS = {"num_ctas", "occupancy", "opt_level", "num_worker_warps"}
#: Private functions and classes ctbuild uses, by module.
SERVE_NAMES = {
    "cuda.tile._cext": ("get_compute_capability", "get_driver_version", "TileContext"),
    "cuda.tile._context": ("TileContextConfig",),
}
BUILD_NAMES = {
    "cuda.tile._compile": ("compile_tile", "compile_cubin", "_compiler_lock", "_get_bytecode",
                           "_IrKeeper", "_find_compiler_bin",
                           "_get_max_supported_bytecode_version"),
    "cuda.tile._passes.ast2hir": ("HirMode", "get_function_hir"),
}


class UnsupportedCuTileError(RuntimeError):
    """The installed cuda-tile is not one whose private interface ctbuild was built for."""


def _probe(X, N: ct.Constant[int]):  # noqa: N803 - a kernel's parameter names, as users write them
    """A kernel shape to check the per-kernel hooks on (never compiled)."""


def problems() -> list[str]:
    """Every hook that is not what ctbuild relies on (empty when all fit)."""
    found = []
    version = str(getattr(ct, "__version__", "unknown"))
    if version != SUPPORTED_CUTILE:
        found.append(f"version {version} (ctbuild supports {SUPPORTED_CUTILE})")
    compile_fn = getattr(ct.kernel, "_compile", None)
    if compile_fn is None:
        found.append("kernel._compile is gone")
    else:
        params = list(inspect.signature(compile_fn).parameters)
        if params[:4] != COMPILE_PARAMS:
            found.append(f"kernel._compile{tuple(params)} (expected {tuple(COMPILE_PARAMS)})")
    found += _kernel_problems()
    for module, names in SERVE_NAMES.items():
        found += _missing(module, names, _live_names)
    for module, names in BUILD_NAMES.items():
        found += _missing(module, names, _source_names)
    return found


def _kernel_problems() -> list[str]:
    try:
        kernel = ct.kernel(_probe)
    except Exception as exc:
        return [f"ct.kernel(...) failed on a plain kernel: {type(exc).__name__}: {exc}"]
    found = []
    if getattr(kernel, "_pyfunc", None) is not _probe:
        found.append("kernel._pyfunc")
    annotated = getattr(kernel, "_annotated_function", None)
    if annotated is None:
        found.append("kernel._annotated_function")
    else:
        try:
            params = list(annotated.pysig.parameters)
            constants = [getattr(a, "constant", None) for a in annotated.parameter_annotations]
        except AttributeError as exc:
            found.append(f"kernel._annotated_function ({exc})")
        else:
            if params != ["X", "N"] or constants != [False, True]:
                found.append("kernel._annotated_function.pysig/parameter_annotations "
                             f"(got {params}, constant flags {constants})")
    options = getattr(kernel, "_compiler_options", None)
    fields = {f.name for f in dataclasses.fields(options)} if dataclasses.is_dataclass(
        options) else set()
    if not OPTION_FIELDS <= fields:
        found.append(f"kernel._compiler_options (lacks {sorted(OPTION_FIELDS - fields)})")
    return found


def _live_names(module: str) -> set[str]:
    return set(dir(importlib.import_module(module)))


def _source_names(module: str) -> set[str]:
    """Names a module defines or imports at top level, read from its source (not imported)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ImportError(f"no module {module}")
    with open(spec.origin, encoding="utf-8") as f:
        tree = ast.parse(f.read(), spec.origin)
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _missing(module: str, names: tuple[str, ...], lister: Callable[[str], set[str]]
             ) -> list[str]:
    try:
        present = lister(module)
    except (ImportError, OSError, SyntaxError) as exc:
        return [f"{module} ({exc})"]
    return [f"{module}.{n}" for n in names if n not in present]


def check() -> None:
    """Raise `UnsupportedCuTileError` naming every hook that changed."""
    found = problems()
    if found:
        raise UnsupportedCuTileError(
            "ctbuild cannot use this cuda-tile; changed: " + "; ".join(found)
            + f". Install the supported version: pip install "
              f"'cuda-tile[tileiras]=={SUPPORTED_CUTILE}'")


check()


# ---- the hooks, for the rest of ctbuild --------------------------------------------------------
def pyfunc(kernel: Any) -> Callable[..., Any]:
    """The Python function a ``ct.kernel`` wraps."""
    return kernel._pyfunc


def annotated_function(kernel: Any) -> Any:
    """cuTile's parsed view of a kernel's parameters (what the dispatcher and compiler use)."""
    return kernel._annotated_function


def constant_params(kernel: Any) -> set[str]:
    """Names of a kernel's ``ct.Constant`` parameters."""
    annotated = kernel._annotated_function
    return {p for p, a in zip(annotated.pysig.parameters, annotated.parameter_annotations)
            if getattr(a, "constant", False)}


def compiler_options(kernel: Any) -> Any:
    """A kernel's compiler options (a dataclass: num_ctas, occupancy, opt_level, ...)."""
    return kernel._compiler_options


def compute_capability() -> tuple[int, int]:
    """(major, minor) of the current CUDA device, as the dispatcher sees it."""
    from cuda.tile._cext import get_compute_capability
    major, minor = get_compute_capability()
    return int(major), int(minor)


def driver_version() -> int:
    """The CUDA driver version (e.g. 13000)."""
    from cuda.tile._cext import get_driver_version
    return int(get_driver_version())


def compiler() -> ModuleType:
    """cuTile's compiler module (``compile_tile`` and friends); imported on first build use."""
    return importlib.import_module("cuda.tile._compile")

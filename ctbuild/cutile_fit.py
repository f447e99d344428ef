"""Which cuda-tile releases ctbuild supports, and the check that the installed one's private
hooks still fit (`ctbuild.cutile` uses them).

cuTile changes its private interface between releases, so ctbuild supports the series it was
built for (`SUPPORTED`) and checks the hooks once: an unsupported cuda-tile fails at once, with
one error naming every hook that changed, rather than mis-launching later or being chased
through the code one hook at a time. What differs between the supported series lives in
`SERIES` and nowhere else.

Serve hooks are checked on the live objects when `ctbuild.cutile` is imported. Build hooks are
checked from their module's source (names defined there), because importing cuTile's compiler
costs seconds and parsing its sources tens of milliseconds, which the serve path never needs:
`ctbuild.cutile.compiler` checks them (`check_build`) before it first hands the compiler out.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import importlib.util
import inspect
from collections.abc import Callable
from typing import NamedTuple

import cuda.tile as ct

#: The cuda-tile releases ctbuild supports (pyproject's requirement), and those it was tested on.
SUPPORTED = ">=1.6,<1.8"
TESTED = ("1.6.0", "1.7.0")


class Series(NamedTuple):
    """What differs in cuTile's private interface between the supported series (checked at
    import, used by `front_end` and `compile_cubin`). A NamedTuple: made at import
    (docs/architecture.md)."""
    #: ``_get_bytecode`` returns ``_BytecodeResult`` (bytecode, preview features, tile
    #: libraries to link, library lifecycle providers), not the bytecode alone.
    bytecode_result: bool
    #: Keyword parameters of ``compile_cubin`` that pass the front end's extras to tileiras.
    cubin_extras: tuple[str, ...]
    #: The type of ``_compile``'s fourth item (library lifecycle providers) the dispatcher
    #: takes: a list in 1.6 (a tuple is a TypeError there, None aborts the process), a
    #: tuple in 1.7 (a list or None is a TypeError).
    lifecycle: type
    #: ``_cext._benchmark`` takes ``flush_l2`` (1.7); 1.6's takes (stream, grid, kernel, args).
    benchmark_flush_arg: bool


SERIES = {
    "1.6": Series(bytecode_result=False, cubin_extras=(), lifecycle=list,
                  benchmark_flush_arg=False),
    "1.7": Series(bytecode_result=True, cubin_extras=("preview_features", "linker_inputs"),
                  lifecycle=tuple, benchmark_flush_arg=True),
}

#: ``kernel._compile``'s leading parameters, which `ServedKernel` overrides and calls.
COMPILE_PARAMS = ["self", "signature", "context", "compute_capability"]
#: Fields of a kernel's compiler options that configs set as hints.
OPTION_FIELDS = {"num_ctas", "occupancy", "opt_level", "num_worker_warps"}
#: Private functions and classes ctbuild uses, by module.
SERVE_NAMES = {
    "cuda.tile._cext": ("get_compute_capability", "get_driver_version", "TileContext",
                        "_benchmark"),
    "cuda.tile._context": ("TileContextConfig",),
}
BUILD_NAMES = {
    "cuda.tile._compile": ("compile_tile", "compile_cubin", "_compiler_lock", "_get_bytecode",
                           "_IrKeeper", "_find_compiler_bin",
                           "_get_max_supported_bytecode_version"),
    "cuda.tile._passes.ast2hir": ("HirMode", "get_function_hir"),
    "cuda.tile._bytecode.version": ("BytecodeVersion",),
}


class UnsupportedCuTileError(RuntimeError):
    """The installed cuda-tile is not one whose private interface ctbuild was built for."""


def _probe(X, N: ct.Constant[int]):  # noqa: N803 - a kernel's parameter names, as users write them
    """A kernel shape to check the per-kernel hooks on (never compiled)."""


def version() -> str:
    """The installed cuda-tile's version (``1.7.0``)."""
    return str(getattr(ct, "__version__", "unknown"))


def series(of: str | None = None) -> Series | None:
    """The `Series` of a cuda-tile version (default: the installed one); None if unsupported."""
    return SERIES.get(".".join((of or version()).split(".")[:2]))


def problems() -> list[str]:
    """Every hook that is not what ctbuild relies on (empty when all fit)."""
    return serve_problems() + build_problems()


def serve_problems() -> list[str]:
    """The hooks serving uses (checked at import: cheap, nothing parsed)."""
    found = []
    installed = series()
    if installed is None:
        found.append(f"version {version()} (ctbuild supports cuda-tile{SUPPORTED})")
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
    return found


def build_problems() -> list[str]:
    """The compiler's hooks, read from cuTile's sources without importing them (tens of ms of
    parsing: checked at the first use of the compiler, never on a serving process's import)."""
    found = []
    for module, names in BUILD_NAMES.items():
        found += _missing(module, names, _source_names)
    installed = series()
    if installed is not None:
        found += _series_problems(installed)
    return found


def _series_problems(installed: Series) -> list[str]:
    """The hooks whose shape differs by series: as this version's series has them."""
    module = "cuda.tile._compile"
    try:
        tree = _source_tree(module)
    except (ImportError, OSError, SyntaxError) as exc:
        return [f"{module} ({exc})"]
    found = []
    if ("_BytecodeResult" in _top_level_names(tree)) != installed.bytecode_result:
        found.append(f"{module}._get_bytecode's result (expected "
                     f"{'_BytecodeResult' if installed.bytecode_result else 'the bytecode'} "
                     f"in cuda-tile {version()})")
    params = _function_params(tree, "compile_cubin")
    if params is None:
        found.append(f"{module}.compile_cubin is gone")
    else:
        found += [f"{module}.compile_cubin lacks {p}=" for p in installed.cubin_extras
                  if p not in params]
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
            wrapped = annotated.pyfunc
        except AttributeError as exc:
            found.append(f"kernel._annotated_function ({exc})")
        else:
            if wrapped is not _probe:
                found.append("kernel._annotated_function.pyfunc")
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
    return _top_level_names(_source_tree(module))


@functools.lru_cache(maxsize=4)
def _source_tree(module: str) -> ast.Module:
    """A module's source, parsed (not imported)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ImportError(f"no module {module}")
    with open(spec.origin, encoding="utf-8") as f:
        return ast.parse(f.read(), spec.origin)


def _top_level_names(tree: ast.Module) -> set[str]:
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


def _function_params(tree: ast.Module, name: str) -> list[str] | None:
    """The parameter names of a top-level function in a parsed module (None: no such one)."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            a = node.args
            return [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    return None


def _missing(module: str, names: tuple[str, ...], lister: Callable[[str], set[str]]
             ) -> list[str]:
    try:
        present = lister(module)
    except (ImportError, OSError, SyntaxError) as exc:
        return [f"{module} ({exc})"]
    return [f"{module}.{n}" for n in names if n not in present]


def check(found: list[str] | None = None) -> None:
    """Raise `UnsupportedCuTileError` naming every hook that changed (default: all of them)."""
    found = problems() if found is None else found
    if found:
        raise UnsupportedCuTileError(
            "ctbuild cannot use this cuda-tile; changed: " + "; ".join(found)
            + f". Install a supported version (tested: {', '.join(TESTED)}): pip install "
              f"'cuda-tile[tileiras]{SUPPORTED}'")


@functools.lru_cache(maxsize=1)
def check_build() -> None:
    """`check` the compiler's hooks, once per process."""
    check(build_problems())

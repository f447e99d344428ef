"""The import rules of docs/architecture.md, checked on the source and in a fresh interpreter.

- ``farm/`` and ``cache/`` are imported only as ``ctbuild.farm`` and ``ctbuild.cache``: nothing
  imports a top-level ``farm`` or ``cache`` (those names are a project's own modules).
- ``ctbuild.farm`` and ``ctbuild.cache`` never import the rest of ``ctbuild``;
  ``ctbuild.cache`` never imports ``ctbuild.farm``.
- ``ctbuild.compile`` (CPU only) imports neither ``ctbuild.tune`` nor ``ctbuild.serve``.
- ``ctbuild.serve`` imports neither ``ctbuild.compile``, ``ctbuild.tune``, Ray nor the farm, except
  the lazy imports in ALLOWED_LAZY.
- The core (the modules at the top of ``ctbuild/``) imports no phase at module level, and
  inside functions only as ALLOWED_LAZY says.
- The serve path: ``import ctbuild`` + resolving and calling a kernel, in a fresh process, loads
  none of ``ctbuild.compile``, ``ctbuild.tune``, ``ray``, ``ctbuild.farm``.
- cuTile's private API is touched only by the modules in PRIVATE_CUTILE.
"""
from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass
from pathlib import Path

from conftest import python_json

ROOT = Path(__file__).resolve().parents[2]
#: The top-level folders that are packages inside ctbuild (ctbuild/farm, ctbuild/cache link them).
NAMESPACED = ("farm", "cache")
#: Where Python code lives, each file once (a walk does not follow the links in ctbuild/).
SOURCE_DIRS = ("ctbuild", *NAMESPACED, "tests", "benchmarks", "examples", "docs")
PHASES = ("ctbuild.compile", "ctbuild.tune", "ctbuild.serve")
#: Modules at the top of ctbuild/ that are not core: the CLI entry points and the public
#: ``ctbuild.runtime`` name (a re-export of ctbuild.serve).
NOT_CORE = {"ctbuild", "ctbuild.__main__", "ctbuild.cli", "ctbuild.runtime"}
#: (importer, imported) pairs allowed inside a function only, each for one reason.
ALLOWED_LAZY = {
    # CTBUILD_MODE=tune: a miss tunes online with the `ctbuild tune` engine
    ("ctbuild.serve.online_tune", "ctbuild.tune.tuner"),
    # the package wires the serve phase in: a declared kernel's runtime is made at its first
    # call (the cold-start ledger times the import), never at `import ctbuild`
    ("ctbuild", "ctbuild.serve.kernel_runtime"),
    ("ctbuild", "ctbuild.serve.ledger"),
}

#: The modules allowed to touch cuTile's private names: `ctbuild.cutile` (the hooks) and
#: `ctbuild.cutile_fit` (the supported versions, and the check that the hooks still fit).
PRIVATE_CUTILE = {"ctbuild.cutile", "ctbuild.cutile_fit"}
PRIVATE_NAME = re.compile(r"cuda\.tile\._|\._annotated_function\b|\._pyfunc\b|[\"']_pyfunc[\"']|"
                          r"\._compiler_options\b|\.kernel\._compile\b|\b_cext\b")


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    lazy: bool  # inside a function (runs only when called)

    def __str__(self) -> str:
        where = "inside a function" if self.lazy else "at module level"
        return f"{self.importer} imports {self.imported} {where} (line {self.line})"


def module_name(path: Path) -> str:
    """The name a file is imported by: farm/x.py is ``ctbuild.farm.x``."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    if parts[0] in NAMESPACED:
        parts.insert(0, "ctbuild")
    return ".".join(parts)


def imports_of(path: Path) -> list[Import]:
    """Every import of one file, relative ones resolved to absolute module names
    (``from pkg import name`` also counts as importing ``pkg.name``, which may be a module)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    lazy_lines = {n.lineno for f in ast.walk(tree)
                  if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                  for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [module] + [f"{module}.{a.name}" for a in node.names]
        else:
            continue
        found += [Import(name, t, node.lineno, node.lineno in lazy_lines) for t in targets]
    return found


def python_files(folder: str) -> list[Path]:
    """The .py files under ``folder`` (relative to the root); links to folders are not followed
    (os.walk's default), so farm/ and cache/ are scanned once, by their own folders."""
    return sorted(Path(d, f) for d, _, files in os.walk(ROOT / folder) for f in files
                  if f.endswith(".py") and "__pycache__" not in Path(d).parts)


def package_imports(package: str) -> list[Import]:
    return [i for p in python_files(package) for i in imports_of(p)]


def under(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def allowed_lazy(i: Import) -> bool:
    """A lazy import that ALLOWED_LAZY names (its module, a name in it, or its package)."""
    return i.lazy and any(i.importer == importer and (under(i.imported, m) or under(m, i.imported))
                          for importer, m in ALLOWED_LAZY)


def test_the_scan_sees_imports() -> None:
    """The scanner itself: it resolves relative imports and tells lazy from module level."""
    found = {(i.imported, i.lazy) for i in imports_of(ROOT / "ctbuild" / "__init__.py")}
    assert ("ctbuild.declare", False) in found
    assert ("ctbuild.serve.kernel_runtime", True) in found
    # relative imports in cache/ resolve under the name it is imported by
    assert {"ctbuild.cache.store", "ctbuild.cache.errors"} <= \
        {i.imported for i in package_imports("cache")}


def test_nothing_imports_farm_or_cache_by_their_top_level_names() -> None:
    """A top-level ``farm`` or ``cache`` is a project's module: none of ours imports one (it
    would be the project's, or a second copy of ours beside ``ctbuild.cache``)."""
    found = [i for d in SOURCE_DIRS for i in package_imports(d)]
    assert any(under(i.imported, "ctbuild.farm") for i in found)  # the scan sees the new names
    assert [str(i) for i in found if under(i.imported, *NAMESPACED)] == []


def test_farm_and_cache_never_import_ctbuild() -> None:
    core = [str(i) for pkg in NAMESPACED for i in package_imports(pkg)
            if under(i.imported, "ctbuild")
            and not under(i.imported, "ctbuild.farm", "ctbuild.cache")]
    assert core == []
    assert [str(i) for i in package_imports("cache") if under(i.imported, "ctbuild.farm")] == []


def test_build_imports_no_other_phase() -> None:
    bad = [str(i) for i in package_imports("ctbuild/compile")
           if under(i.imported, "ctbuild.tune", "ctbuild.serve")]
    assert bad == []


def test_serve_imports_neither_build_tune_ray_nor_farm() -> None:
    bad = [str(i) for i in package_imports("ctbuild/serve")
           if under(i.imported, "ctbuild.compile", "ctbuild.tune", "ray", "ctbuild.farm")
           and not allowed_lazy(i)]
    assert bad == []


def test_core_imports_phases_only_where_allowed() -> None:
    core = [p for p in sorted((ROOT / "ctbuild").glob("*.py")) if module_name(p) not in NOT_CORE]
    assert len(core) >= 8
    bad = [str(i) for p in core for i in imports_of(p)
           if under(i.imported, *PHASES, "ctbuild.commands", "ray", "ctbuild.farm")
           and not allowed_lazy(i)]
    assert bad == []


SERVE_SCRIPT = r"""
import json, sys
sys.path[:0] = [{root!r}, {examples!r}]
import ctbuild
from ctbuild import runtime
from demo_kernels.matmul import matmul
from demo_kernels.rmsnorm import rmsnorm
import torch
a = torch.zeros(256, 256, dtype=torch.float16)
x = torch.zeros(64, 512, dtype=torch.float16)
w = torch.zeros(512, dtype=torch.float16)
errors = []
for mode in ("default", "strict"):
    runtime.configure(mode=mode)
    for kernel, args in ((matmul, (a, a.clone(), a.clone())), (rmsnorm, (x, w, x.clone(), 1e-6))):
        try:
            kernel.runtime.resolve(args, arch="sm_90", gpu="H100")
        except runtime.CacheMissError as exc:
            errors.append(type(exc).__name__)
        try:
            kernel(*args)  # host tensors: refused before launching, after the hot-path lookup
        except Exception as exc:
            errors.append(type(exc).__name__)
print(json.dumps({{"errors": errors, "modules": sorted(sys.modules)}}))
"""


def test_serve_path_loads_no_build_tune_ray_or_farm(tmp_path: Path) -> None:
    script = SERVE_SCRIPT.format(root=str(ROOT), examples=str(ROOT / "examples"))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
           "CTBUILD_CACHE_DIR": str(tmp_path / "cache"), "CTBUILD_RECORD": str(tmp_path / "rec")}
    got = python_json(script, env=env, cwd=tmp_path)
    assert "ctbuild.serve.kernel_runtime" in got["modules"]  # the path really ran
    assert "CacheMissError" in got["errors"] and "KernelCallError" in got["errors"]
    loaded = [m for m in got["modules"]
              if under(m, "ctbuild.compile", "ctbuild.tune", "ray", "ctbuild.farm")]
    assert loaded == []


def test_private_cutile_names_stay_in_their_modules() -> None:
    touching = {module_name(p) for d in ("ctbuild", *NAMESPACED) for p in python_files(d)
                if PRIVATE_NAME.search(p.read_text())}
    assert "ctbuild.cutile" in touching  # the pattern sees what it must
    assert touching - PRIVATE_CUTILE == set()

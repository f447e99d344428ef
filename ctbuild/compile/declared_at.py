"""Where in the user's source a kernel is declared: its ``ctbuild.autotune(...)`` call, and the
line in it that names a given axis or hint.

A problem that comes from the declaration, not from a line of the kernel body (a hint value
tileiras cannot take, a config tileiras fails on with no location in the body), names this
``file:line``: the place to edit. The declaring module's source is parsed (only when there is
such a problem to report); the call is the one decorating the kernel's function, else the one
whose ``name=`` is the kernel's, else the module's only one; else the kernel function's first
line stands in.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..declare import TunedKernel


def declaration_line(kernel: TunedKernel, word: str | None = None) -> str | None:
    """``file:line`` of the declaration's line naming ``word`` (an axis, as a keyword or a
    dict key), else of the declaration itself; None for code with no source file."""
    from .body_check import shown
    code = kernel.pyfunc.__code__
    filename = getattr(sys.modules.get(kernel.module), "__file__", None) or code.co_filename
    call = _autotune_call(filename, kernel)
    if call is None:
        if code.co_filename.startswith("<"):
            return None
        return f"{shown(code.co_filename)}:{code.co_firstlineno}"
    line = _naming(call, word) if word else None
    return f"{shown(filename)}:{line or call.lineno}"


def _autotune_call(filename: str, kernel: TunedKernel) -> ast.Call | None:
    """The ``autotune(...)`` call that declares ``kernel`` in ``filename``, or None."""
    try:
        tree = ast.parse(Path(filename).read_text(), filename)
    except (OSError, SyntaxError, ValueError):
        return None
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and _is_autotune(n.func)]
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                node.name == kernel.pyfunc.__name__:
            for deco in node.decorator_list:
                if deco in calls:
                    return deco
    named = [c for c in calls if any(k.arg == "name" and isinstance(k.value, ast.Constant)
                                     and k.value.value == kernel.name for k in c.keywords)]
    if named:
        return named[0]
    return calls[0] if len(calls) == 1 else None


def _is_autotune(func: ast.expr) -> bool:
    return (isinstance(func, ast.Name) and func.id == "autotune") or \
        (isinstance(func, ast.Attribute) and func.attr == "autotune")


def _naming(call: ast.Call, word: str) -> int | None:
    """The first line inside ``call`` naming ``word``: a keyword (``num_worker_warps=[...]``)
    or a string (a dict key or a config's)."""
    lines = [k.value.lineno for n in ast.walk(call) if isinstance(n, ast.Call)
             for k in n.keywords if k.arg == word]
    lines += [n.lineno for n in ast.walk(call) if isinstance(n, ast.Constant) and n.value == word]
    return min(lines, default=None)

"""Kernel fingerprints: what a kernel's compiled code can depend on, and nothing else.

The fingerprint covers the kernel's source, the sources of the tile functions and helpers it
calls (transitively), and the values of the module-level constants it reads. It is independent
of where the file lives (cuTile's own cache keys embed the absolute path, so a CUBIN built in a
container at /build misses at /app), and of unrelated functions in the same module.
"""
from __future__ import annotations

import ast
import builtins
import inspect
import json
import textwrap
import types
from typing import Any

import xxhash

#: Modules whose functions are the compiler's, not the user's: versioned by the toolchain print.
_LIBRARY_PREFIXES = ("cuda.", "cutile_cache", "numpy", "torch", "math", "builtins", "typing")


def _source(func: types.FunctionType) -> str:
    try:
        return textwrap.dedent(inspect.getsource(func))
    except (OSError, TypeError) as exc:
        raise ValueError(f"cannot read the source of {func.__qualname__}: {exc}") from exc


def _is_library(obj: Any) -> bool:
    module = getattr(obj, "__module__", None) or getattr(obj, "__name__", "")
    return not module or module.startswith(_LIBRARY_PREFIXES)


def _constant_value(value: Any) -> Any:
    """JSON-able form of a module constant, or None when it is not a plain value."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return [type(value).__name__, repr(value)]
    if isinstance(value, (tuple, list, frozenset)):
        items = [_constant_value(v) for v in value]
        return None if any(i is None for i in items) else [type(value).__name__, items]
    return None


def _global_refs(tree: ast.AST) -> list[list[str]]:
    """Dotted names read by the code: ``helper``, ``mod.helper``, ``TILE``."""
    refs = []
    for node in ast.walk(tree):
        chain: list[str] = []
        cur = node
        while isinstance(cur, ast.Attribute):
            chain.append(cur.attr)
            cur = cur.value
        if isinstance(cur, ast.Name) and (isinstance(node, ast.Name) or chain):
            refs.append([cur.id, *reversed(chain)])
    return refs


def _unwrap(func: Any) -> Any:
    func = getattr(func, "_pyfunc", func)  # ct.kernel objects
    while hasattr(func, "__wrapped__"):
        func = func.__wrapped__
    return func


def kernel_fingerprint(kernel: Any) -> str:
    """xxh3-128 of the kernel's source, its helpers' sources and the constants they read."""
    root = _unwrap(kernel)
    parts: dict[str, Any] = {}
    pending = [root]
    seen: set[int] = set()
    while pending:
        func = pending.pop()
        if id(func) in seen:
            continue
        seen.add(id(func))
        src = _source(func)
        parts[f"fn:{func.__module__.rsplit('.', 1)[-1]}.{func.__qualname__}"] = src
        for chain in _global_refs(ast.parse(src)):
            head = chain[0]
            if head in func.__code__.co_varnames or hasattr(builtins, head) and \
                    head not in func.__globals__:
                continue
            if head in func.__code__.co_freevars and func.__closure__:
                idx = func.__code__.co_freevars.index(head)
                value = func.__closure__[idx].cell_contents
            elif head in func.__globals__:
                value = func.__globals__[head]
            else:
                continue
            name = head
            for attr in chain[1:]:
                if not isinstance(value, types.ModuleType) or _is_library(value):
                    break
                value = getattr(value, attr, None)
                name += "." + attr
            value = _unwrap(value)
            if isinstance(value, types.FunctionType):
                if not _is_library(value):
                    pending.append(value)
            elif not isinstance(value, (types.ModuleType, type)) and \
                    (const := _constant_value(value)) is not None:
                parts[f"const:{name}"] = const
    blob = json.dumps(parts, sort_keys=True).encode()
    return xxhash.xxh3_128_hexdigest(blob)

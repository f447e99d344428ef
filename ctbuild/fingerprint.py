"""Kernel fingerprints: exactly what cuTile's front end compiles, and nothing else.

The fingerprint covers the normalized code (an AST dump without line numbers, comments,
docstrings or decorators) of the kernel and of every function it calls, transitively, from any
module that is not a library, plus the value of every global, closure variable and default
argument that code reads, of any type. A value that has no stable text (its repr carries a
memory address) is refused with `FingerprintError` rather than skipped: a skipped value is a
stale CUBIN waiting to be served.

The decorators are left out on purpose: ``@ctbuild.autotune(...)`` decides which CUBINs are
needed, not what a CUBIN is, and ``@ct.kernel(...)``'s options reach the compile key as hints.
Nothing path-dependent goes in, so moving a checkout keeps every key.
"""
from __future__ import annotations

import ast
import enum
import inspect
import json
import re
import sys
import textwrap
import types
from typing import Any

import xxhash

from . import cutile

#: Top-level packages whose code is the toolchain's or a library's, versioned elsewhere. A
#: module is a library when its top-level package is one of these or in the standard library:
#: ``math`` and ``torch.nn`` are, a project's ``mathx`` or ``torchops`` is not.
_LIBRARY_PACKAGES = frozenset({"cuda", "torch", "numpy", "ctbuild", "cutile_cache"})

_ADDRESS = re.compile(r"0x[0-9a-fA-F]{4,}")


class FingerprintError(ValueError):
    """Something a kernel reads has no stable identity, so no safe cache key exists."""


def is_library_module(name: str) -> bool:
    """Whether module ``name`` belongs to a library (exact top-level package, never a prefix)."""
    top = name.split(".", 1)[0]
    return top in _LIBRARY_PACKAGES or top in sys.stdlib_module_names


def _is_library(obj: Any) -> bool:
    if isinstance(obj, types.ModuleType):
        return is_library_module(obj.__name__)
    module = getattr(obj, "__module__", None)
    return not module or is_library_module(module)


def _unwrap(func: Any) -> Any:
    func = cutile.pyfunc(func)  # ct.kernel objects
    while hasattr(func, "__wrapped__"):
        func = func.__wrapped__
    return func


class _Normalize(ast.NodeTransformer):
    """Drop what cannot change compiled code: decorators and docstrings."""

    def _strip(self, node: Any) -> Any:
        node.decorator_list = []
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
        return self.generic_visit(node)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _strip


def _code_tree(func: types.FunctionType) -> ast.AST:
    try:
        source = textwrap.dedent(inspect.getsource(func))
    except (OSError, TypeError) as exc:
        raise FingerprintError(f"cannot read the source of {func.__qualname__}: {exc}") from exc
    try:
        tree = ast.parse(source)
    except SyntaxError:  # a lambda in the middle of an expression: keep its own text
        tree = ast.parse(f"({source.strip().rstrip(',')})")
    return _Normalize().visit(tree)


def _reads(tree: ast.AST) -> list[list[str]]:
    """Dotted names the code reads: ``helper``, ``mod.helper``, ``TILE``, ``cfg.X``."""
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


def _locals(code: types.CodeType) -> set[str]:
    names = set(code.co_varnames) | set(code.co_cellvars)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _locals(const)
    return names


class _Walk:
    """One fingerprint computation: functions to visit, and the parts collected so far."""

    def __init__(self) -> None:
        self.parts: dict[str, Any] = {}
        self.pending: list[types.FunctionType] = []
        self.names: dict[int, str] = {}

    def function_ref(self, func: types.FunctionType) -> str:
        """The function's name in the fingerprint: its discovery order and qualname, not its
        module, which is where the file lives, not what it compiles to."""
        if id(func) not in self.names:
            self.names[id(func)] = f"fn{len(self.names)}:{func.__qualname__}"
            self.pending.append(func)
        return self.names[id(func)]

    def value(self, value: Any, where: str) -> Any:
        """A JSON-able, address-free description of ``value`` (functions are followed)."""
        value = _unwrap(value)
        if value is None or isinstance(value, (bool, int, float, str, bytes, complex)):
            return [type(value).__name__, repr(value)]
        if isinstance(value, (tuple, list)):
            return [type(value).__name__, [self.value(v, where) for v in value]]
        if isinstance(value, (set, frozenset)):
            items = [self.value(v, where) for v in value]
            return [type(value).__name__, sorted(items, key=json.dumps)]
        if isinstance(value, dict):
            items = [[self.value(k, where), self.value(v, where)] for k, v in value.items()]
            return ["dict", sorted(items, key=json.dumps)]
        if isinstance(value, enum.Enum):
            cls = type(value)
            return ["enum", f"{cls.__module__}.{cls.__qualname__}", value.name,
                    self.value(value.value, where)]
        if isinstance(value, types.FunctionType):
            if _is_library(value):
                return ["libfn", f"{value.__module__}.{value.__qualname__}"]
            return ["fn", self.function_ref(value)]
        if isinstance(value, types.ModuleType):
            return ["module", value.__name__]
        if isinstance(value, type):
            return ["type", f"{value.__module__}.{value.__qualname__}"]
        if callable(value) and _is_library(value) and not hasattr(value, "__dict__"):
            return ["lib", f"{getattr(value, '__module__', '')}.{getattr(value, '__name__', '')}"]
        text = repr(value)
        if _ADDRESS.search(text):
            raise FingerprintError(
                f"{where} is {text}, which has no stable identity (its text carries a memory "
                "address); make it a plain constant (number, string, tuple, enum, cuTile dtype) "
                "or give its class a __repr__ that shows its value")
        cls = type(value)
        return ["repr", f"{cls.__module__}.{cls.__qualname__}", text]

    def visit(self, func: types.FunctionType) -> None:
        tree = _code_tree(func)
        name = self.function_ref(func)
        self.parts[name] = ast.dump(tree, include_attributes=False)
        local = _locals(func.__code__)
        freevars = func.__code__.co_freevars
        for i, default in enumerate(func.__defaults__ or ()):
            self.parts[f"{name}:default{i}"] = self.value(default, f"a default of {func.__qualname__}")
        for arg, default in sorted((func.__kwdefaults__ or {}).items()):
            self.parts[f"{name}:default:{arg}"] = self.value(default, f"{func.__qualname__}({arg}=)")
        for chain in _reads(tree):
            head = chain[0]
            if head in freevars and func.__closure__:
                try:
                    value = func.__closure__[freevars.index(head)].cell_contents
                except ValueError:  # an empty cell: assigned later in the enclosing scope
                    continue
            elif head in local:
                continue
            elif head in func.__globals__:
                value = func.__globals__[head]
            else:
                continue  # a builtin (or a name the front end will reject)
            dotted = head
            for attr in chain[1:]:
                if not isinstance(value, types.ModuleType) or _is_library(value):
                    break
                value = getattr(value, attr, None)
                dotted += "." + attr
            if isinstance(value, types.ModuleType) and _is_library(value):
                continue  # ct.load, math.pi: the toolchain's, versioned by its fingerprint
            self.parts[f"{name}:{dotted}"] = self.value(value, f"{dotted} (read by "
                                                               f"{func.__qualname__})")


def kernel_fingerprint(kernel: Any) -> str:
    """xxh3-128 of the kernel's normalized code, its helpers' and every value they read."""
    root = _unwrap(kernel)
    if not isinstance(root, types.FunctionType):
        raise FingerprintError(f"cannot fingerprint {kernel!r}: not a Python function")
    walk = _Walk()
    walk.function_ref(root)
    while walk.pending:
        walk.visit(walk.pending.pop())
    blob = json.dumps(walk.parts, sort_keys=True).encode()
    return xxhash.xxh3_128_hexdigest(blob)


__all__ = ["FingerprintError", "is_library_module", "kernel_fingerprint"]

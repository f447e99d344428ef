"""What a kernel fingerprint takes from a function's source text: its normalized code, the
dotted names it reads and the calls it makes with their leading arguments.

This is the part of a fingerprint that depends on the source alone (parsing it is most of a
fingerprint's time), computed once per function in a process (`analyse`): a serving process
computes it for each kernel as it is declared, so the kernel's first call does not.
"""
from __future__ import annotations

import ast
import inspect
import linecache
import textwrap
import threading
import types
from typing import NamedTuple


class FingerprintError(ValueError):
    """Something a kernel reads has no stable identity, so no safe cache key exists."""


def _children(node: ast.AST) -> list[ast.AST]:
    """A node's child nodes in field order, list items in order (`ast.iter_child_nodes`'s
    order, without its generator: the walks below were most of a fingerprint's time, and the
    fingerprint runs at a kernel's first call)."""
    out: list[ast.AST] = []
    for name in node._fields:
        value = getattr(node, name, None)
        if isinstance(value, ast.AST):
            out.append(value)
        elif isinstance(value, list):
            out.extend(v for v in value if isinstance(v, ast.AST))
    return out


_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


#: An argument as `Analysis.uses` records it: ("str", text) for a string literal, ("chain",
#: name, attr, ...) for a dotted name (its value is read when the fingerprint is taken), None
#: for anything else.
ArgSpec = tuple[str, ...] | None


class Analysis(NamedTuple):
    """The source half of a function's fingerprint."""
    dump: str                                             # the normalized code
    reads: list[list[str]]                                # dotted names, longest chains
    uses: list[tuple[tuple[str, ...], tuple[ArgSpec, ...]]]  # (callee or subscripted, args)


def _chain(node: ast.AST) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]``; None for anything but a name and its attributes."""
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    return [node.id, *reversed(names)] if isinstance(node, ast.Name) else None


def _arg(node: ast.AST) -> ArgSpec:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return ("str", node.value)
    chain = _chain(node)
    return ("chain", *chain) if chain is not None else None


def _use(node: ast.AST) -> tuple[tuple[str, ...], tuple[ArgSpec, ...]] | None:
    """(callee, its first two arguments) of a call, (subscripted, key) of a subscript, where
    the callee or subscripted value is a dotted name: what names an environment variable, a
    file or a ``getattr`` attribute (`ctbuild.identity_reads`)."""
    if isinstance(node, ast.Call):
        target, args = _chain(node.func), tuple(_arg(a) for a in node.args[:2])
    elif isinstance(node, ast.Subscript):
        target, args = _chain(node.value), (_arg(node.slice),)
    else:
        return None
    return None if target is None else (tuple(target), args)


def _strip(node: ast.AST) -> None:
    """Drop what cannot change compiled code from a definition: decorators, a docstring."""
    if isinstance(node, _DEFS):
        node.decorator_list = []
        body = node.body
        if body and isinstance(body[0], ast.Expr) and \
                isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]


def _normalize_and_read(tree: ast.AST) -> tuple[list[list[str]], list]:
    """Drop what cannot change compiled code (decorators, docstrings; in place) and return
    (the dotted names the rest reads: ``helper``, ``mod.helper``, ``TILE``, ``cfg.X``, the
    longest chain only: ``C.F`` reads ``C.F``, not all of ``C``; the calls and subscripts of
    dotted names with their leading arguments). ``getattr(X, "NAME")`` with a literal name
    reads ``X.NAME``, as cuTile's front end evaluates it.

    One breadth-first walk (`ast.walk`'s order, parents before their children: the order names
    are found in is the order helpers are named in, `_Walk.function_ref`); a node is stripped
    before its children are listed, so a dropped docstring or decorator is never visited. The
    walks were most of a fingerprint's time, and it runs at a kernel's first call."""
    refs, uses = [], []
    inner: set[int] = set()  # attribute nodes and names inside a longer chain
    todo = [tree]
    i = 0
    while i < len(todo):
        node = todo[i]
        i += 1
        _strip(node)
        todo.extend(_children(node))
        if (use := _use(node)) is not None:
            uses.append(use)
            target, args = use
            if target == ("getattr",) and len(args) == 2 and args[0] and args[0][0] == "chain" \
                    and args[1] and args[1][0] == "str":
                refs.append([*args[0][1:], args[1][1]])
        if id(node) in inner:
            continue
        chain: list[str] = []
        cur = node
        while isinstance(cur, ast.Attribute):
            chain.append(cur.attr)
            cur = cur.value
            inner.add(id(cur))
        if isinstance(cur, ast.Name) and (isinstance(node, ast.Name) or chain):
            refs.append([cur.id, *reversed(chain)])
    return refs, uses


def _last_code_line(code: types.CodeType) -> int:
    """The last source line any instruction of ``code`` or of a function nested in it starts
    on (`co_lines`: a tenth of `co_positions`' cost; the lines an expression continues on after
    it are more indented than the ``def``, and `_quick_tree` takes those in)."""
    last = max((line for _, _, line in code.co_lines() if line is not None), default=0)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            last = max(last, _last_code_line(const))
    return last


def _quick_tree(func: types.FunctionType) -> ast.Module | None:
    """The parsed source of a ``def`` as `inspect.getsource` gives it, cut by indentation from
    the code's own line table (inspect tokenizes: ~0.5 ms a function, most of a fingerprint on a
    kernel's first call). None where the cut is not that one whole function (a lambda, a
    signature on its own lines with nothing after it, an unusual layout): then inspect's."""
    code = func.__code__
    linecache.checkcache(code.co_filename)  # the file as it is now, as inspect reads it
    lines = linecache.getlines(code.co_filename, func.__globals__)
    start = code.co_firstlineno - 1
    if not 0 <= start < len(lines):
        return None
    head = lines[start]
    if not head.lstrip().startswith(("def ", "async ", "@")):
        return None
    indent = len(head) - len(head.lstrip())
    end = _last_code_line(code)  # 1-based: lines[start:end] holds every instruction
    if end <= start:
        return None
    for i in range(end, len(lines)):  # code that compiles to nothing (pass, dead branches)
        text = lines[i].lstrip()
        if text and not text.startswith("#"):
            if len(lines[i]) - len(text) <= indent:
                break
            end = i + 1
    try:
        tree = ast.parse(textwrap.dedent("".join(lines[start:end])))
    except SyntaxError:
        return None
    body = tree.body
    if len(body) != 1 or not isinstance(body[0], (ast.FunctionDef, ast.AsyncFunctionDef)) \
            or body[0].name != code.co_name:
        return None
    return tree


#: `analyse`'s results by code object (its id; the entry holds the code, so the id stays its),
#: at most `MAX_ANALYSED` (a program declaring kernels without end starts over).
_ANALYSED: dict[int, tuple[types.CodeType, Analysis]] = {}
_ANALYSED_LOCK = threading.Lock()
MAX_ANALYSED = 4096


def analyse(func: types.FunctionType) -> Analysis:
    """A function's `Analysis`, computed once per function in a process. A serving process
    computes it for each kernel as it is declared (`ctbuild.fingerprint.prepare`), so the
    kernel's first call does not; the values the names hold are read at the first call, when
    the kernel's module has run to its end."""
    code = func.__code__
    hit = _ANALYSED.get(id(code))
    if hit is not None and hit[0] is code:
        return hit[1]
    tree, (reads, uses) = _code_tree(func)
    found = Analysis(ast.dump(tree, include_attributes=False), reads, uses)
    with _ANALYSED_LOCK:
        if len(_ANALYSED) >= MAX_ANALYSED:
            _ANALYSED.clear()
        _ANALYSED[id(code)] = (code, found)
    return found


def _code_tree(func: types.FunctionType) -> tuple[ast.AST, tuple[list[list[str]], list]]:
    """(the normalized tree of a function's source, its reads and uses)."""
    tree = _quick_tree(func)
    if tree is None:
        try:  # not inspect.getsource: it follows __wrapped__, and cuTile compiles func itself
            lines, start = inspect.findsource(func)
        except (OSError, TypeError) as exc:
            raise FingerprintError(
                f"cannot read the source of {func.__qualname__}: {exc}") from exc
        source = textwrap.dedent("".join(inspect.getblock(lines[start:])))
        try:
            tree = ast.parse(source)
        except SyntaxError:  # a lambda in the middle of an expression: keep its own text
            tree = ast.parse(f"({source.strip().rstrip(',')})")
    return tree, _normalize_and_read(tree)


def local_names(code: types.CodeType) -> set[str]:
    """A function's local and cell names, its nested functions' included."""
    names = set(code.co_varnames) | set(code.co_cellvars)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= local_names(const)
    return names


__all__ = ["Analysis", "ArgSpec", "FingerprintError", "MAX_ANALYSED", "analyse", "local_names"]

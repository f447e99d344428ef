"""The fingerprint reads a function's source by cutting its lines from the code's own line
table (inspect's tokenizer costs ~0.5 ms a function on a kernel's first call). The cut must give
exactly the tree `inspect.getsource` gives, on every layout, or step aside for inspect."""
from __future__ import annotations

import ast
import importlib.util
import inspect
import textwrap
import types
from pathlib import Path

import pytest

from ctbuild import fingerprint_source as fp
from ctbuild.fingerprint_values import unwrap

LAYOUTS = '''
import functools


def plain(x):
    return x + 1


def black_style(
    a,
    b,
) -> int:
    return a + b


@functools.lru_cache(
    maxsize=4,
)
def decorated(a):
    """Doc."""
    return a * 2


def trailing_pass(a):
    if a:
        return 1
    else:
        pass


def dead_branch(a):
    y = a
    if False:
        y = a * 1000
# a comment at column 0 inside the body
    return y


def dead_tail(a):
    return a
    if a:
        print("never")


def column_zero_string(a):
    text = """
no indent here
"""
    return text + a


def nested(a):
    def inner(b):
        return b + 1
    return inner(a)


def continued(a):
    return a + \\
1


def only_doc():
    """Nothing but a docstring."""


def signature_then_doc(
    a,
):
    """Nothing but a docstring."""


lam = lambda x: x + 1  # noqa: E731


class Holder:
    @staticmethod
    def method(a):
        return a - 1
'''


def _functions(tmp_path: Path) -> list[types.FunctionType]:
    path = tmp_path / "layouts_mod.py"
    path.write_text(LAYOUTS)
    spec = importlib.util.spec_from_file_location("layouts_mod", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    found = [inspect.unwrap(v) for v in vars(module).values() if callable(v)]
    found += [module.Holder.method, module.nested.__code__]
    return [f for f in found if isinstance(f, types.FunctionType)]


def test_cut_matches_inspect_on_every_layout(tmp_path: Path) -> None:
    functions = _functions(tmp_path)
    assert len(functions) >= 13
    cut = 0
    for func in functions:
        tree = fp._quick_tree(func)
        if tree is None:  # inspect's answer is used instead
            continue
        cut += 1
        expected = ast.parse(textwrap.dedent(inspect.getsource(func)))
        assert ast.dump(tree) == ast.dump(expected), func.__qualname__
    assert cut >= 11  # the cheap cut serves the usual layouts, not only the plain one


def test_lambda_and_examples_keep_inspects_tree(tmp_path: Path) -> None:
    lam = next(f for f in _functions(tmp_path) if f.__name__ == "<lambda>")
    assert fp._quick_tree(lam) is None
    import gpu_runtime_examples as ex
    for tuned in ex.load_examples().values():
        func = unwrap(tuned.kernel)
        tree = fp._quick_tree(func)
        assert tree is not None
        assert ast.dump(tree) == ast.dump(ast.parse(textwrap.dedent(inspect.getsource(func))))


@pytest.mark.parametrize("body", ["    return a\n", "    return a\n    pass\n"])
def test_statements_without_code_still_count(tmp_path: Path, body: str) -> None:
    """A trailing statement that compiles to nothing is part of the tree (and the key)."""
    path = tmp_path / f"tail_{len(body)}.py"
    path.write_text(f"def k(a):\n{body}")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tree = fp._quick_tree(module.k)
    assert tree is not None and len(tree.body[0].body) == body.count("\n")


def test_cut_matches_inspect_across_the_standard_library() -> None:
    """Thousands of functions as people lay them out (every function of these modules): where
    the cut gives a tree, it is inspect's tree."""
    import argparse
    import dataclasses
    import email.message
    import json.decoder
    import json.encoder
    import logging
    import pathlib
    import shutil
    import subprocess
    import tarfile
    import zipfile
    cut = total = 0
    for module in (argparse, dataclasses, email.message, inspect, json.decoder, json.encoder,
                   logging, pathlib, shutil, subprocess, tarfile, textwrap, zipfile, ast):
        funcs = [v for v in vars(module).values() if isinstance(v, types.FunctionType)]
        for cls in (v for v in vars(module).values() if isinstance(v, type)):
            funcs += [f for f in vars(cls).values() if isinstance(f, types.FunctionType)]
        for func in map(inspect.unwrap, funcs):  # as the fingerprint reads them
            if func.__module__ != module.__name__:
                continue
            total += 1
            tree = fp._quick_tree(func)
            if tree is None:
                continue
            cut += 1
            expected = ast.parse(textwrap.dedent(inspect.getsource(func)))
            assert ast.dump(tree) == ast.dump(expected), f"{module.__name__}.{func.__qualname__}"
    assert total > 1000 and cut > 0.9 * total

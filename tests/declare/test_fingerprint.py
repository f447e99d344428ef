"""Kernel fingerprints change with what the CUBIN depends on, and with nothing else."""
from __future__ import annotations

import importlib.util
import itertools
import sys
import textwrap
from pathlib import Path

import pytest

from ctbuild.fingerprint import kernel_fingerprint

BASE = '''
import cuda.tile as ct

SCALE = 2.0
UNUSED_CONST = 7


def unrelated():
    return 41


@ct.function
def inner(t):
    return t * SCALE


@ct.function
def helper(t):
    return inner(t) + 1.0


@ct.kernel
def kern(X, Y, TILE: ct.Constant[int]):
    bid = ct.bid(0)
    t = ct.load(X, index=(bid,), shape=(TILE,))
    ct.store(Y, index=(bid,), tile=helper(t))
'''

_counter = itertools.count()


def load(tmp_path: Path, source: str, subdir: str = "a") -> object:
    """Import ``source`` as module ``fpmod`` from a file under tmp_path/subdir."""
    folder = tmp_path / f"{subdir}{next(_counter)}"
    folder.mkdir(parents=True)
    file = folder / "fpmod.py"
    file.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location("fpmod", file)
    module = importlib.util.module_from_spec(spec)
    sys.modules["fpmod"] = module
    spec.loader.exec_module(module)
    return module


def fp(tmp_path: Path, source: str, subdir: str = "a") -> str:
    return kernel_fingerprint(load(tmp_path, source, subdir).kern)


@pytest.fixture
def base_fp(tmp_path: Path) -> str:
    return fp(tmp_path, BASE)


@pytest.mark.parametrize("old,new,why", [
    ("ct.store(Y, index=(bid,), tile=helper(t))", "ct.store(Y, index=(bid,), tile=helper(t) * 3)",
     "kernel body"),
    ("return inner(t) + 1.0", "return inner(t) + 2.0", "helper it calls"),
    ("return t * SCALE", "return t * SCALE * SCALE", "helper's helper (transitive)"),
    ("SCALE = 2.0", "SCALE = 3.0", "constant a helper reads"),
    ("SCALE = 2.0", "SCALE = 2", "constant's type"),
])
def test_fingerprint_changes(tmp_path: Path, base_fp: str, old: str, new: str, why: str) -> None:
    assert old in BASE
    assert fp(tmp_path, BASE.replace(old, new)) != base_fp, why


@pytest.mark.parametrize("old,new,why", [
    ("return 41", "return 42", "unrelated function"),
    ("UNUSED_CONST = 7", "UNUSED_CONST = 8", "constant nobody reads"),
    ("import cuda.tile as ct\n", "import cuda.tile as ct\n\n\n# a comment moves lines\n",
     "line numbers"),
])
def test_fingerprint_stable(tmp_path: Path, base_fp: str, old: str, new: str, why: str) -> None:
    assert old in BASE
    assert fp(tmp_path, BASE.replace(old, new)) == base_fp, why


def test_fingerprint_independent_of_file_location(tmp_path: Path, base_fp: str) -> None:
    assert fp(tmp_path, BASE, subdir="deep/other/place") == base_fp


def test_helper_through_module_attribute(tmp_path: Path) -> None:
    """``helpers.scale(t)`` in another module is followed like a direct call."""
    (tmp_path / "helpmod.py").write_text("import cuda.tile as ct\n\n@ct.function\n"
                                         "def scale(t):\n    return t * 2.0\n")
    sys.path.insert(0, str(tmp_path))
    try:
        src = BASE.replace("import cuda.tile as ct\n", "import cuda.tile as ct\nimport helpmod\n")
        src = src.replace("tile=helper(t))", "tile=helpmod.scale(t))")
        first = fp(tmp_path, src)
        (tmp_path / "helpmod.py").write_text("import cuda.tile as ct\n\n@ct.function\n"
                                             "def scale(t):\n    return t * 4.0\n")
        sys.modules.pop("helpmod")
        assert fp(tmp_path, src) != first
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("helpmod", None)


def test_library_modules_by_exact_package_name() -> None:
    from ctbuild.fingerprint import is_library_module
    for lib in ("math", "torch", "torch.nn.functional", "cuda.tile", "cuda.tile._ir", "numpy",
                "typing", "functools"):
        assert is_library_module(lib), lib
    for mine in ("mathx", "math_utils", "torchops", "numpyish", "typing_helpers", "cudax",
                 "myproj.math", "kernels.torch"):
        assert not is_library_module(mine), mine


def test_unstable_value_is_refused(tmp_path: Path) -> None:
    """A value whose text carries an address cannot be fingerprinted: refused, not skipped."""
    from ctbuild.fingerprint import FingerprintError
    src = BASE.replace("SCALE = 2.0", "class Opaque:\n    pass\n\n\nSCALE = Opaque()")
    with pytest.raises(FingerprintError, match="SCALE"):
        fp(tmp_path, src)


def test_stable_repr_object_is_fingerprinted(tmp_path: Path) -> None:
    src = ("from dataclasses import dataclass\n\n\n@dataclass(frozen=True)\nclass Cfg:\n"
           "    s: float\n\n\n" + BASE.replace("SCALE = 2.0", "SCALE = Cfg(2.0)")
           .replace("t * SCALE", "t * SCALE.s"))
    assert fp(tmp_path, src) != fp(tmp_path, src.replace("Cfg(2.0)", "Cfg(3.0)"))


@pytest.mark.parametrize("old,new", [
    ("@ct.kernel\ndef kern", "@ct.kernel()\ndef kern"),
    ("def helper(t):\n", "def helper(t):\n    \"\"\"A docstring.\"\"\"\n"),
])
def test_decorators_and_docstrings_do_not_count(tmp_path: Path, base_fp: str, old: str,
                                                new: str) -> None:
    assert old in BASE
    assert fp(tmp_path, BASE.replace(old, new)) == base_fp


PREPARED = (BASE.replace("@ct.kernel", "@ctbuild.autotune(space=ctbuild.Product(TILE=[16]), "
                         "grid=lambda cfg, w: (1,))\n@ct.kernel").replace(
    "import cuda.tile as ct", "import cuda.tile as ct\nimport ctbuild") + '''

LATER = 3.0  # defined below the kernel: read at the first call, not at the declaration


@ct.function
def below(t):
    return t * LATER
''').replace("tile=helper(t)", "tile=below(helper(t))")

_PREPARED_PROBE = '''
import json, sys
{torch}
import ctbuild
from ctbuild import fingerprint as F, fingerprint_source as S
sys.path.insert(0, {folder!r})
import fpmod
analysed = len(S._ANALYSED)
parsed = []
tree = S._code_tree
S._code_tree = lambda f: (parsed.append(f.__name__), tree(f))[1]
first, parsed_first = fpmod.kern.fingerprint, sorted(parsed)
S._ANALYSED.clear()
print(json.dumps({{"analysed": analysed, "parsed": parsed_first, "same": first ==
                  F.kernel_fingerprint(fpmod.kern.kernel)}}))
'''


@pytest.mark.parametrize("serving", [True, False])
def test_a_serving_process_analyses_a_kernel_at_its_declaration(tmp_path: Path,
                                                                serving: bool) -> None:
    """With torch imported (a serving process), declaring a kernel parses its source and its
    helpers defined above it; its first fingerprint then parses only what was defined below
    (and reads every value, those below the kernel included): the same fingerprint as one
    computed from scratch. A process without torch (a CLI, a compile worker) analyses nothing
    at the declaration."""
    import os

    from conftest import python_json
    (tmp_path / "fpmod.py").write_text(textwrap.dedent(PREPARED))
    code = _PREPARED_PROBE.format(torch="import torch" if serving else "", folder=str(tmp_path))
    out = python_json(code, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert out["same"]
    if serving:
        # kern and helper at the declaration; what helper calls, and what is below, later
        assert out["analysed"] == 2 and out["parsed"] == ["below", "inner"]
    else:
        assert out["analysed"] == 0 and sorted(out["parsed"]) == ["below", "helper", "inner",
                                                                  "kern"]


def test_analyses_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A program that declares kernels without end does not keep every analysis: past the
    bound the memo starts over, and fingerprints stay what they were."""
    from ctbuild import fingerprint_source as F
    monkeypatch.setattr(F, "MAX_ANALYSED", 2)
    monkeypatch.setattr(F, "_ANALYSED", {})
    first = fp(tmp_path, BASE)
    assert len(F._ANALYSED) <= 2  # kern, helper and inner were analysed: it started over
    assert fp(tmp_path, BASE) == first


def test_an_instance_reached_through_its_method_counts_by_its_state(tmp_path: Path) -> None:
    """``CFG.apply(t)`` reads ``self.s``, which no name in the kernel shows: the instance's
    state is recorded (a plain class, no dataclass, no stable repr)."""
    src = ("class Cfg:\n    def __init__(self, s):\n        self.s = s\n\n"
           "    def apply(self, t):\n        return t * self.s\n\n\n"
           + BASE.replace("SCALE = 2.0", "CFG = Cfg(2.0)").replace("t * SCALE", "CFG.apply(t)"))
    assert fp(tmp_path, src) != fp(tmp_path, src.replace("Cfg(2.0)", "Cfg(3.0)"))


def test_what_the_walk_cannot_name_marks_the_kernel(tmp_path: Path) -> None:
    """An environment variable chosen at run time cannot be named: the kernel is marked, and
    no memo can stand for what it reads (``complete`` false)."""
    from ctbuild.fingerprint import kernel_identity
    src = ("import os\nPREFIX = 'FP_'\n" + BASE).replace(
        "return t * SCALE", "return t * ct.static_eval(float(os.environ[PREFIX + 'S']))")
    _, marks = kernel_identity(load(tmp_path, src).kern)
    assert marks is not None and not marks.complete and marks.state() is None
    assert marks.note == "identity by TileIR: inner reads the environment (named at run time)"
    assert kernel_identity(load(tmp_path, BASE).kern)[1] is None

"""The kernel fingerprint, as `ctbuild plan --json` reports it, changes exactly when the code
cuTile's front end compiles can change: a corpus of edits to a small kernel package."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

FIXTURE = Path(__file__).parents[1] / "fixtures" / "identity_project"
BASE = (FIXTURE / "idkernels" / "base.py").read_text()
WORKLOAD = '{"X": Tensor((1024,), "float32"), "OUT": Tensor((1024,), "float32")}'

#: Edits inside the kernel's module: (variant, old, new, changes the fingerprint).
MODULE_EDITS = [
    ("name_only", "import ctbuild\n", "import ctbuild\n", False),  # each variant is renamed
    ("dtype_const", "ACC = ct.float32", "ACC = ct.float16", True),
    ("enum_const", "PAD = ct.PaddingMode.ZERO", "PAD = ct.PaddingMode.NAN", True),
    ("tuple_const", "OFFSETS = (1.0, 2.0)", "OFFSETS = (1.0, 4.0)", True),
    ("closure", "factor = 2.0", "factor = 5.0", True),
    ("default_arg", "def with_default(t, k=3.0):", "def with_default(t, k=4.0):", True),
    ("workload_added", f"workloads=[{WORKLOAD}]",
     f'workloads=[{WORKLOAD}, {WORKLOAD.replace("1024", "4096")}]', False),
    ("key_added", "    default=", "    key=lambda w: (w.X.shape[0],),\n    default=", False),
    ("default_changed", 'default={"TILE": 64}', 'default={"TILE": 128}', False),
    ("cap_added", "    default=", "    cap=1,\n    default=", False),
    ("comment_in_kernel", "    bid = ct.bid(0)\n",
     "    # which block this is\n\n    bid = ct.bid(0)  # a trailing comment\n", False),
]
#: Edits of helper modules (named like libraries, and two calls deep): each changes it.
HELPER_EDITS = [
    ("mathx.py", "return t * 2.0", "return t * 2.5"),
    ("torchops.py", "return leaf(t) + 1.0", "return leaf(t) + 1.5"),
    ("deephelp.py", "return t * 3.0", "return t * 3.5"),
]


def _project(root: Path, modules: list[str], paths: list[str]) -> Path:
    shutil.copytree(FIXTURE, root)
    config = root / "ctbuild.toml"
    config.write_text(f"modules = {json.dumps(modules)}\npaths = {json.dumps(paths)}\n"
                      'archs = ["sm_90"]\n')
    return config


def _plan(config: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ctbuild", "plan", "--config", str(config),
                             "--json"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _fingerprints(proc: subprocess.Popen) -> dict[str, str]:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return {k["name"]: k["fingerprint"] for k in json.loads(out)["kernels"]}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    """Plan every variant: module edits as sibling modules of one project (each renamed, which
    itself must not matter), the moved file in another directory, helper edits as projects."""
    tmp = tmp_path_factory.mktemp("identity")
    main = tmp / "main"
    shutil.copytree(FIXTURE, main)
    modules = ["idkernels.base"]
    for variant, old, new, _ in MODULE_EDITS:
        assert old in BASE, variant
        text = BASE.replace(old, new).replace('name="idk"', f'name="idk_{variant}"')
        (main / "idkernels" / f"{variant}.py").write_text(text)
        modules.append(f"idkernels.{variant}")
    moved = main / "elsewhere" / "deeper"
    moved.mkdir(parents=True)
    (moved / "idmoved.py").write_text(BASE.replace('name="idk"', 'name="idk_moved"'))
    modules.append("idmoved")
    config = main / "ctbuild.toml"
    config.write_text(f"modules = {json.dumps(modules)}\npaths = [\".\", \"elsewhere/deeper\"]\n"
                      'archs = ["sm_90"]\n')
    procs = {"main": _plan(config)}
    for file, old, new in HELPER_EDITS:
        root = tmp / file.removesuffix(".py")
        shutil.copytree(FIXTURE, root)
        text = (root / file).read_text()
        assert old in text, file
        (root / file).write_text(text.replace(old, new))
        procs[file] = _plan(root / "ctbuild.toml")
    return {name: _fingerprints(proc) for name, proc in procs.items()}


@pytest.mark.parametrize("variant,changes", [(v, c) for v, _, _, c in MODULE_EDITS])
def test_module_edit(corpus: dict[str, dict[str, str]], variant: str, changes: bool) -> None:
    fps = corpus["main"]
    assert fps["idk_name_only"] == fps["idk"]  # so a change below is the edit's, not name='s
    assert (fps[f"idk_{variant}"] != fps["idk"]) is changes


def test_moving_the_file_keeps_the_fingerprint(corpus: dict[str, dict[str, str]]) -> None:
    assert corpus["main"]["idk_moved"] == corpus["main"]["idk"]


@pytest.mark.parametrize("file", [f for f, _, _ in HELPER_EDITS])
def test_helper_module_edit_changes_it(corpus: dict[str, dict[str, str]], file: str) -> None:
    assert corpus[file]["idk"] != corpus["main"]["idk"]


# --- closure: classes, dataclasses, shadowed builtins, a module named like the stdlib's ------
CLOSURE = Path(__file__).parents[1] / "fixtures" / "identity_closure"
#: (kernel, file, old, new): each edit changes what that kernel compiles, and only its value.
CLOSURE_EDITS = [
    ("cl_classattr", "clkernels/kern.py", "    F = 2.0", "    F = 2.5"),
    ("cl_otherclass", "clconsts.py", "CAP = 4.0", "CAP = 4.5"),
    ("cl_static", "clconsts.py", "return t * 2.0", "return t * 2.5"),
    ("cl_classmethod", "clkernels/kern.py", "    G = 3.0", "    G = 3.5"),
    ("cl_dataclass", "clkernels/kern.py", "field(default=2.0)", "field(default=2.5)"),
    ("cl_builtin", "clkernels/kern.py", "return t * 3.0", "return t * 3.5"),
    ("cl_injected_builtin", "clkernels/kern.py", "CL_GAIN = 2.0", "CL_GAIN = 2.5"),
    ("cl_stdlib_name", "profile.py", "return t + 1.0", "return t + 1.5"),
    # must NOT change cl_control: an attribute it does not read, and a comment
    ("cl_control", "clkernels/kern.py", "    K = 5.0", "    K = 5.0  # the gain\n    OTHER = 1.0"),
]


@pytest.fixture(scope="module")
def closure(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], dict[str, str]]:
    """Fingerprints of the closure fixture before and after all `CLOSURE_EDITS` (each kernel
    reads only what its own edit touches, so one edited copy shows every case)."""
    tmp = tmp_path_factory.mktemp("closure")
    base, edited = tmp / "base", tmp / "edited"
    shutil.copytree(CLOSURE, base)
    shutil.copytree(CLOSURE, edited)
    for kernel, file, old, new in CLOSURE_EDITS:
        path = edited / file
        text = path.read_text()
        assert text.count(old) == 1, (kernel, old)
        path.write_text(text.replace(old, new))
    procs = [_plan(base / "ctbuild.toml"), _plan(edited / "ctbuild.toml")]
    before, after = (_fingerprints(p) for p in procs)
    return before, after


@pytest.mark.parametrize("kernel", [k for k, *_ in CLOSURE_EDITS])
def test_closure_edit(closure: tuple[dict[str, str], dict[str, str]], kernel: str) -> None:
    before, after = closure
    assert (after[kernel] != before[kernel]) is (kernel != "cl_control")

"""Identity that fails safe (issue 37): every edit kind that once kept the kernel fingerprint
while changing the compiled code now changes the fingerprint, or marks the kernel ("identity by
TileIR") where the fingerprint cannot follow it. Each edit is shown to be real: cuTile's front
end gives other TileIR after it.

One probe process per copy of the fixture (base and edited) reads every kernel's fingerprint,
its mark and its TileIR digest, through the real fingerprint and cuTile's real front end."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import ROOT

FIXTURE = Path(__file__).parents[1] / "fixtures" / "identity_failsafe"

#: (kernel, file, old, new): each edit changes what that kernel compiles, and only its code.
EDITS = [
    ("fs_getattr", "fsconsts.py", "SCALE = 2.0", "SCALE = 2.5"),
    ("fs_getattr_dynamic", "fsconsts.py", "GAIN = 3.0", "GAIN = 3.5"),
    ("fs_wraps_arg", "fshelp.py", "@scaled(2.0)", "@scaled(2.5)"),
    ("fs_wraps_body", "fsdeco.py", "return fn(t) + 1.0", "return fn(t) + 1.5"),
    ("fs_wraps_other", "fshelp.py", "return t * 3.0", "return t * 3.5"),
    ("fs_method", "fskernels/kern.py", "CFG = Cfg(scale=2.0)", "CFG = Cfg(scale=2.5)"),
    ("fs_property", "fskernels/kern.py", "PCFG = Cfg(scale=3.0)", "PCFG = Cfg(scale=3.5)"),
    ("fs_method_other", "fsconsts.py", "CFG = Cfg(scale=6.0)", "CFG = Cfg(scale=6.5)"),
    ("fs_method_classattr", "fskernels/kern.py", "CFG = Cfg(scale=4.0)", "CFG = Cfg(scale=4.5)"),
    ("fs_method_nested", "fskernels/kern.py", "inner=Cfg(scale=5.0)", "inner=Cfg(scale=5.5)"),
    ("fs_file", "scale.txt", "2.0", "2.5"),
    ("fs_installed", "site/fslib/__init__.py", "return t * 3.0", "return t * 3.5"),
    ("fs_float_subclass", "fskernels/kern.py", "GAIN = Gain(2.0)", "GAIN = Gain(2.5)"),
    ("fs_handset_wrapped", "fskernels/kern.py", "return t * 2.0\n\n\nhandset",
     "return t * 2.5\n\n\nhandset"),
]
#: Kernels the fingerprint cannot follow, and what their mark names.
MARKED = {"fs_env": "reads the environment variable FS_SCALE",
          "fs_file": "reads the file ",
          "fs_getattr_dynamic": "calls getattr with a name that is not a literal"}
#: The helper copied into site-packages: (before, after), no version bump.
SITE_HELPER = "import cuda.tile as ct\n\n\n@ct.function\ndef quad(t):\n    return t * {}\n"

#: Run with (project, site prefix): fingerprint, mark and TileIR digest of every kernel.
PROBE = r'''
import json, site, sys
site.PREFIXES.insert(0, sys.argv[2])  # a second interpreter prefix: its site-packages
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/site", *site.getsitepackages([sys.argv[2]])]
from ctbuild.project import load_project
import fskernels.sitepkg  # noqa: F401 - declares fs_sitepkg
from ctbuild.declare import registered
from ctbuild.compile.plan import job_and_signature
from ctbuild.fingerprint import by_tileir
from ctbuild.fingerprint_libraries import is_library_module
from ctbuild.tileir import digest
load_project(sys.argv[1] + "/ctbuild.toml").kernels()
out = {"fssitelib is a library": is_library_module("fssitelib")}
for k in registered():
    cfg = k.candidates(k.workloads[0], "sm_90").kept[0]
    _, sig = job_and_signature(k, cfg, k.workloads[0], "sm_90", "x")
    marks = by_tileir(k)
    out[k.name] = {"fp": k.fingerprint, "marks": marks and marks.to_json(),
                   "tileir": digest(k, cfg, sig, "sm_90")}
print(json.dumps(out))
'''


def _copy(dest: Path, scale: str) -> tuple[Path, Path]:
    """The fixture at ``dest`` and a site prefix beside it holding the site-packages helper."""
    shutil.copytree(FIXTURE, dest)
    prefix = dest.parent / f"{dest.name}-prefix"
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(prefix),
                                                       "platbase": str(prefix)}))
    (purelib / "fssitelib").mkdir(parents=True)
    (purelib / "fssitelib" / "__init__.py").write_text(SITE_HELPER.format(scale))
    return dest, prefix


def _probe(project: Path, prefix: Path, **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", PROBE, str(project), str(prefix)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **env})


def _result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict]:
    """(base, edited): every kernel's fingerprint, mark and TileIR, before and after all the
    edits (each kernel reads only what its own edit touches, so one edited copy shows every
    kind), FS_SCALE set for the edited one."""
    tmp = tmp_path_factory.mktemp("failsafe")
    base = _copy(tmp / "base", "4.0")
    edited = _copy(tmp / "edited", "4.5")
    for kernel, file, old, new in EDITS:
        path = edited[0] / file
        text = path.read_text()
        assert text.count(old) == 1, (kernel, old)
        path.write_text(text.replace(old, new))
    procs = [_probe(*base), _probe(*edited, FS_SCALE="2.5")]
    return _result(procs[0]), _result(procs[1])


@pytest.mark.parametrize("kernel", [k for k, *_ in EDITS if k not in MARKED] + ["fs_sitepkg"])
def test_the_fingerprint_follows_the_edit(corpus: tuple[dict, dict], kernel: str) -> None:
    before, after = corpus
    assert before[kernel]["tileir"] != after[kernel]["tileir"]  # the edit is a real one
    assert before[kernel]["fp"] != after[kernel]["fp"]
    assert before[kernel]["marks"] is None and after[kernel]["marks"] is None


@pytest.mark.parametrize("kernel", sorted(MARKED))
def test_what_it_cannot_follow_marks_the_kernel(corpus: tuple[dict, dict], kernel: str) -> None:
    before, after = corpus
    assert before[kernel]["tileir"] != after[kernel]["tileir"]
    for probe in corpus:
        marks = probe[kernel]["marks"]
        assert marks is not None and any(MARKED[kernel] in r for r in marks["reasons"]), marks
    if kernel == "fs_env":
        assert before[kernel]["fp"] == after[kernel]["fp"]  # why it must be marked
        assert before[kernel]["marks"]["env"] == ["FS_SCALE"]
    if kernel == "fs_file":
        assert [Path(f).name for f in before[kernel]["marks"]["files"]] == ["scale.txt"]
    assert before[kernel]["marks"]["complete"]


def test_nothing_else_changes(corpus: tuple[dict, dict]) -> None:
    before, after = corpus
    assert before["fssitelib is a library"] and after["fssitelib is a library"]
    assert before["fs_control"] == after["fs_control"]
    assert before["fs_control"]["marks"] is None

"""Caches of two cuda-tile versions never mix: the version is part of the toolchain fingerprint,
so a build under one version gives compile keys the other never looks up, and a serving node
finds no toolchain of its own version in the other's cache.

The cross-version build runs where ``OTHER_CUTILE_PYTHON`` names the Python of an environment
with the other supported cuda-tile (``make test-matrix`` sets it: 1.7.0's while this suite runs
under 1.6.0); the in-process test runs everywhere.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "fixtures" / "farm_project"))
from cli_helpers import ROOT, SMALL, explain  # noqa: E402

from ctbuild import cutile  # noqa: E402
from ctbuild.cache import Store  # noqa: E402
from ctbuild.toolchain import fingerprint_of, probe, select_recorded  # noqa: E402

OTHER_PYTHON = os.environ.get("OTHER_CUTILE_PYTHON")


def _other_series_version() -> str:
    return "1.7.0" if cutile.version().startswith("1.6.") else "1.6.0"


def test_the_cuda_tile_version_alone_separates_caches(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Same tileiras, ptxas, libnvvm and env (1.6.0 and 1.7.0 ship the same tileiras 13.4):
    only the cuda-tile version differs, and that alone gives another fingerprint, which a
    serving node of this version never selects."""
    monkeypatch.delenv("CTBUILD_TOOLCHAIN", raising=False)
    mine = probe()
    theirs = {**mine.profile, "cuda_tile": _other_series_version()}
    assert fingerprint_of(mine.profile) == mine.fingerprint
    assert fingerprint_of(theirs) != mine.fingerprint
    with Store(tmp_path / "cache") as store:
        store.put_toolchain(fingerprint_of(theirs), theirs)
        assert select_recorded(store.toolchains()) is None
        store.put_toolchain(mine.fingerprint, mine.profile)
        assert select_recorded(store.toolchains()) == mine.fingerprint


@pytest.mark.slow
@pytest.mark.skipif(not OTHER_PYTHON, reason="set OTHER_CUTILE_PYTHON to the python of an "
                    "environment with the other supported cuda-tile (make test-matrix does)")
def test_a_cache_built_under_the_other_cuda_tile_misses_here(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """A real build under the other version: none of its entries is a key this version plans,
    and the same plan keyed on its recorded toolchain finds every one (the check can fail)."""
    from ctbuild.compile.plan import make_plan
    from ctbuild.project import load_project

    monkeypatch.delenv("CTBUILD_TOOLCHAIN", raising=False)
    assert OTHER_PYTHON is not None
    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "VIRTUAL_ENV")}
    proc = subprocess.run([OTHER_PYTHON, "-m", "ctbuild", "precompile", "--config", str(SMALL),
                           "--cache", str(cache), "--json", "--workers", "1"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=540)
    assert proc.returncode == 0, explain(proc)
    built = json.loads(proc.stdout)
    with Store(cache) as store:
        profiles = store.toolchains()
        entries = dict(store.compile_entries())
    assert [p["cuda_tile"] for p in profiles.values()] == [_other_series_version()]
    assert select_recorded(profiles) is None  # a serving node of this version: no toolchain

    project = load_project(SMALL)
    kernels, archs = project.kernels(), project.archs
    here = make_plan(kernels, archs, probe().fingerprint, generic=project.generic)
    there = make_plan(kernels, archs, built["toolchain"], generic=project.generic)
    assert len(here.jobs) == len(entries) == built["compiled"] > 0
    assert set(here.jobs).isdisjoint(entries)
    assert set(there.jobs) == set(entries)

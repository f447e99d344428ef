"""`ctbuild.settings`: one order for the cache directory, used by every command and the runtime
(--cache > CTBUILD_CACHE_DIR > the project config's cache_dir > ./.ctbuild-cache), and each
says which cache it used and why, creating nothing."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import at_once, run_cli

from ctbuild import settings
from ctbuild.project import load_project

KERNEL = '''
import cuda.tile as ct
import ctbuild
from ctbuild import Product, Tensor

@ctbuild.autotune(space=Product(TILE=[64]), grid=lambda cfg, w: (1,),
                  workloads=[{"X": Tensor((64,), "float32")}])
@ct.kernel
def settings_probe(X, TILE: ct.Constant[int]):
    ct.store(X, index=(0,), tile=ct.load(X, index=(0,), shape=(TILE,)))
'''


@pytest.fixture
def layout(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """tmp/proj/ctbuild.toml (cache_dir = "built") above tmp/proj/pkg/probe_kernels.py; the
    current directory is tmp/elsewhere; no CTBUILD_* variable set."""
    for var in (settings.CACHE_DIR_ENV, settings.CONFIG_ENV):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "proj" / "pkg").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "proj" / "ctbuild.toml").write_text('modules = ["probe_kernels"]\n'
                                                    'paths = ["pkg"]\ncache_dir = "built"\n')
    (tmp_path / "proj" / "pkg" / "probe_kernels.py").write_text(KERNEL)
    monkeypatch.chdir(tmp_path / "elsewhere")
    return tmp_path


def test_cache_order_and_why(layout: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proj, toml = layout / "proj", layout / "proj" / "ctbuild.toml"
    found = settings.choose_cache(near=proj / "pkg")  # upward from the kernel's folder
    assert found.path == proj / "built" and found.why == f"cache_dir in {toml}"
    default = settings.choose_cache()  # nothing above tmp/elsewhere
    assert default.path == layout / "elsewhere" / ".ctbuild-cache"
    assert default.why.startswith("the default: no CTBUILD_CACHE_DIR")
    other = layout / "other.toml"
    other.write_text('cache_dir = "c2"\n')
    monkeypatch.setenv(settings.CONFIG_ENV, str(other))
    assert str(settings.choose_cache(near=proj)) == \
        f"{layout / 'c2'} (cache_dir in {other} (CTBUILD_CONFIG))"
    monkeypatch.setenv(settings.CACHE_DIR_ENV, "env")
    assert settings.choose_cache(near=proj).why == "CTBUILD_CACHE_DIR"
    assert settings.choose_cache("flag").path == layout / "elsewhere" / "flag"
    monkeypatch.delenv(settings.CACHE_DIR_ENV)
    monkeypatch.setenv(settings.CONFIG_ENV, str(layout / "missing.toml"))
    with pytest.raises(settings.SettingsError, match="CTBUILD_CONFIG=.*missing.toml"):
        settings.choose_cache()
    assert sorted(p.name for p in layout.rglob("*")) == sorted(
        ["proj", "pkg", "elsewhere", "ctbuild.toml", "probe_kernels.py", "other.toml"])


def test_project_cache_dir_is_relative_to_its_file(layout: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    config = layout / "proj" / "ctbuild.toml"
    assert load_project(config).cache_dir == (layout / "proj" / "built").resolve()
    assert load_project(config, cache_dir="x").cache_dir == (layout / "elsewhere" / "x")
    monkeypatch.chdir(layout / "proj" / "pkg")  # found upward from the current directory
    assert load_project().cache.why == f"cache_dir in {config}"
    monkeypatch.setenv(settings.CACHE_DIR_ENV, "e")
    assert load_project(config).cache_dir == (layout / "proj" / "pkg" / "e").resolve()


def test_runtime_and_explain_use_the_config_above_the_kernel(layout: Path) -> None:
    """The runtime finds the toml above the kernel's module (not the current directory's
    default), explain says so, and nothing is created."""
    from ctbuild import runtime
    sys.path.insert(0, str(layout / "proj" / "pkg"))
    runtime.reset()
    try:
        import probe_kernels

        from ctbuild.specs import Tensor
        got = probe_kernels.settings_probe.explain(Tensor((64,), "float32"), arch="sm_90")
        (layout / "proj" / "built").mkdir()  # an empty volume: explained, left empty
        runtime.reset()
        again = probe_kernels.settings_probe.explain(Tensor((64,), "float32"), arch="sm_90")
        assert list((layout / "proj" / "built").iterdir()) == [] and again["cache"] == got["cache"]
        (layout / "proj" / "built").rmdir()
    finally:
        sys.path.remove(str(layout / "proj" / "pkg"))
        sys.modules.pop("probe_kernels", None)
        runtime.reset()
    toml = layout / "proj" / "ctbuild.toml"
    assert got["cache"] == f"{layout / 'proj' / 'built'} (cache_dir in {toml})"
    assert got["cubin_class"] == "miss" and got["why"][0].startswith("no usable cache at")
    assert not (layout / "proj" / "built").exists()
    assert not (layout / "elsewhere" / ".ctbuild-cache").exists()


def test_doctor_and_cache_stats_say_which_cache_and_why(layout: Path) -> None:
    from ctbuild.cache import Store
    proj = layout / "proj"
    Store(proj / "built").close()
    stats, doctor, bad = at_once(
        lambda: run_cli("cache", "stats", cwd=proj / "pkg"),
        lambda: run_cli("doctor", "--serving", "--json", cwd=proj / "pkg"),
        lambda: run_cli("cache", "stats", cwd=proj, env={settings.CONFIG_ENV: str(layout / "nope")}))
    assert stats.returncode == 0, stats.stderr
    first = stats.stdout.splitlines()[0]
    assert first == f"cache        {proj / 'built'} (cache_dir in {proj / 'ctbuild.toml'}), writable"
    report = json.loads(doctor.stdout)
    assert report["cache"]["dir"] == str(proj / "built")
    assert report["cache"]["from"] == f"cache_dir in {proj / 'ctbuild.toml'}"
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "CTBUILD_CONFIG" in bad.stderr

"""`ctbuild.settings`: one order for the cache directory, used by the project loader."""
from __future__ import annotations

from pathlib import Path

import pytest

from ctbuild import settings
from ctbuild.project import load_project


def test_cache_dir_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(settings.CACHE_DIR_ENV, raising=False)
    assert settings.cache_dir() == Path(".ctbuild-cache")
    assert settings.cache_dir(config_value="c", config_base=tmp_path) == tmp_path / "c"
    monkeypatch.setenv(settings.CACHE_DIR_ENV, "")  # empty is unset
    assert settings.cache_dir(config_value="c", config_base=tmp_path) == tmp_path / "c"
    monkeypatch.setenv(settings.CACHE_DIR_ENV, "/env")
    assert settings.cache_dir(config_value="c", config_base=tmp_path) == Path("/env")
    assert settings.cache_dir("flag", config_value="c") == Path("flag")


def test_project_cache_dir_is_relative_to_its_file(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    monkeypatch.delenv(settings.CACHE_DIR_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "proj").mkdir()
    config = tmp_path / "proj" / "ctbuild.toml"
    config.write_text('modules = ["k"]\ncache_dir = "cache"\n')
    assert load_project(config).cache_dir == (tmp_path / "proj" / "cache").resolve()
    assert load_project(config, cache_dir="x").cache_dir == (tmp_path / "x").resolve()
    monkeypatch.setenv(settings.CACHE_DIR_ENV, "e")
    assert load_project(config).cache_dir == (tmp_path / "e").resolve()

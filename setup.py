"""The package's one C module, the hot path's C form (`ctbuild/serve/hot_path.py`).

Everything else is declared in pyproject.toml. The module is optional: where no C compiler or
no Python headers are found it is skipped with a warning, and the runtime uses the Python form.
"""
from setuptools import Extension, setup

#: The module's source files, one concern each (`ctbuild/serve/_fast_path.c` lists them); the
#: Makefile's install stamp depends on the same files.
SOURCES = [f"ctbuild/serve/_fast_path{part}.c" for part in ("", "_layout", "_check", "_table",
                                                            "_call")]

setup(ext_modules=[Extension("ctbuild.serve._fast_path", SOURCES,
                             depends=[f"ctbuild/serve/_fast_path{h}.h" for h in ("", "_layout")],
                             optional=True)])

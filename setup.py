"""The package's one C module, the hot path's C form (`ctbuild/serve/hot_path.py`).

Everything else is declared in pyproject.toml. The module is optional: where no C compiler or
no Python headers are found it is skipped with a warning, and the runtime uses the Python form.
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("ctbuild.serve._fast_path", ["ctbuild/serve/_fast_path.c"],
                             optional=True)])

"""``python -m ctbuild`` is the ``ctbuild`` command."""
from .cli import run

run()

"""``python -m ctbuild`` is the ``ctbuild`` command."""
import sys

from .cli import main

sys.exit(main())

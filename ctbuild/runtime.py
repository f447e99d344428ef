"""The runtime's public controls: ``from ctbuild import runtime; runtime.configure(...)``.

The serving code lives in `ctbuild.serve`; this name (documented, and the name of the
``ctbuild.runtime`` logger) stays stable for users."""
from .serve.kernel_runtime import *  # noqa: F403
from .serve.kernel_runtime import __all__  # noqa: F401

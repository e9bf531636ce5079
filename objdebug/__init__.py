"""objdebug: diagnose MindSpore training objectives before training on them."""

__version__ = "0.1.0"

from objdebug.core.errors import ObjdebugError, InputError  # noqa: E402

__all__ = ["__version__", "ObjdebugError", "InputError"]

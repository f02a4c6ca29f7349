"""Real models: the zoo built in code with TVM Relax, and model packages.

Importing this package does not import TVM; ``compile_model`` does.
"""

from clockwork.models.package import PackageError, compile_model, read_package
from clockwork.models.zoo import ZOO, get_model

__all__ = ["PackageError", "ZOO", "compile_model", "get_model", "read_package"]

"""How to install an optional part of Clockwork-py (an extra of ``pyproject.toml``), said
the same way by every message that needs one. The package is installed from a checkout
of its repository (it is not on PyPI), so the hint is a command to run there."""

from __future__ import annotations


def pip_extra(*extras: str) -> str:
    """``pip install -e '.[tvm]' in your clockwork-py checkout``; several extras are
    alternatives (``'.[cuda12]' or '.[cuda13]'``); none: the base install."""
    if not extras:
        return "pip install -e . in your clockwork-py checkout"
    alts = " or ".join(f"'.[{e}]'" for e in extras)
    return f"pip install -e {alts} in your clockwork-py checkout"

"""File names that are not UTF-8. Python gives each byte of such a name (read from the
file system or the command line) as a lone surrogate (``surrogateescape``), which no
UTF-8 text can hold: these are its bytes again, and the name as text files and JSON can
hold it, each such byte written ``\\xNN``."""

from __future__ import annotations


def name_bytes(text: str) -> bytes:
    """``text`` as the bytes it stands for (where ``text.encode()`` fails)."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # (a lone surrogate of another origin)
        return text.encode("utf-8", "surrogatepass")


def printable(text: str) -> str:
    """``text`` as it is if it is valid UTF-8, else with each byte that is not written
    ``\\xNN``."""
    try:
        text.encode()
        return text
    except UnicodeEncodeError:
        return name_bytes(text).decode("utf-8", "backslashreplace")

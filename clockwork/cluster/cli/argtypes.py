"""Validated argument types for the command line: each turns a string into a value or
raises ``argparse.ArgumentTypeError`` with a message that names what is expected."""

from __future__ import annotations

import argparse
import functools
import math
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def _file_system(check: Callable[..., T]) -> Callable[..., T]:
    """``check`` (a path's type), with an error the file system gives while looking at
    the path (a name longer than it allows, say) as a usage error naming the path, not a
    traceback (argparse turns only ``ArgumentTypeError``, ``TypeError`` and
    ``ValueError`` into usage errors)."""

    @functools.wraps(check)
    def checked(text: str, *args, **kw) -> T:
        nonempty_path(text)
        try:
            return check(text, *args, **kw)
        except OSError as e:
            raise argparse.ArgumentTypeError(f"{text!r}: {e.strerror or e}") from None

    return checked


def _not_blank(text: str, what: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return text


def nonempty_path(text: str) -> str:
    """A path given as text: anything but empty (or blanks). ``Path("")`` is the current
    folder, so an empty ``--out`` would otherwise pass as one, or read as none given."""
    return _not_blank(text, "a path")


def nonempty(text: str) -> str:
    """Any text but an empty one (or blanks): a name an option needs, which an empty
    value would otherwise leave to the default without a word."""
    return _not_blank(text, "a name")


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return v


def listen_host(text: str) -> str:
    """``--host``: a name or an address to bind, an IPv6 one with or without brackets
    (``::1``, ``[::1]``): the host itself, without them."""
    host = text.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or any(c in host for c in "[]/ "):
        raise argparse.ArgumentTypeError(f"expected a host name or an address to bind "
                                         f"(IPv6 with or without brackets), got {text!r}")
    return host


def positive_int(text: str) -> int:
    v = _int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return v


def int_in(lo: int, hi: int) -> Callable[[str], int]:
    """A type for an integer from ``lo`` to ``hi``."""

    def bounded(text: str) -> int:
        v = _int(text)
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"must be an integer from {lo:,} to {hi:,}, "
                                             f"got {text!r}")
        return v

    return bounded


def nonneg_int(text: str) -> int:
    v = _int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return v


def seed(text: str) -> int:
    """A random seed: 0 to ``MAX_SEED`` (2^63 - 1), as a scenario's ``seed``."""
    from clockwork.sizes import MAX_SEED

    v = _int(text)
    if not 0 <= v <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be an integer from 0 to 2^63 - 1, got {text!r}")
    return v


def model_name(text: str) -> str:
    """A model's name as the repository takes it (``clockwork.names``)."""
    from clockwork.names import BASE_NAME, BASE_NAME_RULE

    if not BASE_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a model name: {BASE_NAME_RULE}")
    return text


def port(text: str) -> int:
    """A TCP port to listen on: 1-65535, or 0 to let the system pick one."""
    v = _int(text)
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port 0-65535 (0: pick one), got {text!r}")
    return v


def optional_port(text: str) -> int:
    """A port, 0 to pick one, or -1 to turn the listener off."""
    v = _int(text)
    if not -1 <= v <= 65535:
        raise argparse.ArgumentTypeError(
            f"must be a port 0-65535 (0: pick one, -1: off), got {text!r}")
    return v


def pacing_interval_us(text: str) -> float:
    """A pacing interval in microseconds: from 0 (off) to a second (a unit slip, 1e7 for
    10 ms, held LOAD results and failed INFERs for 10 s each under load)."""
    v = _float(text)
    if not 0 <= v <= 1e6:
        raise argparse.ArgumentTypeError(f"must be a number of microseconds from 0 (off) to "
                                         f"1000000 (a second), got {text!r}")
    return v


def nonneg_float(text: str) -> float:
    v = _float(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return v


def positive_float(text: str) -> float:
    v = _float(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return v


def slow_factor(text: str) -> float:
    """An emulated straggler's factor: from 1 to ``MAX_SLOW_FACTOR`` (as a scenario's
    ``cluster.slow_factor``: below 1 a straggler would be faster)."""
    from clockwork.sizes import MAX_SLOW_FACTOR

    return _float_in(text, 1, MAX_SLOW_FACTOR)


def noise(text: str) -> float:
    """An emulated duration noise: from 0 to ``MAX_NOISE`` (as ``cluster.noise``)."""
    from clockwork.sizes import MAX_NOISE

    return _float_in(text, 0, MAX_NOISE)


def _float_in(text: str, lo: float, hi: float) -> float:
    v = _float(text)
    if not lo <= v <= hi:
        raise argparse.ArgumentTypeError(f"must be a number from {lo:g} to {hi:g}, got "
                                         f"{text!r}")
    return v


def slo_ms(text: str) -> float:
    """An SLO in ms: > 0 and at most a day (what the controller takes)."""
    from clockwork.time import MAX_SLO_MS

    v = positive_float(text)
    if v > MAX_SLO_MS:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_SLO_MS:.0f} (a day), got "
                                         f"{text!r}")
    return v


def timeline_seconds(text: str) -> float:
    """``report --timeline``'s optional interval: as ``positive_float``, and a value that
    is not a number is taken for the run folder given after the option."""
    try:
        float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number, got {text!r}; give the run folder before --timeline "
            "(clockwork report DIR --timeline [SECONDS])") from None
    from clockwork.telemetry import TIMELINE_MIN_S

    v = positive_float(text)
    if v < TIMELINE_MIN_S:  # (said before the logs are read, not after)
        raise argparse.ArgumentTypeError(f"must be at least {TIMELINE_MIN_S:g} s, got {text!r}")
    return v


def float_in(lo: float, hi: float) -> Callable[[str], float]:
    """A type for a finite number from ``lo`` to ``hi``."""

    def bounded(text: str) -> float:
        v = _float(text)
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"must be a number from {lo:g} to {hi:g}, "
                                             f"got {text!r}")
        return v

    return bounded


def probability(text: str) -> float:
    v = _float(text)
    if not 0 <= v <= 1:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1], got {text!r}")
    return v


def address(text: str) -> str:
    """``host:port`` with a port 1-65535 (an IPv6 address in brackets): the rule of
    ``clockwork.protocol.addresses.split``, which a running controller's AddWorker uses."""
    from clockwork.protocol.addresses import canonical

    try:
        return canonical(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).replace("worker address ", "")) from None


def controller_url(text: str) -> str:
    """A controller's address as ``clockwork.Client`` takes it (``HOST:PORT``, optionally
    after ``grpc://`` or ``grpcs://``): the client's own rule."""
    from clockwork.client import controller_address

    try:
        controller_address(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def ray_address(text: str) -> str:
    """A Ray cluster to attach to: ``auto``, ``local`` (start one), ``host:port`` or
    ``ray://host:port``."""
    text = text.strip()
    if text in ("auto", "local"):
        return text
    try:
        return ("ray://" + address(text[6:])) if text.startswith("ray://") else address(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected a Ray address (auto, HOST:PORT or ray://HOST:PORT), got {text!r}; "
            "give the scenario before --ray") from None


def address_list(text: str) -> list[str]:
    """``host:port,host:port,...`` (at least one)."""
    items = [w for w in (x.strip() for x in text.split(",")) if w]
    if not items:
        raise argparse.ArgumentTypeError("expected host:port[,host:port...], got nothing")
    out = [address(w) for w in items]
    for i, a in enumerate(out):
        if a in out[:i]:
            raise argparse.ArgumentTypeError(f"{items[i]!r} is listed twice: list each once")
    return out


def readable_file(text: str) -> str:
    """A path to a file this process can read (a certificate, a key, a token)."""
    import os

    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a folder, not a file")
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"no such file: {text!r}")
    if not os.access(text, os.R_OK):
        raise argparse.ArgumentTypeError(f"cannot read {text!r} (permissions)")
    return text


def _pem(text: str, marker: bytes, what: str) -> str:
    """A readable file holding a PEM block whose BEGIN line has ``marker``: a file of
    anything else failed later with gRPC's own words (a client: "could not reach the
    controller", as if it were down)."""
    readable_file(text)
    try:
        with open(text, "rb") as f:
            head = f.read(1 << 20)
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot read {text!r} ({e.strerror or e})") from None
    if not any(marker in line for line in head.splitlines()
               if line.startswith(b"-----BEGIN ")):
        raise argparse.ArgumentTypeError(f"{text!r} is not a PEM {what} (no "
                                         f"'-----BEGIN ...{marker.decode()}-----' line)")
    return text


@_file_system
def pem_certificate(text: str) -> str:
    """A PEM file of certificates (a chain, or a CA's)."""
    return _pem(text, b"CERTIFICATE", "certificate")


@_file_system
def pem_key(text: str) -> str:
    """A PEM file of a private key."""
    return _pem(text, b"PRIVATE KEY", "private key")


@_file_system
def settings_file(text: str) -> str:
    """A settings file (``controller --settings``): an existing file as given, else a
    shipped scenario by name -- ``clockwork.resources.resolve_scenario``, the lookup of
    ``clockwork simulate NAME`` -- as the path of its file. A ``.json`` name that is
    not a file stays as given (the controller says it cannot read it)."""
    import os

    if os.path.isfile(text) or text.endswith(".json"):
        return text
    from clockwork.errors import ScenarioError
    from clockwork.resources import resolve_scenario

    try:
        return str(resolve_scenario(text))
    except ScenarioError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def in_dir(text: str) -> str:
    """An existing folder to read from."""
    import os

    nonempty_path(text)
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"no such folder: {text!r}")
    return text


def _can_write_into(folder) -> bool:
    """Whether this process can make a file in ``folder``: tried (a nameless temporary
    file, gone once closed): ``os.access`` says yes to root where nothing can be made
    (in ``/proc``, say)."""
    import tempfile

    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError:
        return False
    return True


def _makeable(path, text: str, what: str, write: bool = True) -> None:
    """ArgumentTypeError unless ``path`` (not there yet) could be made: its nearest
    existing parent is a folder (``write``: one this process can write into)."""
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"cannot make {what} {text!r}: {str(parent)!r} is "
                                         "not a folder")
    if write and not _can_write_into(parent):
        raise argparse.ArgumentTypeError(f"cannot make {what} {text!r}: cannot write into "
                                         f"{str(parent)!r} (permissions)")


@_file_system
def out_dir(text: str, write: bool = True) -> str:
    """A folder to write into: one this process can write, or one it can make. Checked
    before anything runs, so that a run is not lost to a path it cannot write at the end.
    With ``write`` False (a folder only looked at, as by ``sweep --list``) it need not be
    writable: only not a file, nor under one."""
    from pathlib import Path

    p = Path(text)
    if p.exists():
        if not p.is_dir():
            raise argparse.ArgumentTypeError(f"{text!r} exists and is not a folder")
        if write and not _can_write_into(p):
            raise argparse.ArgumentTypeError(f"cannot write into {text!r} (permissions)")
    else:
        _makeable(p, text, "folder", write)
    return text


@_file_system
def out_file(text: str) -> str:
    """A file to write: one this process can overwrite, or one it can make (with its
    folders)."""
    import os
    from pathlib import Path

    p = Path(text)
    if p.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; expected a file name")
    if p.exists():
        if not os.access(p, os.W_OK):
            raise argparse.ArgumentTypeError(f"cannot write {text!r} (permissions)")
    else:
        _makeable(p, text, "file")
    return text


def figure_file(text: str) -> str:
    """A file to draw a figure into (``plan --plot``): as ``out_file``, and named with an
    extension matplotlib saves (``.png``, ``.pdf``, ``.svg``, ...), so that a run is not
    lost to a format refused at the end. Imports matplotlib (only when the option is
    given; without it, the file is not checked further)."""
    from pathlib import Path

    out_file(text)
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:  # (the verb says what to install: parallel.check_parts)
        return text
    formats = sorted(FigureCanvasBase.get_supported_filetypes())
    ext = Path(text).suffix[1:]
    if ext.lower() not in formats:
        what = f"format {ext!r} is not supported" if ext else "no extension"
        raise argparse.ArgumentTypeError(
            f"{text!r}: {what}; name the file .FORMAT, one of {', '.join(formats)}")
    return text


def one_of(*names: str) -> Callable[[str], str]:
    """A type for one of ``names`` (for the items of a ``comma_list``; a lone option has
    ``choices``)."""

    def name(text: str) -> str:
        if text not in names:
            raise argparse.ArgumentTypeError(
                f"expected one of {', '.join(names)}, got {text!r}")
        return text

    return name


def comma_list(item: Callable[[str], T]) -> Callable[[str], list[T]]:
    """A type for ``A,B,...``: at least one item, each turned into a value by the type
    ``item``; the order and any repeats are kept, empty items skipped."""

    def items(text: str) -> list[T]:
        words = [w for w in (x.strip() for x in text.split(",")) if w]
        if not words:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list, got nothing in {text!r}")
        return [item(w) for w in words]

    return items


def batch_sizes(text: str) -> list[int]:
    try:
        sizes = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"batch sizes must be integers, e.g. 1,2,4, got {text!r}") from None
    if not sizes or sizes[0] < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be integers >= 1, got {text!r}")
    from clockwork.sizes import MAX_BATCH_SIZE

    if sizes[-1] > MAX_BATCH_SIZE:
        raise argparse.ArgumentTypeError(f"batch sizes must be at most {MAX_BATCH_SIZE:,}, "
                                         f"got {sizes[-1]:,}")
    return sizes

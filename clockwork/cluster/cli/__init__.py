"""The ``clockwork`` command.

Argument parsing (:mod:`clockwork.cluster.cli.verbs`) needs only the standard library; each verb's
implementation is imported when that verb runs. So ``clockwork --help`` and every
``clockwork VERB --help`` always work, and a verb whose optional part is missing or broken
says in one line what to install (exit 2) instead of taking the other verbs down with it.
Every usage error is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

EPILOG = """examples:
  clockwork scenarios                                  # the shipped scenarios
  clockwork simulate fig5_1gpu
  clockwork simulate poisson_warm --set duration_s=10 --out runs/p
  clockwork report runs/p
  clockwork sweep example --jobs 2                     # a grid of simulations in parallel
  clockwork serve demo_live --replay                   # live cluster on this machine
"""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: ``clockwork VERB: what is wrong``."""

    def error(self, message: str):  # noqa: D102 - argparse API
        hint = f" (see {self.prog} --help)"
        self.exit(2, f"{self.prog}: {message}{hint}\n")


class _Version(argparse.Action):
    """``--version``: the installed package's version (looked up only when asked)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="print the installed clockwork-py version and exit"):
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("clockwork-py")
        except PackageNotFoundError:  # imported from a source tree that is not installed
            from clockwork import __version__

            v = f"{__version__} (not installed)"
        try:
            print(f"clockwork {v}", flush=True)
        except BrokenPipeError:  # (| true): nothing to say it to
            pass
        except OSError as e:  # (> /dev/full)
            parser.exit(1, f"clockwork: cannot write the version: {e.strerror or e}\n")
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    from clockwork.cluster.cli.verbs import VERBS

    p = Parser(
        prog="clockwork",
        description="Clockwork-py: DNN model serving with predictable tail latency.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action=_Version)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for add in VERBS:
        add(sub)
    return p


def _missing(verb: str, e: ImportError) -> str:
    from clockwork.cluster.cli.verbs import NEEDS

    top = (getattr(e, "name", None) or "").split(".")[0]
    if top in NEEDS:
        return f"clockwork {verb}: needs {NEEDS[top]}"
    return f"clockwork {verb}: cannot load its implementation ({type(e).__name__}: {e})"


def _load(verb: str, impl: str, requires: tuple = ()):
    """The function behind ``module:function``, or an error line."""
    module, _, func = impl.partition(":")
    try:
        for name in requires:
            importlib.import_module(name)
        mod = importlib.import_module(module)
    except ImportError as e:
        return None, _missing(verb, e)
    except Exception as e:  # noqa: BLE001 - e.g. a protobuf runtime that refuses the modules
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return None, f"clockwork {verb}: cannot load its implementation ({type(e).__name__}: {first})"
    return getattr(mod, func), None


def _subparser_help(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """Print the help of the deepest (sub)command named in argv."""
    try:
        parser.parse_args([*argv, "--help"])
    except SystemExit:
        pass


def _named(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The deepest (sub)command parser ``args`` went through."""
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        name = getattr(args, subs[0].dest, None) if subs else None
        if name is None or name not in subs[0].choices:
            return parser
        parser = subs[0].choices[name]


LOG_TIME_ENV = "CLOCKWORK_LOG_TIME"  # set (not 0): controller and worker lines begin timed


def main(argv: list[str] | None = None) -> int:
    # gRPC's own log lines (a failed TLS handshake: "I1205 ... ssl_transport_security.cc
    # ... Handshake failed") said before ours, which say what happened; its errors still
    # show (the children inherit it; an explicit GRPC_VERBOSITY wins)
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    # No verb does linear algebra worth threads (TVM runs models on its own pool), and
    # numpy's OpenBLAS starts a thread per core at import, each spinning ~0.1 s of CPU:
    # 1.5-2 s a process on a 16-core host, paid by every simulation of a sweep and every
    # worker. One thread, before any verb imports numpy (the children inherit it; an
    # explicit OPENBLAS_NUM_THREADS wins).
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from clockwork.cluster.cli.streams import standard_streams

    standard_streams()  # (one closed: /dev/null, not a traceback at the first print)
    try:
        os.getcwd()
    except FileNotFoundError:  # (every relative path, the ./profiles lookup included,
        # failed later with "[Errno 2] No such file or directory" or "(permissions)")
        print("clockwork: the current folder no longer exists (it was removed): change to "
              "another one", file=sys.stderr)
        return 2
    argv = list(sys.argv[1:] if argv is None else argv)
    try:  # (the arguments' checks import modules, gRPC's among them: a tenth of a second)
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        if extra:  # said by the (sub)command they were given to, not by "clockwork"
            _named(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as e:
        return int(e.code or 0)
    except KeyboardInterrupt:  # (Ctrl-C as it starts: the same line, not a traceback)
        print("interrupted", file=sys.stderr)
        return 130
    impl = getattr(args, "impl", None)
    if not args.command:
        parser.print_help()
        return 2
    if not impl:  # a verb with subcommands, none given
        _subparser_help(parser, [args.command])
        return 2
    from clockwork.cluster.cli.streams import ReaderSafe

    out, err_stream = sys.stdout, sys.stderr
    # the processes an operator runs for long, by hand: their log lines timed, if asked
    stamp = (args.command in ("controller", "worker")
             and os.environ.get(LOG_TIME_ENV, "") not in ("", "0"))
    sys.stdout, sys.stderr = ReaderSafe(out), ReaderSafe(err_stream, any_error=True,
                                                         stamp=stamp)
    try:
        # (Ctrl-C while the verb's modules load, a second or so for some: the same line)
        func, err = _load(args.command, impl, getattr(args, "requires", ()))
        if func is None:
            print(err, file=sys.stderr)
            return 2
        return int(func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # (a pipe of its own, not stdout or stderr)
        return 0
    except OSError as e:  # a file or folder it could not read or write (one line, no traceback)
        print(f"clockwork {args.command}: {os_error(e)}", file=sys.stderr)
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = out, err_stream


def os_error(e: OSError) -> str:
    """An ``OSError`` in one line: ``PATH: what the system said`` where it names a file
    (``[Errno 28] No space left on device: '/x/requests.tsv'`` before), else as Python
    writes it."""
    names = [n for n in (e.filename, e.filename2) if isinstance(n, str | bytes | os.PathLike)]
    if not names or not e.strerror:  # (also a descriptor's number: as Python writes it)
        return str(e)
    from clockwork.filenames import printable

    return f"{' -> '.join(printable(os.fsdecode(n)) for n in names)}: {e.strerror}"


if __name__ == "__main__":
    sys.exit(main())

"""``clockwork compile`` and ``clockwork profile`` (need TVM: the ``tvm`` extra).

Both take a zoo model name or the path of an ONNX file (``*.onnx``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from clockwork.extras import pip_extra
from clockwork.sizes import DEFAULT_BATCH_SIZES

# TVM targets (TVM 0.27 takes a JSON target for CUDA; == worker.devices.cuda.CUDA_TARGET)
DEVICES = {"cpu": "llvm", "cuda": '{"kind": "cuda", "arch": "sm_90"}'}


def is_onnx(model: str) -> bool:
    """A model argument names an ONNX file (``*.onnx``, or any existing file) rather than
    a zoo model."""
    return model.lower().endswith(".onnx") or Path(model).is_file()


def model_name(cmd: str, args: argparse.Namespace) -> str | None:
    """The name of the model ``args.model`` makes: a zoo model's own, else ``--name`` or
    the ONNX file's stem, which must be a name the repository takes; None (after saying
    why on stderr) if it is not."""
    from clockwork.cluster.cli.argtypes import model_name as checked

    if not is_onnx(args.model):
        if args.name is not None:
            print(f"clockwork {cmd}: --name is for an ONNX file (a zoo model keeps its "
                  "name)", file=sys.stderr)
            return None
        return args.model
    if args.name is not None:
        return args.name
    try:
        return checked(Path(args.model).stem)
    except argparse.ArgumentTypeError as e:  # (what --name is checked by)
        print(f"clockwork {cmd}: the file's stem {e}; give one with --name", file=sys.stderr)
        return None


def _build(cmd: str, model: str, batch_sizes: list[int], out: Path, device: str,
           seed: int = 0, name: str | None = None) -> Path | None:
    """Compile zoo model or ONNX file ``model`` (named ``name``) into ``out``; None
    (after saying why on stderr) if it cannot be."""
    from clockwork.models.package import PackageError, compile_model
    from clockwork.models.zoo import ZOO

    if is_onnx(model):
        try:
            from clockwork.models.onnx_import import compile_onnx
        except ImportError as e:  # the onnx package itself is missing
            print(f"clockwork {cmd}: importing ONNX needs the onnx package "
                  f"({pip_extra('tvm')}): {e}", file=sys.stderr)
            return None
        try:
            return compile_onnx(model, batch_sizes, out, target=DEVICES[device],
                                model_name=name)
        except PackageError as e:
            print(f"clockwork {cmd}: {e}", file=sys.stderr)
            return None
    if model not in ZOO:
        print(f"clockwork {cmd}: unknown model {model!r}; zoo: {', '.join(sorted(ZOO))} "
              "(or an ONNX file, path/to/model.onnx)", file=sys.stderr)
        return None
    return compile_model(model, batch_sizes, out, target=DEVICES[device], seed=seed)


def _check_device(cmd: str, device: str, compiles: bool = True) -> bool:
    """cpu: always; cuda: compiling needs TVM's CUDA code generator (cross-compiles without
    a GPU), profile needs the GPU itself. Prints why not and returns False."""
    from worker.devices.cuda import check_cli_device

    return check_cli_device(cmd, device, compiles)


def cmd_compile(args: argparse.Namespace) -> int:
    if not _check_device("compile", args.device):
        return 2
    name = model_name("compile", args)
    if name is None:
        return 2
    out = Path(args.out) if args.out else Path("packages") / args.device / name
    if _build("compile", args.model, args.batch_sizes, out, args.device, args.seed,
              name) is None:
        return 2
    print(f"wrote {out}/ (model.so, weights.bin, model.json)", file=sys.stderr)
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    from clockwork.signals import term_as_ctrl_c

    with term_as_ctrl_c():  # (its temporary folder, and the package built there, go)
        return _profile(args)


def _profile(args: argparse.Namespace) -> int:
    import tempfile

    from clockwork.models.package import PackageError
    from clockwork.profiles import save_profile
    from worker.devices.base import DeviceError
    from worker.profiling import profile_package

    if not _check_device("profile", args.device, compiles=args.package is None):
        return 2
    with tempfile.TemporaryDirectory(prefix="clockwork-profile-") as tmp:
        package = Path(args.package) if args.package else None
        if package is not None and args.batch_sizes is not None:  # (said, not silent)
            print("clockwork profile: warning: --batch-sizes is for a model it compiles; "
                  "the --package is measured at the batch sizes it was compiled for "
                  "(compile it again with --batch-sizes to change them)", file=sys.stderr)
        if package is not None and args.name is not None:
            print("clockwork profile: --name names an ONNX model it compiles; a --package "
                  "keeps the name in its model.json", file=sys.stderr)
            return 2
        if package is not None:
            held = _package_model(package)
            named = Path(args.model).stem if args.model.endswith(".onnx") else args.model
            if held is not None and held not in (args.model, named):
                # (its profile is written under the package's model name: another model's)
                print(f"clockwork profile: the package {package} holds model {held!r}, not "
                      f"{args.model!r} (name the model it holds, or leave --package out to "
                      f"compile {args.model!r})", file=sys.stderr)
                return 2
        # (before anything is measured: where it would be written)
        why = _shipped_target(Path(args.out).parent if args.out
                              else Path("profiles") / args.device)
        if why:
            print(f"clockwork profile: {why}", file=sys.stderr)
            return 2
        if package is None:
            name = model_name("profile", args)
            if name is None:
                return 2
        else:
            name = held
        why = _other_profile_of(Path(args.out), name) if args.out and name else None
        if why:  # (before anything is measured, where the model's name is known)
            print(f"clockwork profile: {why}", file=sys.stderr)
            return 2
        if package is None:
            package = _build("profile", args.model,
                             args.batch_sizes or list(DEFAULT_BATCH_SIZES),
                             Path(tmp) / "package", args.device, name=name)
            if package is None:
                return 2
        try:
            prof = profile_package(package, runs=args.runs, load_runs=args.load_runs,
                                   device=args.device, progress=lambda text: print(
                                       f"clockwork profile: {text}", file=sys.stderr,
                                       flush=True))
        except (PackageError, DeviceError, KeyError) as e:  # a package it cannot run
            why = f"model.json has no {e}" if isinstance(e, KeyError) else e
            print(f"clockwork profile: {package}: {why}", file=sys.stderr)
            return 2
    out = Path(args.out) if args.out else Path("profiles") / args.device / f"{prof.model}.json"
    why = _other_profile_of(out, prof.model)
    if why:
        print(f"clockwork profile: {why}", file=sys.stderr)
        return 2
    started = _start_set(out.parent, prof.model)
    save_profile(prof, out)
    if started:
        print(f"clockwork profile: {started}", file=sys.stderr)
    figures = ", ".join(f"b{b} {v / 1e6:.3f}" for b, v in prof.exec_ns.items())
    print(f"wrote {out}: load {prof.load_ns / 1e6:.3f} ms, exec (p99, ms) {figures}",
          file=sys.stderr)
    unreached = _unreached(out.parent)
    if unreached:
        print(f"clockwork profile: warning: {unreached}", file=sys.stderr)
    return 0


def _other_profile_of(out: Path, model: str) -> str | None:
    """Why the profile of ``model`` must not be written to ``out``: another file of its
    folder holds that model's profile already (a set holds one profile a model: every
    run of it was refused, naming both files); None otherwise."""
    import json

    folder = out.parent
    if not folder.is_dir():
        return None
    for f in sorted(folder.glob("*.json")):
        if f.name == "set.json" or f.resolve() == out.resolve():
            continue
        try:
            other = json.loads(f.read_bytes()).get("model")
        except (OSError, ValueError, AttributeError):
            continue
        if other == model:
            return (f"{f} holds a profile of model {model!r} already, and a profile set "
                    f"holds one profile per model: write over it (--out {f}) or remove it first")
    return None


def _shipped_target(folder: Path) -> str | None:
    """Why a profile must not be written into ``folder``: it is (or links to) a profile
    set shipped inside the package, which every ``--profiles`` run of it reads (in a
    checkout ``profiles/cpu`` links there: the figures measured on the development machine
    were replaced by this machine's); None otherwise."""
    from clockwork.resources import profiles_root

    shipped = profiles_root().resolve()
    where = folder.resolve()
    parts = where.parts  # (or another checkout's shipped sets: a clone run with this one's
    # installed package, whose profiles/cpu links into the clone's own data)
    in_data = any(parts[i:i + 3] == ("clockwork", "data", "profiles")
                  and Path(*parts[:i + 1], "__init__.py").is_file() for i in range(len(parts)))
    if where != shipped and shipped not in where.parents and not in_data:
        return None
    return (f"{folder} is the profile set shipped with clockwork ({where}): writing there "
            "would change the figures every run of it reads; give --out FILE in a folder "
            "of your own (--out my-profiles/cpu/MODEL.json, then --profiles my-profiles/cpu"
            "), or run from a folder outside the checkout, where profiles/DEVICE/ starts as "
            "a copy of the shipped set")


def _package_model(package: Path) -> str | None:
    """The model a package says it holds (its model.json's ``model``); None where that
    cannot be read (profiling it then says why)."""
    from clockwork.models.package import PackageError, read_package

    try:
        return str(read_package(package)["model"])
    except (PackageError, OSError, KeyError, ValueError):
        return None


def _named_folder(folder: Path) -> bool:
    """Whether ``folder`` is where a profile set is looked up by its name (``<root>/<name>``
    for a root of ``clockwork.profiles.profile_roots()``: ``$CLOCKWORK_PROFILES``,
    ``./profiles``, ...)."""
    from clockwork.profiles import profile_roots

    where = folder.resolve()
    return any((root / folder.name).resolve() == where for root in profile_roots())


def _start_set(folder: Path, model: str) -> str | None:
    """A profile written into a new folder where sets are looked up by name -- the default
    ``profiles/DEVICE/``, which ``--profiles DEVICE`` reads before the shipped set -- would
    make a set of that one model that hides the whole set of the name (the shipped ``cpu``:
    its other models, its ``set.json``). So such a folder starts as a copy of the set the
    name finds now (but ``model``'s own file). Returns what it did in words, or None (the
    folder exists, is not found by name, or no set has the name)."""
    import shutil

    from clockwork.profiles import ProfileError, load_profile, load_profile_set

    if folder.exists() or not _named_folder(folder):
        return None
    try:
        found = load_profile_set(folder.name)
    except ProfileError:
        return None
    folder.mkdir(parents=True)
    n = 0
    for f in sorted(found.path.glob("*.json")):
        if f.name != "set.json":
            if load_profile(f).model == model:
                continue
            n += 1
        shutil.copyfile(f, folder / f.name)
    return (f"{folder}/ is new: started it as a copy of profile set {found.name!r} "
            f"({found.path}: {n} other profile(s) and its set.json), so that --profiles "
            f"{folder.name} keeps every model beside the new {model}")


def _unreached(folder: Path) -> str | None:
    """Why ``--profiles NAME`` does not read the set in ``folder`` (NAME its name; another
    root, e.g. ``$CLOCKWORK_PROFILES``, has a set of that name first), or None."""
    from clockwork.profiles import ProfileError, load_profile_set

    if not _named_folder(folder):
        return None
    try:
        found = load_profile_set(folder.name).path
    except ProfileError:
        return None
    if found.resolve() == folder.resolve():
        return None
    return (f"--profiles {folder.name} finds the set {found} first ($CLOCKWORK_PROFILES, "
            f"./profiles, then the shipped sets), not {folder}: use --profiles {folder}")

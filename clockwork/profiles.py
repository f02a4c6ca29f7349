"""Model profiles (how long LOAD and INFER take): files, sets, and their lookup.

A profile file ``profiles/<set>/<model>.json`` holds one model on one device kind:

```
{"model": "resnet50_v2", "device": "v100", "weights_bytes": ..., "weights_pages": 7,
 "load_ns": 8000000, "exec_ns": {"1": 2900000, "2": ...},
 "inputs": [{"name": "data", "shape": [3, 224, 224], "dtype": "float32"}],
 "outputs": [...], "source": {"exec_ns.1": "measured: ...", ...}}
```

Shapes exclude the batch dimension. ``source`` says, per figure, whether it was
measured (how, where) or modelled (the formula).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from clockwork.sizes import PAGE_SIZE  # (bytes of a weights-cache page; re-exported)

if TYPE_CHECKING:
    from clockwork.settings import ProfileSetFile


class ProfileError(ValueError):
    """A profile file or profile set is missing or malformed."""


@dataclass
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


@dataclass
class ModelProfile:
    model: str
    device: str
    weights_bytes: int
    load_ns: int
    exec_ns: dict[int, int]
    weights_pages: int = 0
    inputs: list[TensorSpec] = field(default_factory=list)
    outputs: list[TensorSpec] = field(default_factory=list)
    source: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.weights_pages:
            self.weights_pages = pages_for(self.weights_bytes)
        if not self.exec_ns:
            raise ProfileError(f"profile {self.model!r}: exec_ns is empty")
        self.exec_ns = {int(b): int(v) for b, v in sorted(self.exec_ns.items())}

    @property
    def batch_sizes(self) -> list[int]:
        return sorted(self.exec_ns)

    def renamed(self, name: str) -> ModelProfile:
        """The same figures under another instance name (model copies)."""
        return ModelProfile(
            model=name,
            device=self.device,
            weights_bytes=self.weights_bytes,
            load_ns=self.load_ns,
            exec_ns=dict(self.exec_ns),
            weights_pages=self.weights_pages,
            inputs=self.inputs,
            outputs=self.outputs,
            source=self.source,
        )

    def to_json(self) -> dict:
        return {
            "model": self.model,
            "device": self.device,
            "weights_bytes": self.weights_bytes,
            "weights_pages": self.weights_pages,
            "load_ns": self.load_ns,
            "exec_ns": {str(b): v for b, v in self.exec_ns.items()},
            "inputs": [t.to_json() for t in self.inputs],
            "outputs": [t.to_json() for t in self.outputs],
            "source": self.source,
        }

    @classmethod
    def from_json(cls, d: dict, where: str = "<profile>") -> ModelProfile:
        """A profile from its JSON form, checked against the profile schema
        (``clockwork.settings.ProfileFile``); a bad file raises ``ProfileError`` with one
        line naming the key, e.g. ``<file>: load_ns: must be an integer >= 1, got -5``."""
        from clockwork.settings import ProfileFile, validate

        p = validate(ProfileFile, d, where=where, error=ProfileError)
        return cls(
            model=p.model,
            device=p.device,
            weights_bytes=p.weights_bytes,
            weights_pages=p.weights_pages,
            load_ns=p.load_ns,
            exec_ns=dict(p.exec_ns),
            inputs=[_tensor(t) for t in p.inputs],
            outputs=[_tensor(t) for t in p.outputs],
            source=dict(p.source),
        )


def _tensor(t) -> TensorSpec:
    """A ``TensorSpec`` from a validated ``TensorEntry`` (or a dict of the same keys)."""
    if isinstance(t, dict):
        return TensorSpec(str(t["name"]), tuple(int(x) for x in t["shape"]), str(t["dtype"]))
    return TensorSpec(t.name, tuple(t.shape), t.dtype)


def pages_for(nbytes: int, page_size: int = PAGE_SIZE) -> int:
    return max(1, -(-int(nbytes) // page_size))


def save_profile(profile: ModelProfile, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_bytes(orjson.dumps(profile.to_json(), option=orjson.OPT_INDENT_2) + b"\n")


def _json_file(p: Path, text: bytes) -> object:
    """The JSON of file ``p`` (``text``, its bytes); ProfileError for invalid JSON or an
    object that holds a key twice (the last one was taken, with no word: a second
    ``load_ns`` of 1 s beside the measured one)."""
    import json

    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise ProfileError(f"{p}: not valid JSON ({e})") from e

    def unique(pairs):
        seen = set()
        for k, _ in pairs:
            if k in seen:
                raise ProfileError(f"{p}: key {k!r} is given twice in one object")
            seen.add(k)
        return None

    json.loads(text, object_pairs_hook=unique)  # (the files are small: a second read)
    return data


def load_profile(path: str | Path) -> ModelProfile:
    p = Path(path)
    try:
        text = p.read_bytes()
    except FileNotFoundError:
        raise ProfileError(f"no profile file {p}") from None
    return ModelProfile.from_json(_json_file(p, text), str(p))


def profile_roots() -> list[Path]:
    """Where profile sets are looked up by name, in order: ``$CLOCKWORK_PROFILES``,
    ``./profiles``, the sets shipped in the package (``clockwork/data/profiles``, found
    with importlib.resources), and ``profiles/`` of a source checkout."""
    from clockwork import resources

    roots = []
    if env := os.environ.get("CLOCKWORK_PROFILES"):
        roots.append(Path(env))
    roots.append(Path.cwd() / "profiles")
    roots.append(resources.profiles_root())
    if (checkout := resources.checkout_root()) is not None:
        roots.append(checkout / "profiles")
    out: list[Path] = []
    for r in roots:
        if r not in out:
            out.append(r)
    return out


UNREADABLE_KEPT = 1_000  # ProfileSet.unreadable: reasons kept at most


@dataclass
class ProfileSet:
    """The profiles of one folder: model name -> profile, plus the set's defaults."""

    name: str
    path: Path
    profiles: dict[str, ModelProfile]
    weights_cache_pages: int
    files: set[Path] = field(default_factory=set, repr=False)  # the profile files read
    read_at: float = field(default=0.0, repr=False)  # (time.monotonic of the last read)
    read_mtime: int = field(default=-1, repr=False)  # (the folder's st_mtime_ns then)
    # file stem -> why a profile file added since the set was read cannot be (``refresh``
    # leaves it out; a load of that name says why, not only "no profile")
    unreadable: dict[str, str] = field(default_factory=dict, repr=False)

    def find(self, model: str) -> ModelProfile | None:
        """``model``'s profile, or None. One not in the set when it was read is looked for
        in its folder again (written since, by ``clockwork profile``): ``refresh``."""
        prof = self.profiles.get(model)
        if prof is None and self.refresh():
            prof = self.profiles.get(model)
        return prof

    def refresh(self, every_s: float = 1.0) -> bool:
        """Read the set's folder again for profile files added since; whether any
        profile was added. It is read at once when the folder changed since the last
        read (a file added or renamed into it), else at most once every ``every_s`` (a
        file completed in place): so a process that looks just after another found a new
        profile finds it too, and looking up unknown names does not list the folder each
        time. The profiles read before stay as they were (instances run by them), and a
        new file that cannot be read, or names a model the set has, is left out."""
        now = time.monotonic()
        mtime = _mtime(self.path)
        if (mtime == self.read_mtime and now - self.read_at < every_s) \
                or not self.path.is_dir():
            return False
        self.read_at, self.read_mtime = now, mtime
        added = False
        files = sorted(self.path.glob("*.json"))
        present = {f.stem for f in files}
        for stem in [s for s in self.unreadable if s not in present]:
            del self.unreadable[stem]  # (its file is gone: nothing to tell of it)
        for f in files:
            if f.name == "set.json" or f in self.files:
                continue
            try:
                prof = load_profile(f)
            except (ProfileError, OSError) as e:
                if len(self.unreadable) < UNREADABLE_KEPT or f.stem in self.unreadable:
                    self.unreadable[f.stem] = str(e)
                continue
            self.unreadable.pop(f.stem, None)
            self.files.add(f)
            if prof.model not in self.profiles:
                self.profiles[prof.model] = prof
                added = True
        return added

    def get(self, model: str) -> ModelProfile:
        try:
            return self.profiles[model]
        except KeyError:
            known = ", ".join(sorted(self.profiles)) or "(none)"
            raise ProfileError(
                f"no profile for model {model!r} in profile set {self.name!r} ({self.path}); "
                f"known: {known}"
            ) from None


def profile_set_candidates(name_or_path: str | Path,
                           base: str | Path | None = None) -> list[Path]:
    """The folders ``load_profile_set`` looks in for a profile set, in order (the one rule
    for ``cluster.profiles`` and ``--profiles``).

    - A path (one with a ``/``) is looked for as every path in a scenario is
      (``clockwork.resources.data_path_candidates``: as given, then under ``base``, the
      scenario file's folder, then in the shipped data and a source checkout), then under
      each of ``profile_roots()``.
    - A bare name is a set's name: under each of ``profile_roots()``, then a folder of
      that name beside the scenario file (under ``base``); nowhere else -- not the
      current folder, nor the shipped data or checkout root (``"traces"`` is not a set)."""
    from clockwork import resources

    name_or_path = str(name_or_path)
    in_roots = [root / name_or_path for root in profile_roots()]
    if os.sep in name_or_path or "/" in name_or_path:
        ordered = resources.data_path_candidates(name_or_path, base) + in_roots
    else:
        ordered = in_roots + ([Path(base) / name_or_path] if base is not None else [])
    return list(dict.fromkeys(ordered))  # (each once, in order)


def find_profile_set(name_or_path: str | Path, base: str | Path | None = None) -> Path | None:
    """The folder of profile set ``name_or_path`` (the first of
    ``profile_set_candidates`` that exists), or None."""
    return next((c for c in profile_set_candidates(name_or_path, base) if c.is_dir()), None)


def _set_hint(name: str, base: str | Path | None = None) -> str:
    """``; did you mean 'v100-reference'?`` for a name close to a set found by name (in
    ``profile_roots`` or ``base``; or one it begins), else the names of those sets; "" for
    a path or when there are none."""
    if os.sep in name or "/" in name:
        return ""
    import difflib

    roots = [*profile_roots(), *([Path(base)] if base is not None else [])]
    found: set[str] = set()
    for root in roots:
        try:
            found.update(p.name for p in root.iterdir()
                         if p.is_dir() and (p / "set.json").is_file())
        except OSError:  # (not a folder, or not readable: nothing found there)
            continue
    known = sorted(found)
    close = [k for k in known if k.startswith(name)] or difflib.get_close_matches(
        name, known, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]!r}?"
    return f"; the sets found by name: {', '.join(known)}" if known else ""


def load_profile_set(name_or_path: str | Path, base: str | Path | None = None) -> ProfileSet:
    """Load a profile set: a folder path or a set's name, found as
    ``profile_set_candidates`` says (``base``: the folder of the scenario file that
    names it, None for a name given elsewhere, e.g. ``--profiles``). ``set.json`` holds
    the defaults. Not found: ``ProfileError`` naming every place tried."""
    name_or_path = str(name_or_path)
    folder = find_profile_set(name_or_path, base)
    if folder is None:
        tried = ", ".join(str(c) for c in profile_set_candidates(name_or_path, base))
        raise ProfileError(f"profile set {name_or_path!r} not found (tried {tried})"
                           f"{_set_hint(name_or_path, base)}")
    mtime = _mtime(folder)  # (before the listing: a file added during it is seen later)
    meta = _load_set_file(folder / "set.json")
    profiles: dict[str, ModelProfile] = {}
    files: dict[str, Path] = {}  # model -> the file that gave its profile
    for f in sorted(folder.glob("*.json")):
        if f.name == "set.json":
            continue
        try:
            prof = load_profile(f)
        except ProfileError as e:
            if (folder / "set.json").exists():
                raise
            # (a folder that may be no profile set: say how it was read, besides what its
            # file is)
            raise ProfileError(f"{e} (read as a profile set: {folder} has no set.json, "
                               "which is optional; a set is a folder of one JSON profile "
                               "per model)") from None
        if prof.model in files:
            raise ProfileError(f"{f}: model {prof.model!r} already has a profile in this "
                               f"set, {files[prof.model]}: one profile file per model")
        profiles[prof.model] = prof
        files[prof.model] = f
    if not profiles:
        raise ProfileError(f"profile set {folder} holds no profiles")
    return ProfileSet(
        name=folder.name,
        path=folder,
        profiles=profiles,
        weights_cache_pages=meta.weights_cache_pages,
        files=set(files.values()),
        read_at=time.monotonic(),
        read_mtime=mtime,
    )


def _mtime(folder: Path) -> int:
    """A folder's modification time in ns (-2 when it cannot be read)."""
    try:
        return folder.stat().st_mtime_ns
    except OSError:
        return -2


def _load_set_file(path: Path) -> ProfileSetFile:
    """A profile set's ``set.json`` checked against its schema
    (``clockwork.settings.ProfileSetFile``; the defaults when there is none); a bad file
    raises ``ProfileError`` with one line naming the file and the key."""
    from clockwork.settings import ProfileSetFile, validate

    try:
        data = _json_file(path, path.read_bytes())
    except FileNotFoundError:
        data = {}
    return validate(ProfileSetFile, data, where=str(path), error=ProfileError)

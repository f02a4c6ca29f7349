"""The model repository as the KServe front ends see it (Triton's model repository
extension): an index of models and their states, load and unload. The REST and gRPC
routes (``controller/kserve_rest.py``, ``controller/kserve.py``) call these three
functions; the work is the controller's (``ControllerNode.load_model`` /
``unload_model`` in ``controller/service.py``), and the clockwork.v1 API reaches the
same methods (``LoadModel`` / ``UnloadModel``).

The repository is the controller's profile set: any profile in it can be loaded, under
its own name or another, as one or more instances (``name``, ``name:1``, ...: the
scenario's naming of copies). Load parameters (Triton's ``parameters`` map; strings or
numbers):

=========  =====================================================================  ==========
key        meaning                                                                default
=========  =====================================================================  ==========
copies     how many instances (each scheduled like a model of its own)            1
profile    the profile in the controller's profile set                            ``name``
package    cpu/cuda workers: the model package directory, inside each worker's    (the
           package directory                                                      worker's)
config     Triton's model configuration (JSON text, what ``tritonclient``'s        --
           ``load_model(name, config=...)`` sends): ``instance_group`` counts add
           up to ``copies``; ``parameters`` may hold ``copies``, ``profile`` and
           ``package`` (``{"string_value": ...}``); ``max_batch_size``, if
           given, must be the profile's largest batch size, and each ``input``
           and ``output`` tensor listed one of the profile's, as it is; the other
           fields (a configuration read back from ``get_model_config``) are not
           used
=========  =====================================================================  ==========

Loading a model that is loaded with the same parameters succeeds and changes nothing, and
so does a load without parameters (Triton's reload: the model as it was loaded); with
other parameters it is refused (INVALID_ARGUMENT: unload it first). One of a model's
copies (``m:k``) is served as 1 copy of the model's profile and package: a load of
``m:k`` with those parameters changes nothing too. What a model's configuration says of
its load (``as_configured``: the ``instance_group`` count and the ``profile`` and
``package`` parameters) is these parameters, so a configuration read back and sent with
a load of the same name again changes nothing. Unloading
answers the model's queued requests at once (NOT_FOUND to their callers), refuses new
ones, lets the running ones finish and returns; the GPU memory is freed as each copy goes
idle (the state is ``UNLOADING`` until then, ``UNAVAILABLE`` / ``unloaded`` after).
Unloading a name the repository knows but does not serve succeeds; an unknown one is
NOT_FOUND. Errors are ``KServeError``: INVALID_ARGUMENT for bad parameters or a name
loaded otherwise, NOT_FOUND for an unknown profile or model (or a package a worker
lacks), UNAVAILABLE when the controller is not serving, a worker did not answer, or no
worker is connected to take the model (a load completes once one can serve it).
"""

from __future__ import annotations

import re

import grpc

from clockwork.errors import STOPPING_MESSAGE
from controller.kserve_status import INVALID, NOT_FOUND, UNAVAILABLE, KServeError
from controller.kserve_validate import _short, json_loads, json_problem, max_batch_size


class RepositoryError(Exception):
    """A model repository call that failed: ``code`` (a ``grpc.StatusCode``: NOT_FOUND,
    INVALID_ARGUMENT or UNAVAILABLE) and a one-line message for the client."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def shutting_down() -> RepositoryError:
    """What a repository call (a load, an add of a worker) still waiting is answered
    when the controller stops, rather than being cancelled by the server's stop."""
    return RepositoryError(grpc.StatusCode.UNAVAILABLE, STOPPING_MESSAGE)


VERSION = "1"  # every model has one version
LOAD_PARAMS = ("copies", "profile", "package", "config")
# Triton model configuration fields a load accepts (those our get_model_config answers)
CONFIG_FIELDS = ("name", "platform", "backend", "max_batch_size", "input", "output",
                 "dynamic_batching", "instance_group", "parameters")
UNLOAD_PARAMS = ("unload_dependents",)  # Triton's; there are no dependents here
DIGITS_MAX = 20  # digits of an integer written as text (int64's 19, and a sign)
_KIND = {grpc.StatusCode.NOT_FOUND: NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT: INVALID,
         grpc.StatusCode.UNAVAILABLE: UNAVAILABLE}


def index(node, ready_only: bool = False) -> list[dict]:
    """Triton's ``RepositoryIndex``: ``{"name", "version", "state", "reason"}`` for every
    instance served (``READY``), loading (``LOADING``), being unloaded (``UNLOADING``) or
    unloaded (``UNAVAILABLE``, reason ``unloaded``), and for every profile that can be
    loaded and is not (version and state empty, as Triton lists a model it has not
    loaded), by name. ``ready_only``: the ``READY`` ones only."""
    return [{"name": name, "version": VERSION if state else "", "state": state,
             "reason": reason}
            for name, state, reason in node.repository_index(ready_only)]


async def load(node, name: str, params: dict) -> None:
    """Load ``name`` (parameters above); returns once it is served. Raises
    ``KServeError``."""
    _check_keys(params, LOAD_PARAMS, "load")
    asked_max = _config_max_batch(params.get("config"))
    asked_tensors = _config_tensors(params.get("config"))

    def resolve():  # (under the model's lock: after the loads and unloads before it)
        given = as_loaded(node, name, params)
        if given is None:  # a copy served as asked: as it is
            return None
        copies = _count(given.get("copies"))
        profile = _text(given.get("profile"), "profile") or None
        package = _text(given.get("package"), "package")
        pset = getattr(node, "pset", None)
        prof = pset.find(profile or group_name(name)) if pset is not None else None
        if asked_max is not None and prof is not None and asked_max != max_batch_size(prof):
            # (it is the profile's largest batch size: a configuration cannot change it)
            raise KServeError(INVALID, f"the configuration's max_batch_size {asked_max} is "
                              f"not this model's: {max_batch_size(prof)}, the largest batch "
                              f"size of profile {prof.model!r} (a configuration chooses the "
                              "copies, profile and package only)")
        if prof is not None:
            _check_config_tensors(asked_tensors, prof)
        return copies, profile, package

    try:
        await node.load_resolved(name, resolve)
    except KServeError:
        raise
    except Exception as e:
        raise _error(e) from None


def group_name(instance: str) -> str:
    """``resnet50_v2:3`` -> ``resnet50_v2`` (the model the copy was loaded as)."""
    base, colon, k = instance.rpartition(":")
    return base if colon and k.isdigit() else instance


def as_loaded(node, name: str, params: dict) -> dict | None:
    """The load of ``name`` that ``params`` ask for (``copies``, ``profile``, ``package``
    and Triton's ``config``, merged into the others here; None: not given), for
    ``ControllerNode.load_model``, or None: nothing to do.

    A load of a loaded model with no parameter given (every value None) is Triton's
    reload: the model as it was loaded. One of a model's copies (``m:k``, which the
    repository index lists too) served now is 1 copy of the model's profile and package
    (what its configuration says, ``as_configured``): a load of it with no parameter,
    or with those, is None. Any other load: ``params`` as they are (the load checks
    them). Raises ``KServeError`` for a bad ``config``."""
    if all(v is None for v in params.values()):
        have = node.loaded.get(name)
        if have is not None:
            return {"copies": have.copies, "profile": have.profile, "package": have.package}
        return None if _copy_of(node, name) is not None else params
    if params.get("config") is not None:
        params = _merge(params, _from_config(params["config"], name))
    group = _copy_of(node, name)
    if group is not None:
        try:
            asked = (_count(params.get("copies")),
                     _text(params.get("profile"), "profile") or group_name(name),
                     _text(params.get("package"), "package"))
        except KServeError:
            return params  # (the load refuses them)
        if asked == (1, group.profile, group.package):
            return None
    return params


def as_configured(node, name: str) -> tuple[int, dict]:
    """What Triton's model configuration of instance ``name`` says of the load that made
    it, so that a load of ``name`` with the configuration read back asks for what is
    served (and changes nothing, ``as_loaded``): the ``instance_group`` count, the copies
    of a model loaded as ``name`` (``name``, ``name:1``, ...; 1 for one of a model's
    copies ``m:k``), and the ``parameters`` (``{"string_value": ...}``) that load must
    carry: ``profile`` when it is not the default for the name, ``package`` when one was
    named."""
    copies, profile, package = 1, group_name(name), ""
    own = node.loaded.get(name)
    group = own if own is not None else _copy_of(node, name)
    if group is not None:
        copies = group.copies if own is not None else 1
        profile, package = group.profile, group.package
    out = {}
    if profile != group_name(name):
        out["profile"] = {"string_value": profile}
    if package:
        out["package"] = {"string_value": package}
    return copies, out


def _copy_of(node, name: str):
    """The loaded model (``LoadedModel``) whose copy ``name`` (``m:k``, not loaded under
    its own name) is, served now (not being unloaded); else None."""
    if name in node.loaded:
        return None
    group = node.loaded.get(group_name(name))
    if group is not None and name in group.instances and name in node.profiles \
            and name not in node.unloading:
        return group
    return None


async def unload(node, name: str, params: dict) -> None:
    """Unload ``name``; returns once its queued requests are answered (its copies are
    evicted afterwards, as they go idle). Raises ``KServeError``."""
    _check_keys(params, UNLOAD_PARAMS, "unload")
    for k, v in params.items():  # (each a bool, as Triton's; there are no dependents here)
        if not isinstance(v, bool):
            raise KServeError(INVALID, f"unload parameter {k!r} must be true or false, got "
                              f"{v!r:.60}")
    try:
        await node.unload_model(name)
    except Exception as e:
        raise _error(e) from None


def _error(e: Exception) -> Exception:
    code = getattr(e, "code", None)
    if code in _KIND and isinstance(getattr(e, "message", None), str):
        return KServeError(_KIND[code], e.message)
    return e  # not the repository's (a bug): the front end answers INTERNAL


def _check_keys(params: dict, known: tuple[str, ...], what: str) -> None:
    for k in params:
        if k not in known:
            why = (" (this server loads models from its profile set, not from files)"
                   if isinstance(k, str) and k.startswith("file:") else "")
            raise KServeError(INVALID, f"unknown {what} parameter {k!r}{why}; known: "
                              f"{', '.join(known)}")


def _config_object(text) -> dict:
    """A load's Triton model configuration (a string holding JSON) as an object, its
    fields named as ``ModelConfig``'s (``_snake_keys``); raises KServeError."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    try:
        cfg = json_loads(text) if isinstance(text, str) else None
    except ValueError as e:  # (also nested too deeply: json_loads says so)
        raise KServeError(INVALID, json_problem("parameter 'config'", e)) from None
    if not isinstance(cfg, dict):
        json_kind = {type(None): "null", bool: "a boolean", int: "a number", float: "a number",
                     str: "a string", list: "an array"}
        given = (f"a {type(text).__name__}" if not isinstance(text, str)
                 else f"JSON: {json_kind.get(type(cfg), type(cfg).__name__)}")
        raise KServeError(INVALID, "parameter 'config' must be a string holding a JSON object "
                          f"(a model configuration, as Triton takes it), got {given}")
    return _snake_keys(cfg)


def _from_config(text, name: str) -> dict:
    """The load parameters a Triton model configuration (JSON) gives."""
    cfg = _config_object(text)
    for k in cfg:
        if k not in CONFIG_FIELDS:
            raise KServeError(INVALID, f"model configuration field {k!r} is not supported "
                              f"here; supported: {', '.join(CONFIG_FIELDS)}")
    if cfg.get("name") not in (None, "", name):
        raise KServeError(INVALID, f"the configuration names model {cfg['name']!r}, the "
                          f"request {name!r}")
    out: dict = {}
    counts: list = []
    groups = cfg.get("instance_group")
    if groups is not None:
        if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
            raise KServeError(INVALID, "'instance_group' must be a list of objects")
        counts = [_pb_int(g.get("count", 1)) for g in groups]
        if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in counts):
            raise KServeError(INVALID, "an instance_group 'count' must be an integer >= 1")
        if counts:
            out["copies"] = sum(counts)
    extra = cfg.get("parameters") or {}
    if not isinstance(extra, dict):
        raise KServeError(INVALID, "'parameters' must be an object")
    for k, v in extra.items():
        if k not in ("copies", "profile", "package"):
            continue  # (execution_batch_sizes, default_slo_ms: read back, not settable)
        if isinstance(v, dict):
            v = _snake_keys(v)
        if not isinstance(v, dict) or not isinstance(v.get("string_value"), str):
            raise KServeError(INVALID, f"configuration parameter {k!r} must be "
                              '{"string_value": "..."}')
        if k == "copies" and counts and _count(v["string_value"]) != sum(counts):
            raise KServeError(INVALID, f"the configuration's instance_group counts add up "
                              f"to {sum(counts)}, its parameter 'copies' says "
                              f"{v['string_value']!r}")
        out[k] = v["string_value"]
    return out


def _config_tensors(text) -> dict[str, list]:
    """The ``input`` and ``output`` lists a load's configuration gives (a missing one:
    empty); what is wrong with the configuration otherwise is ``_from_config``'s to
    say."""
    if text is None:
        return {}
    try:
        cfg = _config_object(text)
    except KServeError:
        return {}
    return {k: cfg[k] for k in ("input", "output") if cfg.get(k) is not None}


def _check_config_tensors(given: dict[str, list], prof) -> None:
    """Each tensor a load's configuration lists must be one of the profile's, of its
    data type and dims (without the batch dimension; -1 stands for any size), as Triton
    refuses a configuration its model does not match: a typo in one was taken, and
    ``get_model_config`` then said otherwise. Tensors it leaves out are the profile's."""
    from controller.kserve_validate import NP_TO_KS

    for key, listed in given.items():
        specs = {t.name: t for t in (prof.inputs if key == "input" else prof.outputs)}
        if not isinstance(listed, list) or not all(isinstance(t, dict) for t in listed):
            raise KServeError(INVALID, f"the configuration's {key!r} must be a list of "
                              "objects")
        for t in map(_snake_keys, listed):
            if not isinstance(t.get("name"), str):
                raise KServeError(INVALID, f"the configuration's {key} names must be "
                                  f"strings, got {_short(t.get('name'))}")
            spec = specs.get(t["name"])
            if spec is None:
                raise KServeError(INVALID, f"the configuration's {key} {t.get('name')!r} is "
                                  f"not one of profile {prof.model!r}'s: "
                                  f"{', '.join(specs) or 'none'}")
            want = "TYPE_" + NP_TO_KS.get(spec.dtype, spec.dtype.upper())
            if t.get("data_type") not in (None, want):
                raise KServeError(INVALID, f"the configuration's {key} {spec.name!r} has "
                                  f"data_type {t['data_type']!r}; profile {prof.model!r} "
                                  f"says {want}")
            dims = t.get("dims")
            if dims is not None:
                dims = [_pb_int(d) for d in dims] if isinstance(dims, list) else dims
                if not isinstance(dims, list) or len(dims) != len(spec.shape) or any(
                        d != -1 and d != s for d, s in zip(dims, spec.shape, strict=True)):
                    raise KServeError(INVALID, f"the configuration's {key} {spec.name!r} "
                                      f"has dims {t['dims']!r}; profile {prof.model!r} says "
                                      f"{list(spec.shape)} (without the batch dimension)")


def _config_max_batch(text) -> int | None:
    """The ``max_batch_size`` a load's configuration asks for, if it names one (it must
    be the profile's: ``load`` checks)."""
    if text is None:
        return None
    try:
        cfg = _config_object(text)
    except KServeError:
        return None  # (_from_config says what is wrong with it)
    v = _pb_int(cfg.get("max_batch_size"))
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise KServeError(INVALID, f"the configuration's max_batch_size must be an integer, "
                          f"got {v!r}")
    return v


def _snake_keys(d: dict) -> dict:
    """A configuration object's keys as Triton's ``ModelConfig`` fields are named: the
    protobuf JSON form (``MessageToJson`` of the configuration gRPC gives) names them in
    lowerCamelCase (``maxBatchSize``), and Triton's parser takes either. One field given
    both ways is refused."""
    out: dict = {}
    for k, v in d.items():
        snake = re.sub(r"(?<=[a-z0-9])([A-Z])", lambda m: "_" + m[1].lower(), k) \
            if isinstance(k, str) else k
        if snake in out:
            raise KServeError(INVALID, f"model configuration field {snake!r} is given "
                              "twice (in two spellings)")
        out[snake] = v
    return out


def _pb_int(v):
    """A configuration's integer as protobuf's JSON form writes it: a number, or its
    decimal digits in a string (``"16"``); anything else is returned as it is (the
    caller refuses it)."""
    if (isinstance(v, str) and v.strip().lstrip("-").isdigit() and v.strip().isascii()
            and len(v) <= DIGITS_MAX):  # (longer: Python's int() refuses past 4,300 digits)
        return int(v)
    return v


def _merge(params: dict, more: dict) -> dict:
    """Load parameters and those of a configuration; the same key twice must agree."""
    out = {k: v for k, v in params.items() if k != "config"}
    for k, v in more.items():
        if out.get(k) is not None and str(out[k]).strip() != str(v).strip():
            raise KServeError(INVALID, f"parameter {k!r} is {out[k]!r}, the configuration "
                              f"says {v!r}")
        out[k] = v
    return out


def _count(v) -> int:
    """``copies``: an integer >= 1, or its decimal string; None: 1."""
    if v is None:
        return 1
    n = None
    if isinstance(v, int) and not isinstance(v, bool):
        n = v
    elif isinstance(v, float) and v.is_integer():
        n = int(v)
    elif isinstance(v, str | bytes):
        text = v.decode("utf-8", "replace") if isinstance(v, bytes) else v
        text = text.strip()
        if text.isascii() and text.isdigit() and len(text) <= DIGITS_MAX:
            n = int(text)  # (not other scripts' digits, nor '²'; 5,000 digits: a 500)
    if n is None or n < 1:
        raise KServeError(INVALID, f"parameter 'copies' must be an integer >= 1, got "
                          f"{_short(v)}")
    return n


def _text(v, key: str) -> str:
    if v is None:
        return ""
    if isinstance(v, bytes):
        try:
            v = v.decode("utf-8")
        except UnicodeDecodeError:
            raise KServeError(INVALID, f"parameter {key!r} must be UTF-8 text") from None
    if not isinstance(v, str):
        raise KServeError(INVALID, f"parameter {key!r} must be a string, got {v!r}")
    return v.strip()

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
=========  =====================================================================  ==========

Loading a model that is loaded with the same parameters succeeds and changes nothing;
with other parameters it is refused (INVALID_ARGUMENT: unload it first). Unloading
answers the model's queued requests at once (NOT_FOUND to their callers), refuses new
ones, lets the running ones finish and returns; the GPU memory is freed as each copy goes
idle (the state is ``UNLOADING`` until then, ``UNAVAILABLE`` / ``unloaded`` after).
Unloading a name the repository knows but does not serve succeeds; an unknown one is
NOT_FOUND. Errors are ``KServeError``: INVALID_ARGUMENT for bad parameters or a name
loaded otherwise, NOT_FOUND for an unknown profile or model (or a package a worker
lacks), UNAVAILABLE when the controller is not serving or a worker did not answer.
"""

from __future__ import annotations

import grpc

from controller.kserve_status import INVALID, NOT_FOUND, UNAVAILABLE, KServeError

VERSION = "1"  # every model has one version
LOAD_PARAMS = ("copies", "profile", "package")
UNLOAD_PARAMS = ("unload_dependents",)  # Triton's; there are no dependents here
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
    copies = _count(params.get("copies"))
    profile = _text(params.get("profile"), "profile") or None
    package = _text(params.get("package"), "package")
    try:
        await node.load_model(name, copies, profile, package)
    except Exception as e:
        raise _error(e) from None


async def unload(node, name: str, params: dict) -> None:
    """Unload ``name``; returns once its queued requests are answered (its copies are
    evicted afterwards, as they go idle). Raises ``KServeError``."""
    _check_keys(params, UNLOAD_PARAMS, "unload")
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
            raise KServeError(INVALID, f"unknown {what} parameter {k!r}; known: "
                              f"{', '.join(known)}")


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
        if text.strip().isdigit():
            n = int(text.strip())
    if n is None or n < 1:
        raise KServeError(INVALID, f"parameter 'copies' must be an integer >= 1, got {v!r}")
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

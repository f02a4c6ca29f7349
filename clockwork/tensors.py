"""Typed tensors: what requests, replies and results carry inside the controller and the
workers. Protobuf appears only at the edges (``clockwork.protocol.wire`` for
``clockwork.v1``, ``controller.kserve`` for KServe v2).

A :class:`Tensor` is a name, a numpy dtype, a shape and ``data``: the elements in C order
in one contiguous buffer (``bytes``, a ``memoryview`` or a numpy array). The buffer is
whatever arrived: the bytes of a protobuf field, a slice of a REST body, a device's output
array; ``array`` is a numpy view over it, never a copy. A tensor straight from a client
may be malformed (its buffer too short or too long for its shape) until
:func:`check_inputs` has passed it.

The helpers:

- :meth:`Tensor.of` (numpy -> Tensor) and :attr:`Tensor.array` (Tensor -> numpy), both
  without copying (unless the array is not C-contiguous little-endian);
- :func:`batch_inputs` / :func:`join_rows`: the requests' samples as the rows of one
  INFER batch, zero rows after them: one allocation, one copy per row
  (:func:`batch_rows` / :func:`row_buffers`: the same rows' buffers, uncopied, for the
  worker link's fast path);
- :meth:`Tensor.row`: one row of a batch output, a view (no copy);
- :func:`check_inputs`: a client's inputs against the model's input ``TensorSpec``s;
- :func:`zero_rows`: one zero row per output spec, cached (the emulated device computes
  nothing: the controller answers zeros of the model's output shapes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from clockwork.profiles import TensorSpec

_ZERO_CACHE_MAX = 1024  # entries in each of the zero caches below (then they start over)


class TensorError(ValueError):
    """A tensor that cannot be read (e.g. an unknown dtype name)."""


@dataclass(frozen=True, slots=True, eq=False)
class Tensor:
    """A named, typed tensor over a contiguous buffer (see the module docstring).

    ``dtype`` is a ``numpy.dtype`` (little-endian), ``shape`` a tuple of ints, ``data``
    ``bytes`` / ``memoryview`` / C-contiguous ``numpy.ndarray`` holding the elements in C
    order. Equality is identity (the buffers are not compared).
    """

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    data: bytes | memoryview | np.ndarray

    @classmethod
    def of(cls, name: str, arr) -> Tensor:
        """A tensor over ``arr``'s memory (copied only when it is not C-contiguous or not
        little-endian)."""
        a = np.asarray(arr)
        if not a.flags.c_contiguous:  # (np.ascontiguousarray would make a 0-d array 1-d)
            a = np.ascontiguousarray(a)
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        return cls(name, a.dtype, a.shape, a)

    @property
    def nbytes(self) -> int:
        """Bytes in ``data`` (what arrived, whatever the shape says)."""
        d = self.data
        return len(d) if isinstance(d, bytes) else d.nbytes

    @property
    def array(self) -> np.ndarray:
        """A numpy view of the data with this dtype and shape (read-only when the buffer
        is). Raises ``ValueError`` when the buffer does not fit the shape."""
        d = self.data
        if isinstance(d, np.ndarray) and d.dtype == self.dtype and d.shape == self.shape:
            return d
        return np.frombuffer(d, self.dtype).reshape(self.shape)

    def row(self, i: int) -> Tensor:
        """Row ``i`` of a batch (shape ``shape[1:]``): a view into this tensor's buffer."""
        return Tensor(self.name, self.dtype, self.shape[1:], self.array[i])

    def to_bytes(self) -> bytes:
        """The data as ``bytes`` (the buffer itself when it already is ``bytes``)."""
        d = self.data
        return d if isinstance(d, bytes) else d.tobytes()

    def __repr__(self) -> str:
        return f"Tensor({self.name!r}, {self.dtype.name}, {list(self.shape)}, {self.nbytes} bytes)"


def row_nbytes(spec: TensorSpec) -> int:
    """Bytes in one row (one sample) of a tensor of ``spec``."""
    n = np.dtype(spec.dtype).itemsize
    for d in spec.shape:
        n *= d
    return n


def check_inputs(inputs: Sequence[Tensor], specs: Sequence[TensorSpec]) -> str | None:
    """Why ``inputs`` (one request's tensors) do not fit a model with input ``specs``, or
    None. A tensor is matched by name, or is the only input when its name is empty; its
    shape is the spec's, with or without a leading batch dimension of 1; its dtype is the
    spec's and its buffer holds exactly the shape's elements. An input given twice (by
    name, or by name and as the only one) is refused: which one would run is no rule."""
    by_name = {s.name: s for s in specs}
    seen: set[str] = set()
    for t in inputs:
        spec = by_name.get(t.name) if t.name else (specs[0] if len(specs) == 1 else None)
        if spec is None:
            return f"input {t.name!r} is not one of {sorted(by_name)}"
        if spec.name in seen:
            return f"input {spec.name!r} is given twice"
        seen.add(spec.name)
        shape = tuple(t.shape)
        if shape != tuple(spec.shape) and shape != (1, *spec.shape):
            return f"input {spec.name!r} has shape {list(shape)}, expected {list(spec.shape)}"
        if t.dtype != np.dtype(spec.dtype):
            return f"input {spec.name!r} has dtype {t.dtype}, expected {spec.dtype}"
        want = row_nbytes(spec)
        if t.nbytes != want:
            return f"input {spec.name!r}: {t.nbytes} bytes, expected {want}"
    return None


_zero_bytes: dict[int, bytes] = {}


def _zero_row(nbytes: int) -> bytes:
    z = _zero_bytes.get(nbytes)
    if z is None:
        z = bytes(nbytes)
        if len(_zero_bytes) >= _ZERO_CACHE_MAX:
            _zero_bytes.clear()
        _zero_bytes[nbytes] = z
    return z


def row_buffers(rows: Sequence[Tensor | None], spec: TensorSpec, batch_size: int) -> list:
    """The buffers of one input of an INFER batch, in order: ``rows[i]``'s data as it is
    (zeros for None, or for a tensor whose buffer does not hold exactly one sample), then
    zero rows up to ``batch_size``. No copy: the caller joins them (:func:`join_rows`) or
    writes them out one after the other (the worker link's attachments)."""
    size = row_nbytes(spec)
    zero = _zero_row(size)
    parts = [t.data if t is not None and t.nbytes == size else zero for t in rows]
    parts.extend([zero] * (batch_size - len(rows)))
    return parts


def join_rows(rows: Sequence[Tensor | None], spec: TensorSpec, batch_size: int) -> Tensor:
    """One input of an INFER batch (see :func:`row_buffers`) as one tensor whose data is
    one ``bytes`` object: one allocation, one copy per row."""
    return Tensor(spec.name, np.dtype(spec.dtype), (batch_size, *spec.shape),
                  b"".join(row_buffers(rows, spec, batch_size)))


def batch_rows(inputs: Sequence[Sequence[Tensor] | None],
               specs: Sequence[TensorSpec]) -> list[list[Tensor | None]] | None:
    """Per input spec, the INFER's rows: request i's tensor for that input (or None), in
    order; None if no request has inputs. A request's tensor is matched by name, or is
    the first input when its name is empty."""
    if not any(inputs):
        return None
    out = []
    for k, spec in enumerate(specs):
        rows: list[Tensor | None] = []
        for ts in inputs:
            found = None
            for t in ts or ():
                if t.name == spec.name or (not t.name and k == 0):
                    found = t
                    break
            rows.append(found)
        out.append(rows)
    return out


def batch_inputs(inputs: Sequence[Sequence[Tensor] | None], batch_size: int,
                 specs: Sequence[TensorSpec]) -> list[Tensor] | None:
    """An INFER's input tensors from its requests' inputs (``inputs[i]``: request i's
    tensors, or None), one per spec, each request's sample as a row, in order, zero rows
    after them (:func:`batch_rows`, :func:`join_rows`). None if no request has inputs."""
    per_spec = batch_rows(inputs, specs)
    if per_spec is None:
        return None
    return [join_rows(rows, spec, batch_size) for rows, spec in zip(per_spec, specs, strict=True)]


_zero_tensors: dict[tuple, tuple[Tensor, ...]] = {}


def zero_rows(specs: Sequence[TensorSpec]) -> tuple[Tensor, ...]:
    """One row of zeros (no batch dimension) per spec, read-only, cached per list of
    specs (the cache holds at most a thousand or so lists)."""
    key = tuple((s.name, tuple(s.shape), s.dtype) for s in specs)
    z = _zero_tensors.get(key)
    if z is None:
        z = tuple(Tensor(name, np.dtype(dtype), shape, _zero_row(row_nbytes(s)))
                  for (name, shape, dtype), s in zip(key, specs, strict=True))
        if len(_zero_tensors) >= _ZERO_CACHE_MAX:
            _zero_tensors.clear()
        _zero_tensors[key] = z
    return z


__all__ = ["Tensor", "TensorError", "batch_inputs", "batch_rows", "check_inputs", "join_rows",
           "row_buffers", "row_nbytes", "zero_rows"]

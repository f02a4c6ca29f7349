"""A KServe request's rows in the controller (``ControllerNode.submit_many``) without a
cluster: rows cut to the model's current profile by ``check_inputs`` are taken as they
are; any other row (checked against a profile since replaced, or not at all) is checked
again and refused when it does not fit.

The rows are stand-ins with ``controller.kserve.TypedInferRequest``'s fields: that module's
``inference.*`` messages clash with tritonclient's, which other test modules import in
the same process."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from clockwork.actions import RequestStatus
from clockwork.tensors import Tensor
from controller.service import ControllerNode

MODEL = "resnet50_v2"


@dataclass
class TypedInferRequest:  # controller.kserve.TypedInferRequest's fields
    model: str
    inputs: list = field(default_factory=list)
    slo_ms: float = 0.0
    client_id: int = 0
    skip_outputs: bool = False
    checked: object = None
    group: object = None


class _Ctrl:
    """The scheduler's door: keeps what it is handed."""

    def __init__(self) -> None:
        self.got = []

    def requests(self, reqs, now: int) -> None:
        self.got.extend(reqs)


def _node() -> tuple[ControllerNode, _Ctrl]:
    node = ControllerNode([], "v100-reference", models=MODEL)
    node.ctrl = _Ctrl()
    return node, node.ctrl


def _row(shape=(3, 224, 224), checked=None) -> TypedInferRequest:
    x = Tensor("data", np.dtype("float32"), shape, bytes(4 * int(np.prod(shape))))
    return TypedInferRequest(MODEL, [x], checked=checked)


def test_rows_checked_against_the_current_profile_are_taken():
    node, ctrl = _node()
    answers = []
    row = _row(checked=node.profiles[MODEL])
    node.submit_many([row], answers.append)
    assert not answers and len(ctrl.got) == 1 and ctrl.got[0].inputs is row.inputs


def test_other_rows_are_checked_again():
    node, ctrl = _node()
    answers = []
    stale = node.profiles[MODEL].renamed(MODEL)  # the profile before a reload, say
    node.submit_many([_row((3, 224, 225), checked=stale), _row((2,)), _row()],
                     answers.append)
    assert [(a.status, a.reason) for a in answers] == [
        (RequestStatus.INVALID_REQUEST, "bad_input")] * 2
    assert "shape [3, 224, 225]" in answers[0].message
    assert len(ctrl.got) == 1  # the good one, checked again

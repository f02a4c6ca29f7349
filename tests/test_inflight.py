"""The book of actions sent and not answered, shared by every policy."""

from __future__ import annotations

from clockwork.actions import Action, ActionType, ErrorCode, Result
from controller.inflight import COPY_GONE, Inflight, error_message


def action(book, t, requests=None):
    return Action(book.new_id(), t, 0, 0, "a", 0, 1, 1, requests=requests)


def result(a, status=ErrorCode.SUCCESS, message=""):
    return Result(a.id, a.type, status, 0, 0, "a", message=message)


def test_ids_records_and_counters():
    book = Inflight()
    gpu, copy = object(), object()
    load = action(book, ActionType.LOAD)
    infer = action(book, ActionType.INFER, ["r1", "r2"])
    evict = action(book, ActionType.EVICT)
    assert [load.id, infer.id, evict.id] == [1, 2, 3]
    book.add(load, gpu, copy, [])
    book.add(infer, gpu, copy, infer.requests)
    book.add(evict, gpu, copy, [])
    assert len(book) == 3 and 2 in book
    assert book.counts() == {"infer": 1, "load": 1, "evict": 1, "rejected": 0}

    s = book.resolve(result(infer, ErrorCode.EXEC_TOO_LATE))
    assert s.action is infer and s.gpu is gpu and s.copy is copy and s.requests == ["r1", "r2"]
    assert 2 not in book and book.counts()["rejected"] == 1
    # a duplicate (or unknown) result resolves to nothing and counts nothing
    assert book.resolve(result(infer, ErrorCode.EXEC_TOO_LATE)) is None
    assert book.resolve(Result(99, ActionType.INFER, ErrorCode.EXEC_TOO_LATE, 0, 0, "a")) is None
    assert book.counts()["rejected"] == 1
    assert book.resolve(result(load)).action is load and book.counts()["rejected"] == 1
    # counts() is a copy
    book.counts()["infer"] = 50
    assert book.counts()["infer"] == 1 and len(book) == 1


def test_what_a_failure_means():
    a = Action(7, ActionType.INFER, 0, 0, "a", 0, 1, 1)
    assert ErrorCode.WEIGHTS_NOT_PRESENT in COPY_GONE and ErrorCode.WEIGHTS_CHANGED in COPY_GONE
    assert ErrorCode.EXEC_TOO_LATE not in COPY_GONE
    assert error_message(result(a, ErrorCode.EXEC_TOO_LATE, "late by 3 ms")) == \
        "worker error EXEC_TOO_LATE: late by 3 ms"

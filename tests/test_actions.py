"""The numbers of result and request codes are those of Clockwork's C++ API
(``include/clockwork/api/worker_api.h`` and ``api_common.h``), so logs and wire
messages read the same."""

from __future__ import annotations

from clockwork.actions import ErrorCode, RequestStatus

# our name -> the C++ constant's value (its name in the comment)
WORKER_API = {
    "SUCCESS": 0,  # actionSuccess
    "UNKNOWN_MODEL": 10,  # actionErrorUnknownModel
    "INVALID_GPU": 13,  # actionErrorInvalidGPU
    "WEIGHTS_NOT_PRESENT": 20,  # actionErrorModelWeightsNotPresent
    "WEIGHTS_ALREADY_LOADED": 21,  # actionErrorWeightsAlreadyLoaded
    "WEIGHTS_IN_USE": 22,  # actionErrorWeightsInUse
    "WEIGHTS_CHANGED": 23,  # actionErrorWeightsChanged
    "INVALID_INPUT": 30,  # actionErrorInvalidInput
    "INVALID_BATCH_SIZE": 31,  # actionErrorInvalidBatchSize
    "NETWORK_SEND_TOO_LATE": 45,  # networkSendTooLate
    "LOAD_TOO_EARLY": 50,  # loadWeightsTooEarly
    "LOAD_TOO_LATE": 51,  # loadWeightsTooLate
    "LOAD_INSUFFICIENT_CACHE": 53,  # loadWeightsInsufficientCache
    "EVICT_TOO_EARLY": 60,  # evictWeightsTooEarly
    "EVICT_TOO_LATE": 61,  # evictWeightsTooLate
    "EVICT_NOT_IN_CACHE": 63,  # evictWeightsNotInCache
    "INPUT_TOO_EARLY": 70,  # copyInputTooEarly
    "INPUT_TOO_LATE": 71,  # copyInputTooLate
    "EXEC_TOO_EARLY": 80,  # execTooEarly
    "EXEC_TOO_LATE": 81,  # execTooLate
    "EXEC_WEIGHTS_MISSING": 82,  # execWeightsMissing
    "OUTPUT_TOO_EARLY": 90,  # copyOutputTooEarly
    "OUTPUT_TOO_LATE": 91,  # copyOutputTooLate
}

# codes of ours, for what Clockwork's workers never say: numbers none of theirs take
OURS = {"WORKER_LOST": 100}  # the controller failed the action itself: its worker is gone

CLIENT_API = {"SUCCESS": 0, "ERROR": 1, "TIMEOUT": 4, "INVALID_REQUEST": 6}


def test_error_codes_are_the_worker_apis():
    assert {c.name: int(c) for c in ErrorCode} == WORKER_API | OURS
    assert not set(OURS.values()) & set(WORKER_API.values())


def test_request_statuses_are_the_client_apis():
    assert {s.name: int(s) for s in RequestStatus} == CLIENT_API

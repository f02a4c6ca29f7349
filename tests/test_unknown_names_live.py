"""An unknown model name is answered NOT_FOUND with a short message on every front end,
however many instances the controller serves: the few closest names and a count, never
every name (gRPC carries the message in a header: past its 8 KiB soft limit a client
saw RESOURCE_EXHAUSTED now and then, past 16 KiB every time)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import pytest

from tests.conftest import local_cluster

LONG = "a_model_with_a_rather_long_name_" + "x" * 60  # 92 characters
COPIES = 300  # 300 instances of ~96 characters: ~29 KB if all listed
BOUND = 1024  # bytes a message may take


def test_an_unknown_name_is_not_found_with_a_bounded_message_on_every_front_end():
    tgrpc = pytest.importorskip("tritonclient.grpc")
    from tritonclient.utils import InferenceServerException

    import clockwork
    from clockwork.errors import UnknownModel

    with local_cluster(workers=1, gpus=1, models="resnet50_v2", kserve_port=0,
                       controller_args=["--http-port", "0"]) as c:
        http = c.printed_address("http")
        with clockwork.Client(c.address, timeout=60) as cl:
            made = cl.load_model(LONG, copies=COPIES, profile="mobilenet_v2")
            assert len(made) == COPIES
            typo = LONG[:-1] + "y"  # one character off
            with pytest.raises(UnknownModel) as e:
                cl.infer(typo, slo_ms=500)
            assert len(str(e.value).encode()) < BOUND, len(str(e.value))
        k = tgrpc.InferenceServerClient(c.address)
        try:
            x = tgrpc.InferInput("data", [1, 3, 224, 224], "FP32")
            x.set_data_from_numpy(np.zeros((1, 3, 224, 224), np.float32))
            calls = [lambda: k.infer(typo, [x]), lambda: k.get_model_metadata(typo),
                     lambda: k.get_model_config(typo),
                     lambda: k.get_inference_statistics(typo)]
            for _ in range(5):  # (the soft limit failed some calls only)
                for call in calls:
                    with pytest.raises(InferenceServerException) as e:
                        call()
                    msg = e.value.message()
                    assert e.value.status() == "StatusCode.NOT_FOUND", (e.value.status(),
                                                                       msg[:200])
                    assert len(msg.encode()) < BOUND, len(msg)
                    assert repr(typo) in msg
                    assert repr(LONG) in msg  # the closest name
                    assert f"{COPIES + 1} served" in msg  # and how many there are
        finally:
            k.close()
        for method, path, body in (("POST", f"/v2/models/{typo}/infer", b'{"inputs": []}'),
                                   ("GET", f"/v2/models/{typo}", None),
                                   ("GET", f"/v2/models/{typo}/config", None),
                                   ("GET", f"/v2/models/{typo}/stats", None)):
            req = urllib.request.Request(f"http://{http}{path}", data=body, method=method)
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(req, timeout=20)
            raw = e.value.read()
            assert e.value.code == 404, (path, raw[:200])
            assert len(raw) < BOUND, (path, len(raw))
            assert LONG in json.loads(raw)["error"]

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


def test_the_clockwork_api_says_the_closest_names_as_kserve_does():
    """clockwork.v1's Infer, InferStream, LoadModel and UnloadModel say an unknown name
    back with the closest names and a count, in the very words the KServe front end uses
    (one message builder): ``UnknownModel`` names the model served that was meant."""
    import asyncio

    import clockwork
    from clockwork.errors import UnknownModel

    typo = "resnet50"
    with local_cluster(workers=1, gpus=1, models="resnet50_v2,mobilenet_v2",
                       controller_args=["--http-port", "0"]) as c:
        http = c.printed_address("http")
        req = urllib.request.Request(f"http://{http}/v2/models/{typo}/infer",
                                     data=b'{"inputs": []}', method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=20)
        assert e.value.code == 404
        kserve = json.loads(e.value.read())["error"]
        assert kserve == f"unknown model {typo!r} (did you mean 'resnet50_v2'? 2 served)"
        with clockwork.Client(c.address, timeout=60) as cl:
            with pytest.raises(UnknownModel) as e:
                cl.infer(typo, slo_ms=500)
            assert str(e.value) == kserve
            with pytest.raises(UnknownModel) as e:
                cl.unload_model(typo)
            assert str(e.value) == kserve
            # (the name said once: "NAME: " only where the words name another)
            for name, profile, said in ((typo, None, ""), ("mine", typo, "mine: ")):
                with pytest.raises(UnknownModel) as e:
                    cl.load_model(name, profile=profile)
                assert str(e.value).startswith(
                    f"{said}no profile {typo!r} (did you mean 'resnet50_v2' or "), str(e.value)
            with pytest.raises(UnknownModel) as e:
                cl.load_model("mine", profile="nosuch")  # nothing close: no guess
            assert "no profile 'nosuch' (" in str(e.value)
            assert "did you mean" not in str(e.value)
            cl.load_model("resnet5", profile="resnet18_v2")  # said anew once it is served
            with pytest.raises(UnknownModel) as e:
                cl.infer(typo, slo_ms=500)
            assert "(did you mean 'resnet5' or 'resnet50_v2'? 3 served)" in str(e.value)
            cl.unload_model("resnet5")
            with pytest.raises(UnknownModel) as e:
                cl.infer(typo, slo_ms=500)
            assert str(e.value) == kserve

        async def streamed():
            async with clockwork.AsyncClient(c.address, timeout=60) as ac:
                s = ac.stream()
                got = await asyncio.wait_for(asyncio.gather(
                    *(s.submit(n, slo_ms=500) for n in (typo, "mobilenet_v2", typo))), 30)
                await s.close()
                return got

        bad, good, again = asyncio.run(streamed())
        assert good.status == 0, good
        for r in (bad, again):
            assert (r.status, r.reason, r.message) == (6, "unknown_model", kserve), r


def test_the_unknown_name_messages_kept_are_of_short_names_only():
    """The messages kept for names asked again are of names a message repeats whole: a
    client's long names (up to the message size limit each) are answered, not kept."""
    from controller.service import HINT_ECHO, UNKNOWN_SAID, ControllerNode

    node = ControllerNode(["127.0.0.1:1"], "v100-reference", models="resnet50_v2")
    assert "did you mean 'resnet50_v2'" in node.unknown_model("resnet50")
    for i in range(UNKNOWN_SAID):
        long = f"{i}" + "x" * (1 << 20)
        assert node.unknown_model(long).startswith(f"unknown model '{i}xxx")
    kept = node._unknown_said[2]
    assert "resnet50" in kept and all(len(k) <= HINT_ECHO for k in kept), len(kept)

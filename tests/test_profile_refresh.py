"""A profile set looks in its folder again for a profile it lacks (``ProfileSet.find``):
at once when the folder changed since it was read, else at most once a second. So a
worker asked for a profile the controller has just found finds it too."""

from __future__ import annotations

import json
import shutil
import types

import pytest

from clockwork import profiles
from clockwork.profiles import load_profile_set
from clockwork.resources import data_root


@pytest.fixture
def clock(monkeypatch):
    """clockwork.profiles' monotonic clock, stopped (t[0] moves it)."""
    t = [1000.0]
    monkeypatch.setattr(profiles, "time", types.SimpleNamespace(monotonic=lambda: t[0]))
    return t


def _profile(folder, model: str) -> str:
    src = json.loads((folder / "resnet50_v2.json").read_text())
    src["model"] = model
    return json.dumps(src)


def test_a_profile_added_just_after_a_read_is_found_at_once(tmp_path, clock):
    folder = tmp_path / "set"
    shutil.copytree(data_root() / "profiles" / "v100-reference", folder)
    ps = load_profile_set(folder)
    assert ps.find("fresh") is None  # (the folder, unchanged since it was read)
    (folder / "fresh.json").write_text(_profile(folder, "fresh"))
    found = ps.find("fresh")  # the same instant: the folder changed
    assert found is not None and found.model == "fresh"


def test_a_file_completed_in_place_is_found_within_a_second(tmp_path, clock):
    folder = tmp_path / "set"
    shutil.copytree(data_root() / "profiles" / "v100-reference", folder)
    ps = load_profile_set(folder)
    f = folder / "late.json"
    f.write_text("{")  # being written: not a profile yet
    assert ps.find("late") is None
    f.write_text(_profile(folder, "late"))  # in place: the folder does not change
    assert ps.find("late") is None
    clock[0] += 1.01
    found = ps.find("late")
    assert found is not None and found.model == "late"


def test_a_folder_that_is_no_profile_set_is_named_as_such(tmp_path):
    """``--profiles`` given a folder that holds other JSON files and no set.json: the
    error says the folder was read as a profile set, without a set.json (it named an
    unrelated file as bad JSON, e.g. ``/tmp/azure_paper_scale-....json: not valid JSON``
    for ``--profiles /tmp``); it does not call set.json required (it is optional)."""
    import pytest

    from clockwork.profiles import ProfileError, load_profile_set

    (tmp_path / "notes.json").write_text("{not json")
    with pytest.raises(ProfileError) as e:
        load_profile_set(str(tmp_path))
    assert "notes.json: " in str(e.value) and str(e.value).endswith(
        f"(read as a profile set: {tmp_path} has no set.json, which is optional; a set is "
        "a folder of one JSON profile per model)"), str(e.value)


def test_a_load_of_a_profile_whose_file_cannot_be_read_says_why(tmp_path):
    """A profile file added to the controller's set that cannot be read (an element type
    no tensor may have): a load of that name says what is wrong with the file. It said
    "no profile 'bf16' (did you mean 'fp16'?)", the file left out without a word."""
    import asyncio

    from controller.service import RepositoryError
    from tests.inprocess import controller_with
    from worker.service import WorkerNode

    folder = tmp_path / "set"
    shutil.copytree(data_root() / "profiles" / "v100-reference", folder)

    async def main():
        wnode = WorkerNode(1, 64, str(folder))
        async with controller_with([wnode], str(folder), models="resnet50_v2") as node:
            bad = json.loads(_profile(folder, "bf16"))
            bad["inputs"] = [{"name": "x", "shape": [4], "dtype": "bfloat16"}]
            (folder / "bf16.json").write_text(json.dumps(bad))
            with pytest.raises(RepositoryError) as e:
                await node.load_model("bf16")
            mended = folder / "bf16.json.new"  # (renamed into place: the folder changes)
            mended.write_text(_profile(folder, "bf16"))
            mended.replace(folder / "bf16.json")
            await node.load_model("bf16")
            return e.value.message, sorted(node.instances)

    said, served = asyncio.run(asyncio.wait_for(main(), 60))
    assert "no profile 'bf16'" in said and "its file cannot be read" in said, said
    assert "'bfloat16' is not an element type a model may have" in said, said
    assert served == ["bf16", "resnet50_v2"]


def test_the_reason_a_file_could_not_be_read_goes_with_the_file(tmp_path, clock):
    """A profile file that cannot be read is named as such while it is there; once it is
    removed, nothing is said of it (its reason was kept, and a load of the name went on
    naming a file no longer there)."""
    folder = tmp_path / "set"
    shutil.copytree(data_root() / "profiles" / "v100-reference", folder)
    ps = load_profile_set(folder)
    (folder / "bad.json").write_text("{")
    assert ps.find("bad") is None and "bad.json" in ps.unreadable["bad"]
    (folder / "bad.json").unlink()
    assert ps.find("bad") is None and "bad" not in ps.unreadable

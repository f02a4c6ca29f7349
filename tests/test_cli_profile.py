"""``clockwork profile`` writing into a profile set by name: the set it writes into keeps
the models it had (a new ./profiles/DEVICE/ shadowed the whole shipped set with one
model), and a file that the set's name does not reach is said so."""

from __future__ import annotations

import pytest

from clockwork.cluster.cli import main

pytest.importorskip("tvm")

FAST = ["--batch-sizes", "1", "--runs", "2", "--load-runs", "1"]


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CLOCKWORK_PROFILES", raising=False)
    return tmp_path


def test_profile_into_a_new_local_set_keeps_the_shipped_models(here, capsys):
    from clockwork.profiles import load_profile_set
    from clockwork.resources import profiles_root

    shipped = load_profile_set(str(profiles_root() / "cpu"))
    assert main(["profile", "mlp", "--device", "cpu", *FAST]) == 0
    err = capsys.readouterr().err
    local = load_profile_set("cpu")  # what --profiles cpu (worker, serve, scenarios) reads
    assert local.path == here / "profiles" / "cpu", err
    assert sorted(local.profiles) == sorted(shipped.profiles), err
    assert local.weights_cache_pages == shipped.weights_cache_pages
    assert local.get("mlp").batch_sizes == [1]  # the new measurement ...
    for m in set(shipped.profiles) - {"mlp"}:  # ... beside the others, as shipped
        assert local.get(m).to_json() == shipped.get(m).to_json()
    assert "copy of profile set 'cpu'" in err and "wrote profiles/cpu/mlp.json" in err, err
    # again: the folder is there, so only the file is written
    assert main(["profile", "mlp", "--device", "cpu", *FAST]) == 0
    err = capsys.readouterr().err
    said = [x for x in err.strip().splitlines() if not x.startswith("clockwork profile: ")]
    assert "copy" not in err and len(said) == 1, err  # (the steps, then the file written)
    assert sorted(load_profile_set("cpu").profiles) == sorted(shipped.profiles)


def test_profile_into_a_set_the_name_does_not_reach_says_so(here, monkeypatch, capsys):
    from clockwork.profiles import load_profile_set
    from clockwork.resources import profiles_root

    env = here / "env"
    (env / "cpu").mkdir(parents=True)
    shipped = profiles_root() / "cpu"
    for f in ("resnet_tiny.json", "set.json"):
        (env / "cpu" / f).write_bytes((shipped / f).read_bytes())
    monkeypatch.setenv("CLOCKWORK_PROFILES", str(env))  # looked up before ./profiles
    assert main(["profile", "mlp", "--device", "cpu", *FAST]) == 0
    err = capsys.readouterr().err
    warnings = [x for x in err.splitlines() if "warning" in x]
    assert len(warnings) == 1 and str(env / "cpu") in warnings[0], err
    assert "--profiles profiles/cpu" in warnings[0], warnings[0]
    assert load_profile_set("profiles/cpu").get("resnet_tiny")  # started from env's set
    assert sorted(load_profile_set("cpu").profiles) == ["resnet_tiny"]  # env's, untouched


def test_a_package_of_another_model_is_refused(here, cpu_package, capsys):
    """``profile MODEL --package DIR``: a package that holds another model is refused,
    before anything runs (its profile, written under the package's model name, replaced
    that model's with nothing said of MODEL)."""
    pkg = cpu_package("mlp", here)
    assert main(["profile", "resnet18", "--package", str(pkg), *FAST]) == 2
    err = capsys.readouterr().err
    assert f"the package {pkg} holds model 'mlp', not 'resnet18'" in err, err
    assert not (here / "profiles").exists()
    assert main(["profile", "mlp", "--package", str(pkg), "--device", "cpu", *FAST]) == 0
    assert (here / "profiles" / "cpu" / "mlp.json").exists()
    err = capsys.readouterr().err  # (each step said as it is done: minutes for a real model)
    assert "clockwork profile: 1 LOADs: p99 " in err
    for b in (1, 2, 4, 8, 16):  # (the package's batch sizes)
        assert f"clockwork profile: batch {b}: 2 EXECs, p99 " in err, err
    # (FAST's --batch-sizes with a package: said not to apply, the package's measured;
    # they were left out with nothing said)
    assert "warning: --batch-sizes is for a model it compiles" in err, err


def test_sigterm_stops_a_profile_as_ctrl_c_does(here, cpu_package):
    """SIGTERM during ``clockwork profile`` ends it as Ctrl-C does: exit 130, its
    temporary folder gone (it was killed and left the folder behind)."""
    import os

    from tests.conftest import sigterm_once_made

    pkg = cpu_package("mlp", here)
    tmp = here / "tmp"
    tmp.mkdir()
    # (its temporary folder is made as it starts)
    rc, err = sigterm_once_made(["profile", "mlp", "--package", str(pkg), "--runs",
                                 "1000000", "--out", str(here / "p.json")], tmp,
                                env={**os.environ, "TMPDIR": str(tmp)},
                                prefix="clockwork-profile-")
    assert rc == 130 and "interrupted" in err, (rc, err)
    assert list(tmp.iterdir()) == [] and not (here / "p.json").exists()


def test_a_long_measurement_says_how_far_it_got(here, monkeypatch, capsys):
    """A batch size of a real-size model takes minutes on a CPU: a progress line at least
    every PROGRESS_S (it said nothing for 49 s, then 105 s); here every EXEC."""
    from worker import profiling

    monkeypatch.setattr(profiling, "PROGRESS_S", 0.0)
    assert main(["profile", "mlp", "--device", "cpu", "--out", str(here / "p" / "mlp.json"),
                 *FAST]) == 0
    err = capsys.readouterr().err
    assert "clockwork profile: batch 1: 1 of 2 EXECs so far" in err, err


def test_a_profile_beside_another_of_the_same_model_is_refused(here, cpu_package, capsys):
    """``--out`` naming another file of a folder that holds the model's profile: refused
    before anything is measured (both were kept, and every run of the set was refused:
    "model 'mlp' already has a profile in this set")."""
    pkg = cpu_package("mlp", here)
    out = here / "pr"
    assert main(["profile", "mlp", "--package", str(pkg), "--device", "cpu", "--out",
                 str(out / "mlp.json"), *FAST]) == 0
    capsys.readouterr()
    assert main(["profile", "mlp", "--package", str(pkg), "--device", "cpu", "--out",
                 str(out / "mlp2.json"), *FAST]) == 2
    err = capsys.readouterr().err
    assert f"{out / 'mlp.json'} holds a profile of model 'mlp' already" in err, err
    assert "LOADs" not in err and not (out / "mlp2.json").exists()
    # over the same file: as before
    assert main(["profile", "mlp", "--package", str(pkg), "--device", "cpu", "--out",
                 str(out / "mlp.json"), *FAST]) == 0

"""The shipped data (clockwork/data), name lookup of scenarios and profile sets, data paths
in scenario files, and ``clockwork scenarios`` (list / copy)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from clockwork import resources
from clockwork.cluster.cli import main
from clockwork.profiles import ProfileError, load_profile_set
from clockwork.scenario import ScenarioError, load_scenario

REPO = Path(__file__).resolve().parent.parent
SAMPLE = "traces/samples/invocations_per_function_md.anon.d01.csv.gz"


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """Run the test from an empty folder outside the checkout."""
    d = tmp_path / "cwd"
    d.mkdir()
    monkeypatch.chdir(d)
    monkeypatch.delenv("CLOCKWORK_PROFILES", raising=False)
    return d


def run_scenarios(*argv: str) -> int:
    return main(["scenarios", *argv])


# ------------------------------------------------------------------ layout

def test_data_lives_in_the_package():
    root = resources.data_root()
    assert root == REPO / "clockwork" / "data"
    assert (resources.profiles_root() / "v100-reference" / "resnet50_v2.json").is_file()
    assert (resources.profiles_root() / "cpu" / "set.json").is_file()
    assert (root / SAMPLE).is_file()
    assert "demo_live" in resources.shipped_scenario_names()


@pytest.mark.parametrize("link, target", [
    ("scenarios", "clockwork/data/scenarios"),
    ("profiles/v100-reference", "../clockwork/data/profiles/v100-reference"),
    ("profiles/cpu", "../clockwork/data/profiles/cpu"),
    ("traces/samples", "../clockwork/data/traces/samples"),
])
def test_checkout_paths_are_relative_symlinks(link, target):
    p = REPO / link
    assert p.is_symlink() and os.readlink(p) == target
    assert p.resolve() == (REPO / "clockwork" / "data" / link).resolve()
    assert p.resolve().is_relative_to(REPO / "clockwork" / "data")
    assert any(p.iterdir())


def test_old_paths_still_work_from_the_repo(monkeypatch):
    monkeypatch.chdir(REPO)
    assert Path("scenarios/demo_live.toml").is_file()
    assert Path(SAMPLE).is_file()
    assert Path("profiles/cpu/resnet18.json").is_file()
    assert Path("profiles/make_v100_reference.py").is_file()
    assert Path("traces/README.md").is_file()


# ------------------------------------------------------------------ scenarios by name

@pytest.mark.parametrize("name", ["demo_live", "demo_live.toml", "scenarios/demo_live.toml"])
def test_resolve_scenario_by_name(elsewhere, name):
    p = resources.resolve_scenario(name)
    assert p == resources.scenarios_root() / "demo_live.toml"
    assert load_scenario(name).data["name"] == "demo-live-azure"


def test_an_existing_file_wins(elsewhere):
    own = elsewhere / "demo_live.toml"
    own.write_text((resources.scenarios_root() / "poisson_warm.toml").read_text())
    assert resources.resolve_scenario("demo_live.toml") == Path("demo_live.toml")
    assert load_scenario("demo_live.toml").data["name"] == "poisson-warm"
    # a bare name is still the shipped scenario (no file called "demo_live" here)
    assert resources.resolve_scenario("demo_live") == resources.scenarios_root() / "demo_live.toml"


def test_repo_relative_scenario_path_from_the_repo(monkeypatch):
    monkeypatch.chdir(REPO)
    assert resources.resolve_scenario("scenarios/demo_live.toml") == Path("scenarios/demo_live.toml")


@pytest.mark.parametrize("bad, suggestion", [
    ("demo_lve", "demo_live"),
    ("scenarios/poison_warm.toml", "poisson_warm"),
    ("fig5", "fig5_1gpu"),
])
def test_unknown_scenario_suggests_the_closest(elsewhere, bad, suggestion):
    with pytest.raises(ScenarioError) as e:
        resources.resolve_scenario(bad)
    msg = str(e.value)
    assert "\n" not in msg and "not found" in msg and suggestion in msg
    assert "closest shipped scenarios" in msg
    with pytest.raises(ScenarioError, match=suggestion):
        load_scenario(bad)


def test_missing_path_is_not_taken_for_a_shipped_name(elsewhere):
    """Only NAME, NAME.toml and scenarios/NAME.toml mean a shipped scenario."""
    for bad in ("other/demo_live.toml", str(elsewhere / "demo_live.toml")):
        with pytest.raises(ScenarioError, match="not found"):
            resources.resolve_scenario(bad)


def test_nothing_close_lists_every_shipped_name(elsewhere):
    with pytest.raises(ScenarioError, match="shipped scenarios: .*poisson_warm"):
        resources.resolve_scenario("qqqqqqqqqq")


def test_list_scenarios_has_descriptions():
    items = dict(resources.list_scenarios())
    assert set(items) == set(resources.shipped_scenario_names())
    assert len(items) >= 10
    assert all(d for d in items.values())
    assert items["poisson_warm"].startswith("One warm model, Poisson arrivals")


def test_description_key_wins(tmp_path):
    f = tmp_path / "x.toml"
    f.write_text('# a comment\ndescription = """two\n  lines"""\nname = "x"\n')
    assert resources.scenario_description(f) == "two lines"
    f.write_text('# first line\n# second line\n\n# later\nname = "x"\n')
    assert resources.scenario_description(f) == "first line second line"
    f.write_text('name = "only-a-name"\n')
    assert resources.scenario_description(f) == "only-a-name"


# ------------------------------------------------------------------ data paths

def test_resolve_data_path_order(elsewhere, tmp_path):
    shipped = resources.data_root() / SAMPLE
    assert resources.resolve_data_path(SAMPLE) == shipped
    base = tmp_path / "scen"
    (base / "traces" / "samples").mkdir(parents=True)
    shutil.copyfile(shipped, base / SAMPLE)
    assert resources.resolve_data_path(SAMPLE, base) == base / SAMPLE
    (elsewhere / "traces" / "samples").mkdir(parents=True)
    shutil.copyfile(shipped, elsewhere / SAMPLE)
    assert resources.resolve_data_path(SAMPLE, base) == Path(SAMPLE)  # cwd first
    with pytest.raises(FileNotFoundError, match="no/such.csv not found .tried"):
        resources.resolve_data_path("no/such.csv", base)


def test_trace_relative_to_the_scenario_folder(elsewhere, tmp_path):
    """A scenario naming its own trace next to it runs from any folder, unchanged."""
    from clockwork.cluster.sim import Simulation, simulate

    d = tmp_path / "mine"
    (d / "data").mkdir(parents=True)
    shutil.copyfile(resources.data_root() / SAMPLE, d / "data" / "day1.csv.gz")
    text = (resources.scenarios_root() / "azure_sample.toml").read_text()
    assert f'trace = "{SAMPLE}"' in text
    (d / "s.toml").write_text(text.replace(SAMPLE, "data/day1.csv.gz"))
    sim = Simulation(load_scenario(str(d / "s.toml"), ["duration_s=2"]))
    assert sim.workloads[0].trace_source == str(d / "data" / "day1.csv.gz")
    assert simulate(str(d / "s.toml"), ["duration_s=2"]).summary["submitted"] > 0
    (d / "data" / "day1.csv.gz").unlink()
    with pytest.raises(ScenarioError, match="day1.csv.gz not found"):
        simulate(str(d / "s.toml"), ["duration_s=2"])


def test_a_missing_trace_names_every_place_tried(elsewhere, tmp_path):
    """A trace found nowhere is refused naming every place it was looked for, the
    scenario's folder among them (that one was tried but left out of the message)."""
    from clockwork.cluster.sim import simulate

    d = tmp_path / "mine"
    d.mkdir()
    text = (resources.scenarios_root() / "azure_sample.toml").read_text()
    (d / "s.toml").write_text(text.replace(SAMPLE, "data/day1.csv.gz"))
    with pytest.raises(ScenarioError) as e:
        simulate(str(d / "s.toml"), ["duration_s=2"])
    tried = resources.data_path_candidates("data/day1.csv.gz", d)
    assert d / "data" / "day1.csv.gz" in tried
    assert f"(tried {', '.join(str(c) for c in tried)})" in str(e.value)


def test_shipped_trace_found_from_anywhere(elsewhere):
    from clockwork.cluster.sim import Simulation

    sc = load_scenario("azure_sample", ["duration_s=2"])
    assert sc.source == str(resources.scenarios_root() / "azure_sample.toml")
    sim = Simulation(sc)
    assert sim.workloads[0].trace_source == str(resources.data_root() / SAMPLE)
    assert sim.run().summary["submitted"] > 0


# ------------------------------------------------------------------ profile sets

def test_profile_sets_found_from_anywhere(elsewhere):
    ps = load_profile_set("v100-reference")
    assert ps.path == resources.profiles_root() / "v100-reference"
    assert "resnet50_v2" in ps.profiles
    assert load_profile_set("profiles/cpu").path == resources.profiles_root() / "cpu"
    with pytest.raises(ProfileError, match="profile set 'nope' not found"):
        load_profile_set("nope")


def _one_profile_set(folder: Path, weights_cache_pages: int) -> None:
    folder.mkdir(parents=True)
    shutil.copyfile(resources.profiles_root() / "v100-reference" / "resnet50_v2.json",
                    folder / "resnet50_v2.json")
    (folder / "set.json").write_text(f'{{"weights_cache_pages": {weights_cache_pages}}}')


def test_profile_lookup_order(elsewhere, tmp_path, monkeypatch):
    _one_profile_set(elsewhere / "profiles" / "v100-reference", 11)
    assert load_profile_set("v100-reference").weights_cache_pages == 11  # ./profiles first
    _one_profile_set(tmp_path / "env" / "v100-reference", 22)
    monkeypatch.setenv("CLOCKWORK_PROFILES", str(tmp_path / "env"))
    assert load_profile_set("v100-reference").weights_cache_pages == 22  # then the env
    assert load_profile_set(str(tmp_path / "env" / "v100-reference")).path == \
        tmp_path / "env" / "v100-reference"  # an explicit path wins
    assert load_profile_set("cpu").path == resources.profiles_root() / "cpu"  # shipped last


def test_a_profile_set_beside_the_scenario_is_found(elsewhere, tmp_path):
    """``cluster.profiles`` as a set's name is looked for in the set roots, then beside
    the scenario file (it was never looked for there: "profile set 'rp' not found (tried
    ./profiles/rp, ...)"); not found, the message names every place tried. A live cluster started from the scenario names such a set by its
    absolute path (its processes have no scenario folder)."""
    from clockwork.cluster.serve import cluster_from_scenario
    from clockwork.cluster.sim import simulate

    d = tmp_path / "scen"
    _one_profile_set(d / "rp", 33)
    text = (resources.scenarios_root() / "poisson_warm.toml").read_text()
    assert 'profiles = "v100-reference"' in text
    (d / "s.toml").write_text(text.replace('"v100-reference"', '"rp"'))
    sc = load_scenario(str(d / "s.toml"), ["duration_s=1"])
    assert simulate(sc).summary["submitted"] > 0
    from clockwork.profiles import find_profile_set, profile_set_candidates

    assert load_profile_set("rp", d).weights_cache_pages == 33
    assert find_profile_set("rp", d) == d / "rp"
    assert cluster_from_scenario(sc)[0]["profiles"] == str(d / "rp")
    # a name that is not beside the scenario: every place tried, its folder among them
    with pytest.raises(ScenarioError) as e:
        simulate(str(d / "s.toml"), ["duration_s=1", "cluster.profiles=nope"])
    tried = profile_set_candidates("nope", d)
    assert d / "nope" in tried and elsewhere / "profiles" / "nope" in [
        c if c.is_absolute() else elsewhere / c for c in tried]
    assert f"(tried {', '.join(str(c) for c in tried)})" in str(e.value)
    # a set's name finds that set, even with a folder of that name beside the scenario
    _one_profile_set(d / "cpu", 44)
    assert load_profile_set("cpu", d).path == resources.profiles_root() / "cpu"
    (d / "s2.toml").write_text(text)
    assert cluster_from_scenario(load_scenario(str(d / "s2.toml")))[0]["profiles"] == \
        "v100-reference"  # found without the scenario's folder too: as written


def test_a_bare_set_name_is_looked_for_only_among_sets_and_beside_the_scenario(elsewhere,
                                                                              tmp_path):
    """A name without a ``/`` is a set's name: the set roots, then a folder of that name
    beside the scenario file; not the current folder, the shipped data or the checkout
    root (``profiles = "traces"`` found ``clockwork/data/traces`` and read it as a set).
    A path (with a ``/``) is still looked for as given and in the shipped data."""
    from clockwork.profiles import find_profile_set, profile_set_candidates

    d = tmp_path / "scen"
    d.mkdir()
    for name in ("traces", "scenarios", "profiles"):
        assert find_profile_set(name, d) is None, name
        with pytest.raises(ProfileError, match=f"profile set '{name}' not found"):
            load_profile_set(name, d)
        tried = profile_set_candidates(name, d)
        assert resources.data_root() / name not in tried, tried
        assert d / name in tried
    _one_profile_set(elsewhere / "here", 55)  # in the current folder: not for a name
    assert find_profile_set("here", d) is None
    assert load_profile_set("./here", d).weights_cache_pages == 55  # a path is
    assert find_profile_set("profiles/cpu", d) == resources.profiles_root() / "cpu"


# ------------------------------------------------------------------ clockwork scenarios

def test_scenarios_list(capsys):
    assert run_scenarios() == 0
    out = capsys.readouterr().out
    for name, _ in resources.list_scenarios():
        assert name in out
    assert "One warm model" in out
    assert run_scenarios("list") == 0


def test_scenarios_copy_with_trace(elsewhere, tmp_path, capsys):
    dest = tmp_path / "out"
    assert run_scenarios("copy", "demo_live", "poisson_warm.toml", "--to", str(dest)) == 0
    got = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert got == ["demo_live.toml", "poisson_warm.toml", SAMPLE]
    for n in ("demo_live", "poisson_warm"):  # unchanged copies
        assert (dest / f"{n}.toml").read_bytes() == \
            (resources.scenarios_root() / f"{n}.toml").read_bytes()
    assert (dest / SAMPLE).read_bytes() == (resources.data_root() / SAMPLE).read_bytes()
    capsys.readouterr()
    # again: identical files are fine; an edited one is kept unless --force
    assert run_scenarios("copy", "demo_live", "--to", str(dest)) == 0
    (dest / "demo_live.toml").write_text("# mine\n")
    assert run_scenarios("copy", "demo_live", "--to", str(dest)) == 2  # a usage error
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "differ" in err and "--force" in err, err
    assert (dest / "demo_live.toml").read_text() == "# mine\n"
    assert run_scenarios("copy", "demo_live", "--to", str(dest), "--force") == 0
    assert (dest / "demo_live.toml").read_bytes() == \
        (resources.scenarios_root() / "demo_live.toml").read_bytes()


def test_scenarios_copy_takes_a_shipped_sweep_too(elsewhere, tmp_path):
    """The example sweep says to copy it out and edit it: ``scenarios copy example``
    copies the sweep file as it is (it had no command: 'no shipped scenario')."""
    from clockwork.cluster.sweep import load_sweep

    dest = tmp_path / "mine"
    assert run_scenarios("copy", "example", "poisson_warm", "--to", str(dest)) == 0
    assert sorted(p.name for p in dest.iterdir()) == ["example.toml", "poisson_warm.toml"]
    assert (dest / "example.toml").read_bytes() == \
        (resources.sweeps_root() / "example.toml").read_bytes()
    assert load_sweep(dest / "example.toml").name == "example"  # (runs from there as it is)
    assert run_scenarios("copy", "sweeps/example.toml", "--to", str(tmp_path / "b")) == 0
    assert (tmp_path / "b" / "example.toml").is_file()


@pytest.mark.parametrize("name,said", [
    ("exampel", "no shipped scenario 'exampel'; closest: example (a sweep)"),
    # only the shipped sweeps' names: no other file reached from their folder
    ("../../../pyproject", "no shipped scenario '../../../pyproject'"),
    ("../scenarios/faults", "no shipped scenario '../scenarios/faults'"),
])
def test_scenarios_copy_refuses_what_is_no_shipped_name(name, said, tmp_path, capsys):
    assert run_scenarios("copy", name, "--to", str(tmp_path / "x")) == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_scenarios_copy_all(tmp_path):
    dest = tmp_path / "all"
    assert run_scenarios("copy", "--all", "--to", str(dest)) == 0
    assert sorted(p.stem for p in dest.glob("*.toml")) == resources.shipped_scenario_names()
    assert (dest / SAMPLE).is_file()


def test_scenarios_copy_errors(tmp_path, capsys):
    dest = tmp_path / "none"
    assert run_scenarios("copy", "demo_live", "demo_lve", "--to", str(dest)) == 2
    assert "closest: demo_live" in capsys.readouterr().err
    assert not dest.exists()  # nothing copied
    assert run_scenarios("copy", "--to", str(dest)) == 2
    assert "--all" in capsys.readouterr().err


def test_copied_scenario_runs_unchanged_from_elsewhere(elsewhere, tmp_path):
    from clockwork.cluster.sim import Simulation, simulate

    dest = tmp_path / "copied"
    assert run_scenarios("copy", "azure_sample", "--to", str(dest)) == 0
    sc = load_scenario(str(dest / "azure_sample.toml"), ["duration_s=2"])
    assert Simulation(sc).workloads[0].trace_source == str(dest / SAMPLE)  # the copy's
    res = simulate(sc)
    assert res.scenario.source == str(dest / "azure_sample.toml")
    assert res.summary["submitted"] > 0


@pytest.mark.parametrize("name,hint", [
    ("v100", "; did you mean 'v100-reference'?"),
    ("cpuu", "; did you mean 'cpu'?"),
    ("zzz", "; the sets found by name: cpu, cuda, v100-reference"),
])
def test_a_profile_set_not_found_by_name_says_which_are(name, hint, tmp_path, monkeypatch):
    """A set's name not found: the closest set found by name is hinted at (a name it
    begins, as v100 of v100-reference), or those sets are listed."""
    from clockwork.profiles import ProfileError, load_profile_set

    monkeypatch.chdir(tmp_path)  # (no ./profiles of this folder)
    monkeypatch.delenv("CLOCKWORK_PROFILES", raising=False)
    with pytest.raises(ProfileError) as e:
        load_profile_set(name)
    assert str(e.value).startswith(f"profile set {name!r} not found (tried "), e.value
    assert str(e.value).endswith(hint), e.value


def test_a_profile_set_beside_the_scenario_is_hinted_at_too(tmp_path, monkeypatch):
    """A set found by name beside the scenario file (``base``) is among those hinted at;
    a $CLOCKWORK_PROFILES that is no folder is passed over."""
    from clockwork.profiles import ProfileError, load_profile_set

    (tmp_path / "sc" / "myset").mkdir(parents=True)
    (tmp_path / "sc" / "myset" / "set.json").write_text("{}")
    (tmp_path / "file").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CLOCKWORK_PROFILES", str(tmp_path / "file"))
    with pytest.raises(ProfileError) as e:
        load_profile_set("mysett", tmp_path / "sc")
    assert str(e.value).endswith("; did you mean 'myset'?"), e.value

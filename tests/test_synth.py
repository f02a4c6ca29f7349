"""The synthetic trace generator reproduces its documented statistics, deterministically."""

from __future__ import annotations

import re

import numpy as np
import pytest

from clockwork.cluster.cli import main
from clockwork.workloads import synth
from clockwork.workloads.azure import HEADER, MINUTES, AzureTrace
from clockwork.workloads.synth import (
    LOG10_DAILY,
    TRIGGER_SHARE,
    daily_count_cdf,
    generate,
    write_synthetic,
)

N = 8000


@pytest.fixture(scope="module")
def day() -> AzureTrace:
    return generate(N, days=1, seed=11)[0]


def _ks_discrete(sample: np.ndarray, cdf) -> float:
    """Kolmogorov-Smirnov distance between an integer sample and a discrete CDF. Both are
    step functions constant on [k, k+1), so the sup is taken at the sample's values and
    just below them."""
    x = np.sort(sample)
    k = np.unique(x)
    pts = np.unique(np.concatenate([k, k - 1]))
    pts = pts[pts >= 1]
    emp = np.searchsorted(x, pts, side="right") / len(x)
    return float(np.abs(emp - cdf(pts)).max())


def _mixture_cdf(triggers: np.ndarray, shift: float = 0.0):
    share = {t: float(np.mean(triggers == t)) for t in LOG10_DAILY}

    def cdf(k):
        return sum(w * daily_count_cdf(k / 10**shift, t) for t, w in share.items())
    return cdf


def test_daily_counts_follow_documented_distribution(day):
    tot = day.totals().astype(np.int64)
    nt = day.triggers != "timer"
    crit = 1.63 / np.sqrt(nt.sum())  # KS, 1 % level (conservative for discrete data)
    assert _ks_discrete(tot[nt], _mixture_cdf(day.triggers[nt])) < crit
    http = day.triggers == "http"
    assert _ks_discrete(tot[http], lambda k: daily_count_cdf(k, "http")) < 1.63 / np.sqrt(http.sum())
    # the test has power: a distribution shifted by a factor of 1.6 is rejected
    assert _ks_discrete(tot[nt], _mixture_cdf(day.triggers[nt], shift=0.2)) > crit


def test_heavy_tail_spans_orders_of_magnitude(day):
    tot = day.totals()
    assert tot.min() >= 1
    assert np.log10(tot.max()) - np.log10(tot.min()) >= 6.5
    # the paper: ~45 % invoked at most hourly, ~81 % at most once a minute
    assert 0.38 < np.mean(tot <= 24) < 0.50
    assert 0.75 < np.mean(tot <= 1440) < 0.87


def test_trigger_mix(day):
    for trig, p in TRIGGER_SHARE.items():
        got = float(np.mean(day.triggers == trig))
        assert abs(got - p) < 4 * np.sqrt(p * (1 - p) / N), (trig, got, p)


def test_timers_are_periodic(day):
    timers = np.flatnonzero(day.triggers == "timer")
    assert len(timers) > 0.1 * N
    periods = set()
    for i in timers.tolist():
        row = day.counts[i]
        on = np.flatnonzero(row)
        assert len(set(row[on].tolist())) == 1          # same count at every firing
        if len(on) > 1:
            gaps = set(np.diff(on).tolist())
            assert len(gaps) == 1                       # evenly spaced
            periods.add(gaps.pop())
        if row[on[0]] > 1:
            assert len(on) == MINUTES                   # sub-minute schedules fire every minute
    assert {1, 5, 60} <= periods


def test_functions_per_app(day):
    _, sizes = np.unique(day.apps, return_counts=True)
    share1 = np.mean(sizes == 1)
    assert abs(share1 - 0.54) < 0.04
    assert abs(np.mean(sizes == 2) - 0.16) < 0.03
    assert 0.02 < np.mean(sizes >= 11) < 0.08
    # every app belongs to one owner
    pairs = set(zip(day.apps.tolist(), day.owners.tolist(), strict=True))
    assert len(pairs) == len(sizes)


def test_ids_and_row_order(day):
    for col in (day.owners, day.apps, day.functions):
        assert all(re.fullmatch(r"[0-9a-f]{64}", s) for s in col[:200].tolist())
    assert len(set(day.functions.tolist())) == N
    keys = list(zip(day.owners.tolist(), day.apps.tolist(), day.functions.tolist(), strict=True))
    assert keys == sorted(keys)


def test_diurnal_shape(day):
    tot = day.totals()
    busy = (day.triggers != "timer") & (tot >= 10_000)
    c = day.counts[busy].astype(np.int64)
    peak_half = c[:, 600:1080].sum(axis=1)
    night_half = c[:, list(range(0, 240)) + list(range(1200, 1440))].sum(axis=1)
    assert np.mean(peak_half > night_half) > 0.85


def test_some_functions_are_bursty(day):
    tot = day.totals().astype(np.float64)
    c = day.counts.astype(np.float64)
    busy = (day.triggers != "timer") & (tot >= 5000)
    ratio = c[busy].max(axis=1) / (tot[busy] / MINUTES)
    # diurnal alone gives a peak below 1.6x the mean; bursts give far more
    assert 0.03 < np.mean(ratio > 4) < 0.3


def test_deterministic_per_seed(tmp_path):
    a = write_synthetic(tmp_path / "a", 300, days=2, seed=5)
    b = write_synthetic(tmp_path / "b", 300, days=2, seed=5)
    c = write_synthetic(tmp_path / "c", 300, days=1, seed=6)
    assert [p.name for p in a] == ["invocations_per_function_md.anon.d01.csv",
                                   "invocations_per_function_md.anon.d02.csv"]
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    assert a[0].read_bytes() != c[0].read_bytes()
    assert a[0].read_text().split("\n", 1)[0] == HEADER


def test_days_share_functions_but_differ():
    d1, d2 = generate(500, days=2, seed=3)
    assert (d1.functions == d2.functions).all() and (d1.triggers == d2.triggers).all()
    assert not np.array_equal(d1.counts, d2.counts)
    timers = d1.triggers == "timer"
    np.testing.assert_array_equal(d1.counts[timers], d2.counts[timers])
    r = np.corrcoef(np.log10(d1.totals()[~timers]), np.log10(d2.totals()[~timers]))[0, 1]
    assert r > 0.95


def test_written_file_reads_back(tmp_path):
    (p,) = write_synthetic(tmp_path, 200, seed=2, gzip=True)
    assert p.name.endswith(".csv.gz")
    tr = AzureTrace.load(p)
    np.testing.assert_array_equal(tr.counts, generate(200, seed=2)[0].counts)


def test_a_day_written_again_in_the_other_form_replaces_it(tmp_path, capsys):
    """``trace synth --gzip --force`` into a folder holding the same day as a plain .csv
    (or back): the old file was left, and the replay and ``trace info 1`` took it,
    silently. Now it is replaced; and a folder holding a day twice is refused by name."""
    from clockwork.workloads.azure import TraceError, find_trace_file

    (old,) = write_synthetic(tmp_path, 80, seed=2)
    (new,) = write_synthetic(tmp_path, 50, seed=1, gzip=True, replace=True)
    assert not old.exists() and find_trace_file(1, tmp_path) == new
    assert main(["trace", "info", "1", "--trace-dir", str(tmp_path), "--top", "0"]) == 0
    assert "functions     50" in capsys.readouterr().out
    write_synthetic(tmp_path / "other", 60, seed=3)
    (tmp_path / "other" / old.name).rename(old)  # both forms, put there by hand
    with pytest.raises(TraceError, match="2 trace files for day 1 in .*keep only"):
        find_trace_file(1, tmp_path)
    assert main(["trace", "info", "1", "--trace-dir", str(tmp_path)]) == 2
    assert "2 trace files for day 1" in capsys.readouterr().err


def test_bad_arguments():
    with pytest.raises(ValueError):
        generate(0)
    with pytest.raises(ValueError):
        generate(10, days=0)


def test_cli_synth_and_info(tmp_path, capsys):
    assert main(["trace", "synth", "--functions", "150", "--days", "2", "--seed", "4",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "anon.d01.csv" in out and "anon.d02.csv" in out
    assert main(["trace", "info", str(tmp_path / "invocations_per_function_md.anon.d02.csv"),
                 "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "functions     150" in out and "top 3 functions" in out and "load time" in out
    for trig in ("http", "timer"):
        assert re.search(rf"^{trig}\s+\d+", out, re.M)
    assert main(["trace", "info", str(tmp_path / "nope.csv")]) == 2
    assert "not found" in capsys.readouterr().err


def test_cli_help_mentions_dataset(capsys):
    assert main(["trace", "--help"]) == 0
    assert "Azure Functions Trace 2019" in capsys.readouterr().out


def test_module_documents_its_parameters():
    doc = synth.__doc__
    for word in ("Shahrad", "TRIGGER_SHARE", "LOG10_DAILY", "TIMER_PERIODS_S", "APP_SIZES",
                 "assumption"):
        assert word in doc


def test_each_day_is_said_as_it_is_written(tmp_path):
    """``write_synthetic`` hands each day file over as it is written, so that ``trace
    synth`` can say so then (it printed every file at the end: minutes of silence for
    a fortnight of a real-size day)."""
    from clockwork.workloads.synth import write_synthetic

    seen = []

    def written(p):
        seen.append((p.name, sorted(x.name for x in tmp_path.iterdir())))

    paths = write_synthetic(tmp_path, 50, days=2, seed=3, written=written)
    assert [n for n, _ in seen] == [p.name for p in paths]
    assert seen[0][1] == [paths[0].name]  # (day 2 not made yet when day 1 was said)


def test_synth_into_a_folder_holding_those_days_is_refused_without_force(tmp_path, capsys):
    """A folder holding day files (a real trace's, of either name form, say) is refused
    before anything is made, naming them, exit 2: ``trace synth`` replaced them
    silently. ``--force`` replaces those days' files in every form and says so; other
    days' files are left."""
    from clockwork.workloads.azure import trace_file_name

    real = tmp_path / trace_file_name(1, svls=True)
    real.write_bytes(b"a real day\n")
    third = tmp_path / trace_file_name(3)
    third.write_bytes(b"another day\n")
    argv = ["trace", "synth", "--functions", "20", "--days", "2", "--out", str(tmp_path)]
    assert main(argv) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and real.name in cap.err and "--force" in cap.err, cap
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([real.name, third.name])
    assert real.read_bytes() == b"a real day\n"
    assert main([*argv, "--force"]) == 0
    err = capsys.readouterr().err
    assert f"replaced 1 earlier file(s) of these days in {tmp_path} ({real.name})" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [trace_file_name(1), trace_file_name(2), third.name])
    assert third.read_bytes() == b"another day\n"


def test_synth_into_a_dangling_link_says_the_system_error_not_force(tmp_path, capsys):
    """``--out`` a symbolic link to nothing: the folder cannot be made, said as the system
    says it, exit 1 (the refusal of existing days' files took it, and said --force)."""
    out = tmp_path / "dangling"
    out.symlink_to(tmp_path / "nowhere")
    for extra in ([], ["--force"]):
        assert main(["trace", "synth", "--functions", "10", "--out", str(out), *extra]) == 1
        err = capsys.readouterr().err
        assert f"cannot write into {out}" in err and "--force" not in err, err

"""Write ``docs/settings.md`` from the settings schemas: ``python -m clockwork.cluster.settings_doc``
(``--check``: exit 1 if the file is not what the schemas give); ``clockwork settings
[TOPIC]`` prints the same page, or a topic's sections, from an installed package.

A composition root, like ``clockwork.cluster.sim``: besides the scenario schemas of
``clockwork.settings`` it reads the scheduler's and the baselines' schemas from
``controller/`` (imported inside ``render``, so importing this module pulls in nothing).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from clockwork.settings import (
    AddWorkersEvent,
    ClusterSettings,
    ControllerRestartFault,
    FaultSettings,
    HangFault,
    KillFault,
    ModelEntry,
    ProfileFile,
    ProfileSetFile,
    RemoveWorkersEvent,
    RepositoryEvent,
    ScenarioSettings,
    SchedulerTable,
    SlowNetworkFault,
    TensorEntry,
    WorkloadEntry,
    markdown_table,
)
from clockwork.sizes import (
    MAX_GPUS,
    MAX_INSTANCES,
    MAX_MINUTE_ARRIVALS,
    MAX_OFFERED_REQUESTS,
    MAX_OUTSTANDING,
    MAX_PERIODS,
    MAX_POINTS,
    MAX_STEPS,
    MAX_TOML_DEPTH,
)

ROOT = Path(__file__).resolve().parents[2]  # the source checkout, when it is one
DEFAULT_OUT = ROOT / "docs" / "settings.md"

INTRO = """\
# Settings

<!-- Generated from the settings schemas by `python -m clockwork.cluster.settings_doc`; edit the
schemas' descriptions (clockwork/settings.py, controller/config.py,
controller/baselines/, controller/limits.py), not this file. tests/test_settings.py checks
it is current. -->

Every key a scenario file takes, every scheduler setting and every key of a profile file,
with its type, default, allowed values and meaning. The descriptions are the schemas'
own (`clockwork/settings.py` for the scenario and profile files, `controller/config.py`
for the clockwork scheduler, `controller/baselines/` for the baselines,
`controller/limits.py` for the controller's limits), so this page
and the checks cannot disagree.

How values are checked, everywhere (scenario files, `--set KEY=VALUE` of `clockwork
simulate`, `serve` and `controller`, `--models`, profile files):

- Types are strict: `true` is not a number, `"4"` is not an integer, `4.0` is not an
  integer either; an integer is accepted where a number is expected.
- Numbers must be finite: `nan` and `inf` are refused wherever a number is expected
  (in `[[workloads]]` entries, for every key).
- Times are bounded: an SLO (`slo_ms`, `default_slo_ms`, `slo_ms_start`, `slo_ms_max`) is
  at most a day (86,400,000 ms, as the live controller takes), an SLO factor
  (`slo_factor`, `slo_factor_start`, ...) at most 10,000, and any other time (a key ending
  in `_s`, `_ms` or `_us`) at most a year, either way. A larger value is a unit slip or a
  stand-in for "never", and would not fit the logs' nanoseconds. (A stepped SLO that
  grows without a maximum stops growing at a day; one that shrinks stays at least 1 ns.)
- Sizes are bounded, each key (the ranges below) and in all, so that a typo is refused
  before the run exhausts memory building it: `workers` x `gpus_per_worker` at most
  MAX_GPUS GPUs, the `copies` of all `[[models]]` entries together at most MAX_INSTANCES
  instances, and a closed loop's `concurrency` x the instances it selects at most
  MAX_OUTSTANDING outstanding requests.
- Offered load is bounded (`clockwork/sizes.py`): a run's workloads offer at most
  MAX_OFFERED_REQUESTS requests (expected; ~75 bytes of rows each, ~70 GiB in all
  without `--spill-dir`; a closed loop counts as its clients each sending again every
  `retry_ms`, or `think_ms` if longer, as when every request fails). Every `*_rps` key of every `[[workloads]]`
  entry x `duration_s`, in all, is checked when the scenario is read (so a sweep or a
  plan refuses it before anything runs), and each workload's own figure (its default
  rates, an `azure` replay's trace counts x `load_factor`) when it is built. An `azure`
  replay draws each trace minute whole, even when the run ends inside it, so every minute
  the run reaches counts whole, and one trace minute may draw at most
  MAX_MINUTE_ARRIVALS arrivals (held at once: ~7 GiB; for `arrivals = "gamma"`, the gaps
  drawn). Its `interval_s` is at least 1e-06 (a microsecond) and its `cv` in [0.01, 100].
  A stepped value (`slo_exp_1`'s and `slo_exp_2`'s SLO, `azure_scalability`'s load
  factor) takes at most MAX_STEPS steps in a run, those after it passes its maximum
  (where that workload's arrivals end; the run goes on to `duration_s`) not counted. A
  bursty workload's on and off periods (expected, each instance's with `independent`
  and in `bursty_closed_loop`) are at most MAX_PERIODS in a run.
- Seeds are integers from 0 to 2^63 - 1 (`seed`, a sweep's `seeds`, the last seed of
  `clockwork plan --seeds K`); a sweep holds at most MAX_POINTS points, and a plan runs at
  most as many seeds.
- A scenario or sweep file is UTF-8 TOML, and arrays and tables nest at most
  MAX_TOML_DEPTH levels in it (and in a `--set` value); a file that is not is one line
  naming it.
- Unknown keys are refused, with the closest valid key when there is one.
- A refusal is one line naming the key, the value and what is expected, e.g.
  `cluster.noise: must be a finite number in [0, 10], got nan` or
  `unknown setting 'cluster.wokers' (did you mean 'cluster.workers'?)`; the command
  prints it and exits with status 2.

Time settings of the scheduler and the baselines are written with their unit in the key
(`default_slo_ms = 100`, `batch_timeout_us = 2000`) and kept as integer nanoseconds
inside (rounded).
"""


def _section(title: str, text: str, table: str) -> str:
    return f"## {title}\n\n{text}\n\n{table}" if text else f"## {title}\n\n{table}"


def _workload_kinds_table() -> str:
    """Each workload kind and the keys it takes besides ``kind`` and ``models`` (what
    ``build_workload`` accepts), so that the reference names them without workloads.md."""
    from clockwork.workloads import _KEYS

    rows = ["| kind | its other keys |", "|---|---|"]
    for kind in sorted(_KEYS):
        rows.append(f"| `{kind}` | " + ", ".join(
            f"`{k}`" for k in sorted(_KEYS[kind] - {"kind", "models"})) + " |")
    return ("The keys each kind takes besides `kind` and `models`:\n\n" + "\n".join(rows)
            + "\n")


def render() -> str:
    """The whole page, as the schemas give it."""
    from controller import BASELINE_SHARED, POLICIES, policy_config
    from controller.config import SchedulerConfig

    parts = [INTRO.replace("MAX_GPUS", f"{MAX_GPUS:,}")
             .replace("MAX_INSTANCES", f"{MAX_INSTANCES:,}")
             .replace("MAX_OUTSTANDING", f"{MAX_OUTSTANDING:,}")
             .replace("MAX_OFFERED_REQUESTS", f"{MAX_OFFERED_REQUESTS:,}")
             .replace("MAX_MINUTE_ARRIVALS", f"{MAX_MINUTE_ARRIVALS:,}")
             .replace("MAX_POINTS", f"{MAX_POINTS:,}")
             .replace("MAX_STEPS", f"{MAX_STEPS:,}")
             .replace("MAX_PERIODS", f"{MAX_PERIODS:,}")
             .replace("MAX_TOML_DEPTH", f"{MAX_TOML_DEPTH}")]
    parts.append(_section(
        "Top level", "The keys outside any table. `--set KEY=VALUE` overrides a dotted key "
        "(`cluster.workers=4`, `workloads.0.rate_rps=500`; list items by index) before the "
        "checks.", markdown_table(ScenarioSettings)))
    parts.append(_section("`[cluster]`", "", markdown_table(ClusterSettings)))
    parts.append(_section(
        "`[[models]]`", "One entry per served model; at least one.", markdown_table(ModelEntry)))
    parts.append(_section(
        "`[[workloads]]`", "One entry per arrival process; at least one. The keys below mean "
        "the same in every kind that takes them and are type-checked when the scenario is "
        "read; their ranges, and every other key (`burst_rps`, `on_s`, `trace`, ...), depend "
        "on the kind and are checked when the workload is built: every kind's keys, "
        "defaults and allowed values are in [workloads.md](workloads.md). "
        "Every number in an entry must be finite.", markdown_table(WorkloadEntry)
        + "\n\n" + _workload_kinds_table()))
    sched = markdown_table(SchedulerTable)
    parts.append(_section(
        "`[scheduler]`", "The policy and its settings; `clockwork controller --settings FILE` "
        "takes this table from a file (TOML with a `[scheduler]` table, a scenario file "
        "too -- one without the table gives the defaults --, or JSON `{\"scheduler\": {...}}`, which `clockwork serve` writes), and the "
        "same keys one by one with `--set KEY=VALUE` (the policy with `--policy`). They are "
        "checked against the policy's schemas when the policy is built.", sched))
    parts.append(
        '### `policy = "clockwork"` (and every baseline)\n\n'
        "The settings of the Clockwork scheduler (`SchedulerConfig`). Every policy takes "
        "them; the baselines use "
        + ", ".join(f"`{k}`" for k in sorted(BASELINE_SHARED))
        + " (the liveness probes and the wait with no worker that every controller runs), and `clockwork simulate`, "
        "`serve` and `controller` warn of the others given to a baseline (they change "
        "nothing there).\n\n"
        + markdown_table(SchedulerConfig))
    for name in sorted(POLICIES):
        cls = policy_config(name)
        if cls is None:
            continue
        doc = (cls.__doc__ or "").strip().splitlines()[0].replace("``", "`")
        parts.append(f'### `policy = "{name}"`\n\n{doc} The policy is described in '
                     f"`controller/baselines/{name}.py`.\n\n" + markdown_table(cls))
    parts.append(_section(
        "`[faults]`", "Faults injected into a run. The simulator models each one in its "
        "network and workers, deterministically; a live run (`clockwork serve SCENARIO "
        "--replay`) kills, restarts, stops and resumes the worker processes, and kills and "
        "restarts the controller, at the same times, counted from the start of the replay "
        "(a new controller process is started `down_s` after the old one was killed, and "
        "serves once it has started and taken the workers over: about a second later on a "
        "small machine; the requests that arrive meanwhile wait in the replay's stream for "
        "it). `slow_network` is simulator-only.",
        markdown_table(FaultSettings)))
    for cls, key in ((KillFault, "kill"), (HangFault, "hang"),
                     (SlowNetworkFault, "slow_network"),
                     (ControllerRestartFault, "controller_restart")):
        first = (cls.__doc__ or "").strip().splitlines()[0].replace("``", "`")
        parts.append(f"### `{key}` entries\n\n{first}\n\n" + markdown_table(cls))
    parts.append(_section(
        "`[[repository]]`", "Models unloaded and loaded again while the run goes on, as the "
        "model repository's unload and load calls do. The simulator plays each entry at its "
        "time (one after another; a load waits until an unload before it is complete: its "
        "copies evicted); a live run (`clockwork serve SCENARIO --replay`) makes the calls "
        "to the controller's model repository at the same times, counted from the start of "
        "the replay. The entries are checked in time order against what is served at each "
        "point before anything runs. `clockwork replay` refuses them.",
        markdown_table(RepositoryEvent)))
    parts.append(_section(
        "`[[add_workers]]`", "Workers that join the cluster while the run goes on, as "
        "`clockwork.Client.add_worker` adds them to a live controller: `cluster.workers` "
        "serve from the start, and each entry adds `count` more at `at_s` (the next worker "
        "indices, each with `cluster.gpus_per_worker` GPUs and empty caches; the policy "
        "places copies on them by its usual rules: `clipper` and `tfserving` keep a "
        "model's copies where they were placed, until evicted, so the workers that join "
        "serve only models placed after they join, said in a warning). The simulator "
        "connects them at their "
        "times; a live run (`clockwork serve SCENARIO --replay`) starts their processes "
        "before the run and has the controller connect each at its time. `[faults]` name "
        "the workers at the start only. Not on a Ray cluster, nor with "
        "`faults.controller_restart`; `clockwork replay` refuses them.",
        markdown_table(AddWorkersEvent)))
    parts.append(_section(
        "`[[remove_workers]]`", "Workers that leave the cluster for good while the run goes "
        "on, as `clockwork.Client.remove_worker` takes one out of a live controller: from "
        "`at_s` the policy places nothing more on the worker's GPUs, the actions it has in "
        "flight fail (their requests placed again on other GPUs where their SLO allows, "
        "else answered with an error), and the controller never reconnects to it; with "
        "`drain = true` they run to their end there instead, and the worker is taken out "
        "once none is left (`clockwork.Client.remove_worker(..., drain=True)`). A worker "
        "that `[[add_workers]]` adds can be removed once it has joined; each worker at most "
        "once, and at least one must be left. Events at one time go in one order: the "
        "faults, the workers that join, those that leave, then the `[[repository]]` "
        "events. The simulator plays them; a live run (`clockwork serve SCENARIO --replay`) "
        "has the controller take each out at its time (the worker process runs on until "
        "the run ends). Not with `faults.controller_restart`; "
        "`clockwork replay` refuses them.",
        markdown_table(RemoveWorkersEvent)))
    from controller.limits import Limits
    parts.append(_section(
        "Controller limits", "The bounds on what clients may hold and send "
        "(`controller/limits.py`), set with `clockwork controller --limit KEY=VALUE` "
        "(repeatable; values as in TOML, time settings in seconds under their `_s` key). "
        "A request over an outstanding-requests bound is answered at once with status "
        "`ERROR`, reason `overloaded` (KServe `UNAVAILABLE` / 503; the Python client raises "
        "`clockwork.errors.Overloaded`); see also [contracts.md](contracts.md#statuses-and-"
        "errors).", markdown_table(Limits)))
    parts.append(_section(
        "Profile files", "`profiles/<set>/<model>.json`: how long one model takes on one kind "
        "of device. Checked when the profile set is loaded.", markdown_table(ProfileFile)))
    parts.append("### Tensors (`inputs`, `outputs`)\n\n" + markdown_table(TensorEntry))
    parts.append(_section(
        "Profile sets (`set.json`)", "`profiles/<set>/set.json` (optional): the set's "
        "defaults. Checked when the profile set is loaded, as is that no two profile files "
        "of a set are of the same model.", markdown_table(ProfileSetFile)))
    return "\n".join(parts)


def topic_of(heading: str) -> str:
    """A section heading as a ``clockwork settings`` topic: lower-case words, anything
    else a space (``## `[[models]]``` -> ``models``, ``### `slow_network` entries`` ->
    ``slow network entries``, ``## Profile sets (`set.json`)`` -> ``profile sets set
    json``)."""
    return " ".join("".join(c if c.isalnum() else " " for c in heading.lower()).split())


def sections(text: str, level: int = 2) -> list[tuple[str, str]]:
    """The page's sections of a heading level (2: ``##``, each with its ``###`` parts; 3:
    the ``###`` parts alone, their topic after their section's): (topic, markdown)."""
    out: list[tuple[str | None, list[str]]] = []
    mark = "#" * level + " "
    parent = ""
    for line in text.splitlines():
        if line.startswith("## "):
            parent = topic_of(line[3:])
        if line.startswith(mark):
            own = topic_of(line[len(mark):])
            out.append((own if level == 2 else f"{parent} {own}", [line]))
        elif line.startswith("#") and line.split(" ", 1)[0].count("#") <= level:
            out.append((None, []))  # (a heading above or beside: the section before ends)
        elif out:
            out[-1][1].append(line)
    return [(topic, "\n".join(lines).rstrip() + "\n") for topic, lines in out
            if topic is not None]


def names(topic: str, want: str) -> bool:
    """Whether every word of ``want`` begins a word of ``topic`` (a word of three letters
    or more: ``model`` names ``models``; a shorter one only as a whole word)."""
    words = topic.split(" ")
    return bool(want) and all(any(w == x or (len(w) >= 3 and x.startswith(w)) for x in words)
                              for w in want.split(" "))


def cmd_settings(args: argparse.Namespace) -> int:
    """``clockwork settings [TOPIC]``: the reference of every setting, from the schemas
    (what a source checkout has as docs/settings.md), or the sections whose heading has
    the topic's words (``##`` sections first; else ``###`` parts, e.g. ``kill`` or
    ``faults kill``)."""
    text = render()
    if isinstance(args.topic, list):  # (several words: one topic, "top level")
        args.topic = " ".join(args.topic)
    if not args.topic:
        sys.stdout.write(text)
        return 0
    want = topic_of(args.topic)
    found = ([md for topic, md in sections(text) if names(topic, want)]
             or [md for topic, md in sections(text, 3) if names(topic, want)])
    if not found:
        topics = "; ".join(topic for topic, _ in sections(text))
        parts = "; ".join(topic for topic, _ in sections(text, 3))
        print(f"clockwork settings: no section {args.topic!r}; the sections: {topics}; their "
              f"parts: {parts}", file=sys.stderr)
        return 2
    sys.stdout.write("\n".join(found))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m clockwork.cluster.settings_doc",
                                 description="Write docs/settings.md from the settings schemas.")
    ap.add_argument("--out", type=Path, default=None,
                    help="the file (default: docs/settings.md of the source checkout this "
                         "runs from; an installed package has none, and needs --out)")
    ap.add_argument("--check", action="store_true",
                    help="do not write; exit 1 if the file differs from the schemas")
    args = ap.parse_args(argv)
    if args.out is None:
        if not (ROOT / "pyproject.toml").is_file():  # (installed: ROOT is site-packages)
            print(f"{ap.prog}: not run from a source checkout ({ROOT} is none): give "
                  "--out FILE", file=sys.stderr)
            return 2
        args.out = DEFAULT_OUT
    text = render()
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is out of date: run python -m clockwork.cluster.settings_doc",
                  file=sys.stderr)
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

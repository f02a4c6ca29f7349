"""Run every Section 6 experiment and print a summary table.

    python experiments/run_all.py [--quick | --full | --smoke] [--live] [--out DIR]

``--quick`` (default) takes about a minute on a 2-core machine; ``--full`` about an hour
(see experiments/README.md). ``--live`` runs every script on a local live cluster in real
time (``--live --smoke``: about a minute); a script whose scale cannot run live here is
said to be refused before anything runs, reported as refused in the table, and the
others still run.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments import (  # noqa: E402
    common,
    fig5_compare,
    fig6_thousands,
    fig7_tight_slo,
    fig8_isolation,
    fig9_azure,
    fig11_scale,
)

SCRIPTS = (fig5_compare, fig6_thousands, fig7_tight_slo, fig8_isolation, fig9_azure, fig11_scale)


def main(argv=None) -> list[dict]:
    args = common.parse_args(argv, " ".join(__doc__.split("\n\n")[0].split()))
    passed = [f"--{args.scale}", "--out", str(args.out)] + (["--live"] if args.live else [])
    # the scripts whose scale cannot run live here, said before any runs (the others
    # still do), not after the hour the ones before them took
    refused: dict[str, str] = {}
    for mod in SCRIPTS:
        check = getattr(mod, "_check_live", None)
        if check is not None:
            try:
                check(args)
            except common.LiveRefused as e:
                refused[mod.NAME] = f"refused: {e}"
                print(f"{mod.NAME}: {refused[mod.NAME]}", file=sys.stderr, flush=True)
    results = []
    t0 = time.perf_counter()
    for mod in SCRIPTS:
        print(f"== {mod.NAME}")
        t = time.perf_counter()
        if mod.NAME in refused:
            res = {"name": mod.NAME, "summary": refused[mod.NAME]}
        else:
            try:
                res = mod.main(passed)
            except common.LiveRefused as e:
                res = {"name": mod.NAME, "summary": f"refused: {e}"}
        res["wall_s"] = round(time.perf_counter() - t, 1)
        results.append(res)
    total = time.perf_counter() - t0
    print(f"\n{'experiment':<16} {'wall s':>7}  paper / ours")
    for r in results:
        lines = r["summary"].splitlines()
        print(f"{r['name']:<16} {r['wall_s']:>7.1f}  {lines[0]}")
        for ln in lines[1:]:
            print(f"{'':<26}{ln.strip()}")
    print(f"{'total':<16} {total:>7.1f}")
    return results


if __name__ == "__main__":
    common.script(main)

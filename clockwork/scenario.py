"""Scenario files (TOML): parsing, ``--set`` overrides, validation.

A scenario says which cluster, which scheduler settings, which models (and how
many copies) and which workloads. See DESIGN.md §6 for the keys.
"""

from __future__ import annotations

import copy
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ScenarioError(ValueError):
    """A scenario file or override is wrong; the message says where and why."""


DEFAULTS: dict[str, Any] = {
    "seed": 1,
    "duration_s": 60.0,
    "cluster": {
        "workers": 1,
        "gpus_per_worker": 1,
        "profiles": "v100-reference",
        "network_latency_ms": 0.1,
        "jitter_ms": 0.0,
        "noise": 0.0,
        "slow_prob": 0.0,
    },
    "scheduler": {"policy": "clockwork"},
    "models": [],
    "workloads": [],
}

CLUSTER_KEYS = {"workers", "gpus_per_worker", "profiles", "weights_cache_pages",
                "network_latency_ms", "jitter_ms", "noise", "slow_prob", "slow_factor",
                "device", "packages"}  # device/packages: live runs (serve); the simulator emulates
TOP_KEYS = {"seed", "duration_s", "cluster", "scheduler", "models", "workloads", "name",
            "description", "drain_s"}


@dataclass
class Scenario:
    data: dict
    source: str = "<scenario>"
    overrides: list[str] = field(default_factory=list)

    @property
    def seed(self) -> int:
        return int(self.data["seed"])

    @property
    def duration_s(self) -> float:
        return float(self.data["duration_s"])

    @property
    def cluster(self) -> dict:
        return self.data["cluster"]

    @property
    def scheduler(self) -> dict:
        return self.data["scheduler"]

    @property
    def models(self) -> list[dict]:
        return self.data["models"]

    @property
    def workloads(self) -> list[dict]:
        return self.data["workloads"]


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def parse_value(text: str) -> Any:
    """A ``--set`` value: TOML syntax if it parses (numbers, booleans, strings,
    arrays), else the raw string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_override(data: dict, assignment: str) -> None:
    """Apply ``a.b.c=value``; list items by index (``workloads.0.rate_rps=100``)."""
    if "=" not in assignment:
        raise ScenarioError(f"--set {assignment!r}: expected key=value")
    key, _, raw = assignment.partition("=")
    parts = key.strip().split(".")
    if not all(parts):
        raise ScenarioError(f"--set {assignment!r}: empty key part")
    node: Any = data
    for i, p in enumerate(parts[:-1]):
        where = ".".join(parts[: i + 1])
        if isinstance(node, list):
            try:
                node = node[int(p)]
            except (ValueError, IndexError):
                raise ScenarioError(f"--set {key}: no list item {p!r} at {where}") from None
        elif isinstance(node, dict):
            node = node.setdefault(p, {})
        else:
            raise ScenarioError(f"--set {key}: {where} is not a table")
    last = parts[-1]
    value = parse_value(raw.strip())
    if isinstance(node, list):
        try:
            node[int(last)] = value
        except (ValueError, IndexError):
            raise ScenarioError(f"--set {key}: no list item {last!r}") from None
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise ScenarioError(f"--set {key}: parent is not a table")


def load_scenario(path: str | Path | None = None, overrides: list[str] | None = None,
                  data: dict | None = None) -> Scenario:
    """Read a TOML file (or take ``data``), apply overrides, fill defaults, validate."""
    src = "<dict>"
    raw: dict = {}
    if path is not None:
        from clockwork.resources import resolve_scenario  # a file, else a shipped name

        p = resolve_scenario(path)
        src = str(p)
        try:
            raw = tomllib.loads(p.read_text())
        except FileNotFoundError:
            raise ScenarioError(f"scenario file {p} not found") from None
        except tomllib.TOMLDecodeError as e:
            raise ScenarioError(f"{p}: not valid TOML: {e}") from e
    if data is not None:
        raw = _merge(raw, data)
    for o in overrides or []:
        apply_override(raw, o)
    merged = _merge(DEFAULTS, raw)
    sc = Scenario(merged, src, list(overrides or []))
    validate(sc)
    return sc


def validate(sc: Scenario) -> None:
    d = sc.data
    where = sc.source
    unknown = set(d) - TOP_KEYS
    if unknown:
        raise ScenarioError(f"{where}: unknown top-level keys {sorted(unknown)}")
    try:
        if float(d["duration_s"]) <= 0:
            raise ScenarioError(f"{where}: duration_s must be > 0")
        int(d["seed"])
    except (TypeError, ValueError) as e:
        raise ScenarioError(f"{where}: seed/duration_s: {e}") from None
    c = d["cluster"]
    bad = set(c) - CLUSTER_KEYS
    if bad:
        raise ScenarioError(f"{where}: unknown [cluster] keys {sorted(bad)}")
    for k in ("workers", "gpus_per_worker"):
        if not isinstance(c[k], int) or c[k] < 1:
            raise ScenarioError(f"{where}: cluster.{k} must be an integer >= 1, got {c[k]!r}")
    if "weights_cache_pages" in c and (not isinstance(c["weights_cache_pages"], int)
                                       or c["weights_cache_pages"] < 1):
        raise ScenarioError(f"{where}: cluster.weights_cache_pages must be an integer >= 1")
    if c.get("device", "emulated") not in ("emulated", "cpu", "cuda"):
        raise ScenarioError(f"{where}: cluster.device must be emulated, cpu or cuda, "
                            f"got {c['device']!r}")
    for k in ("network_latency_ms", "jitter_ms", "noise", "slow_prob"):
        if not isinstance(c[k], int | float) or c[k] < 0:
            raise ScenarioError(f"{where}: cluster.{k} must be a number >= 0, got {c[k]!r}")
    if not isinstance(d["models"], list) or not d["models"]:
        raise ScenarioError(f"{where}: at least one [[models]] entry is needed")
    for i, m in enumerate(d["models"]):
        if not isinstance(m, dict) or "name" not in m:
            raise ScenarioError(f"{where}: models[{i}] needs a name")
        copies = m.get("copies", 1)
        if not isinstance(copies, int) or copies < 1:
            raise ScenarioError(f"{where}: models[{i}].copies must be an integer >= 1")
    if not isinstance(d["workloads"], list) or not d["workloads"]:
        raise ScenarioError(f"{where}: at least one [[workloads]] entry is needed")
    for i, w in enumerate(d["workloads"]):
        if not isinstance(w, dict) or "kind" not in w:
            raise ScenarioError(f"{where}: workloads[{i}] needs a kind")


def instance_names(models: list[dict]) -> dict[str, str]:
    """Instance name -> model name: copies of ``m`` are ``m``, ``m:1``, ``m:2``, ..."""
    out: dict[str, str] = {}
    for m in models:
        name = m["name"]
        for k in range(int(m.get("copies", 1))):
            inst = name if k == 0 else f"{name}:{k}"
            if inst in out:
                raise ScenarioError(f"model instance {inst!r} is listed twice")
            out[inst] = name
    return out

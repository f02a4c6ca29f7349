"""docs/workloads.md lists exactly the keys each workload kind takes
(``clockwork.workloads._KEYS``): one section per kind in ``KINDS``, headed by the kind's
name in backticks; its table rows name the kind's own keys, and its "Common keys:" line
the shared ones (documented once, in the "Common keys" section)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from clockwork.workloads import _COMMON, _KEYS, KINDS

PAGE = Path(__file__).resolve().parents[1] / "docs" / "workloads.md"
HEADING = re.compile(r"^(#+)\s+(.*)$")
TICKED = re.compile(r"`([^`]+)`")


def sections(text: str) -> dict[str, list[str]]:
    """Heading text -> the lines up to the next heading of the same or a higher level
    (lines inside fenced code blocks are not headings)."""
    out: dict[str, list[str]] = {}
    stack: list[tuple[int, str]] = []
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        m = None if fenced else HEADING.match(line)
        if m:
            level, title = len(m.group(1)), m.group(2).strip()
            while stack and stack[-1][0] >= level:
                stack.pop()
            stack.append((level, title))
            out.setdefault(title, [])
            continue
        for _, title in stack:
            out[title].append(line)
    return out


def table_keys(lines: list[str]) -> list[str]:
    """The backticked key in the first cell of each table row (header and separator rows
    have none)."""
    keys = []
    for line in lines:
        if not line.startswith("|"):
            continue
        first = line.strip("|").split("|")[0].strip()
        m = re.fullmatch(r"`([^`]+)`", first)
        if m:
            keys.append(m.group(1))
    return keys


def common_line(lines: list[str]) -> set[str] | None:
    hits = [line for line in lines if line.startswith("Common keys:")]
    return set(TICKED.findall(hits[0])) if len(hits) == 1 else None


@pytest.fixture(scope="module")
def page() -> dict[str, list[str]]:
    return sections(PAGE.read_text(encoding="utf-8"))


def kind_sections(page: dict[str, list[str]]) -> dict[str, list[str]]:
    """Kind name -> its section: the headings that are one backticked name."""
    out = {}
    for title, lines in page.items():
        m = re.fullmatch(r"`([^`]+)`", title)
        if m:
            assert m.group(1) not in out, f"two sections for {m.group(1)}"
            out[m.group(1)] = lines
    return out


def test_every_kind_has_one_section_and_no_other_kind_does(page):
    documented = set(kind_sections(page))
    assert documented == set(KINDS), (
        f"docs/workloads.md: missing {sorted(set(KINDS) - documented)}, "
        f"unknown {sorted(documented - set(KINDS))}")


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_kind_s_table_lists_exactly_its_own_keys(page, kind):
    lines = kind_sections(page).get(kind)
    assert lines is not None, f"docs/workloads.md has no section for `{kind}`"
    rows = table_keys(lines)
    assert len(rows) == len(set(rows)), f"{kind}: a key listed twice: {rows}"
    own = _KEYS[kind] - _COMMON
    assert set(rows) == own, (
        f"{kind}: the page lists keys {sorted(set(rows) - own)} the kind does not take, "
        f"and misses {sorted(own - set(rows))}")


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_kind_s_common_keys_line_names_the_shared_keys_it_takes(page, kind):
    lines = kind_sections(page).get(kind, [])
    assert common_line(lines) == _KEYS[kind] & _COMMON, (
        f"{kind}: its one 'Common keys:' line should name "
        f"{sorted(_KEYS[kind] & _COMMON)}")


def test_the_common_keys_section_lists_them_once(page):
    assert "Common keys" in page, "docs/workloads.md has no 'Common keys' section"
    rows = table_keys(page["Common keys"])
    assert sorted(rows) == sorted(_COMMON)


def test_the_settings_reference_names_each_kinds_keys():
    """``clockwork settings`` (docs/settings.md), which ships with the package where
    workloads.md does not, names every key each kind takes, in the kind's row."""
    from clockwork.cluster.settings_doc import render

    rows = {m.group(1): set(TICKED.findall(m.group(2)))
            for m in re.finditer(r"^\| `([a-z_0-9]+)` \| (.*) \|$", render(), re.M)}
    for kind, keys in _KEYS.items():
        assert rows.get(kind) == keys - {"kind", "models"}, kind


def test_a_misspelt_key_is_pointed_to_the_key_it_begins():
    """A key that is the start of those the kind takes is pointed to them ('load_factor'
    in an azure_scalability entry: its three 'load_factor_*' keys, not the closer-spelled
    'slo_factor')."""
    from clockwork.workloads import build_workload
    from clockwork.workloads.base import WorkloadError

    with pytest.raises(WorkloadError, match=r"did you mean 'load_factor_max', "
                       r"'load_factor_start' or 'load_factor_step'\?\)"):
        build_workload({"kind": "azure_scalability", "load_factor": 2}, {"m": "m"})
    with pytest.raises(WorkloadError, match=r"did you mean 'rate_rps'\?"):
        build_workload({"kind": "poisson", "rate_rp": 2}, {"m": "m"})

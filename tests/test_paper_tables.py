"""The verdict counts at the top of docs/results/paper-tables.md equal the verdicts of its rows.

Every paper row of the page carries one marker line, ``Row verdict (NAME): `WORD` ``, where NAME (no parentheses)
names the row once on the page and WORD is one of the fixed words of :data:`WORDS` (the page's "Verdicts at a
glance" defines them). The counts table under that heading
(``| `WORD` | N |`` lines, and a ``| total | N |`` line) must equal the markers counted word by word, so that a row
whose verdict changes, or a row added without its count, fails here.
"""

import re
from collections import Counter
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "docs" / "results" / "paper-tables.md"
WORDS = ("≥ paper", "explained", "fixed", "still open", "no number", "missing")
MARKER = re.compile(r"^Row verdict \((?P<name>[^()]+)\): `(?P<word>[^`]+)`", re.M)  # NAME without parentheses
COUNT = re.compile(r"^\| `(?P<word>[^`]+)` \| (?P<n>\d+) \|", re.M)
TOTAL = re.compile(r"^\| total \| (?P<n>\d+) \|", re.M)


def _summary(text: str) -> str:
    start = text.index("## Verdicts at a glance")
    return text[start:text.index("\n## ", start + 1)]


def _markers(text: str) -> list[tuple[str, str]]:
    body = text.replace(_summary(text), "")
    return [(m["name"], m["word"]) for m in MARKER.finditer(body)]


def test_every_marker_uses_a_fixed_word_and_names_a_distinct_row():
    markers = _markers(PAGE.read_text())
    assert markers, "no 'Row verdict (NAME): `WORD`' line on the page"
    assert {w for _, w in markers} <= set(WORDS), [m for m in markers if m[1] not in WORDS]
    names = [n for n, _ in markers]
    assert len(names) == len(set(names)), [n for n, k in Counter(names).items() if k > 1]


def test_counts_at_the_top_equal_the_rows():
    text = PAGE.read_text()
    summary = _summary(text)
    counts = {m["word"]: int(m["n"]) for m in COUNT.finditer(summary)}
    assert set(counts) == set(WORDS), f"the counts table lists {sorted(counts)}, the fixed words are {WORDS}"
    rows = Counter(w for _, w in _markers(text))
    assert counts == {w: rows.get(w, 0) for w in WORDS}
    total = TOTAL.search(summary)
    assert total and int(total["n"]) == sum(rows.values())


def test_a_wrong_count_fails():
    """The check is not vacuous: one count off by one is caught."""
    text = PAGE.read_text()
    summary = _summary(text)
    m = next(COUNT.finditer(summary))
    bad = summary.replace(m.group(0), f"| `{m['word']}` | {int(m['n']) + 1} |", 1)
    counts = {c["word"]: int(c["n"]) for c in COUNT.finditer(bad)}
    rows = Counter(w for _, w in _markers(text))
    assert counts != {w: rows.get(w, 0) for w in WORDS}

"""The files of ``gi bench``'s ``suite`` kind: ``config.yaml``, ``suite.json`` and ``summary.md`` (one table row
per member), and the table ``gi bench`` prints; the runner is :mod:`gi.experiments.suite`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gi.analysis.html import write_table_report
from gi.analysis.report import write_json, write_yaml

OURS, THEIRS = "gi", "breaching"  # the time-to-quality contenders the table sets side by side
NONE = "—"
LEGEND = ("Final PSNR: each contender's answer when it stopped (its budget or its own iterations), mean / median / "
          "min over the member's captures; ours − breaching: per capture; grey / mean colour: the trivial guesses' "
          "PSNR (mean), where the member's summary has them; — : not in the member's output. Each member's own "
          "table and plot are in its folder; suite.json has the time ratios and the PSNRs at equal time.")


def write_suite(out: Path, config: dict[str, Any], data: dict[str, Any]) -> None:
    """Write a suite directory's own files into ``out``: ``config.yaml`` (``config``), ``suite.json`` (``data``),
    ``summary.md`` (:func:`summary_table` and its legend) and ``report.html`` (the same table and legend on one
    page, :func:`gi.analysis.html.write_table_report`)."""
    write_yaml(out / "config.yaml", config)
    write_json(out / "suite.json", data)
    (out / "summary.md").write_text(f"# {data['name']}\n\n{summary_table(data)}\n\n{LEGEND}\n")
    write_table_report(out, f"gi bench suite: {data['name']}", summary_rows(data),
                       notes=[LEGEND, *failures(data)])


def _cell(block: dict[str, float] | None, signed: bool = False) -> str:
    if not block:
        return NONE
    sign = "+" if signed else ""
    return " / ".join(f"{block[k]:{sign}.2f}" for k in ("mean", "median", "min"))


def summary_table(data: dict[str, Any]) -> str:
    """The Markdown table of a ``suite.json``: one row per member, ours and breaching's final PSNR (mean /
    median / min over captures, dB), ours minus breaching's per capture, the trivial guesses when the member's
    summary has them, its status and seconds (:func:`summary_rows`); then one line per failed member with its error
    (:func:`failures`)."""
    lines = ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    lines += ["| " + " | ".join(row.values()) + " |" for row in summary_rows(data)]
    lines += [f"\n{line}" for line in failures(data)]
    return "\n".join(lines)


HEAD = ["setting", "kind", "captures", "ours final PSNR mean / median / min [dB]",
        "breaching mean / median / min [dB]", "ours − breaching mean / median / min [dB]",
        "grey / mean colour [dB]", "status", "seconds"]


def failures(data: dict[str, Any]) -> list[str]:
    """One line per failed member of a ``suite.json``, with its error."""
    return [f"{e['label']} failed: {e['error']}" for e in data["members"] if e["status"] == "failed"]


def summary_rows(data: dict[str, Any]) -> list[dict[str, str]]:
    """The rows of :func:`summary_table` (columns :data:`HEAD`), one per member."""
    rows = []
    for e in data["members"]:
        s = e.get("summary") or {}
        contenders = s.get("contenders", {})
        trivial = s.get("trivial") or {}
        guesses = (f"{trivial['grey_psnr']:.2f} / {trivial['mean_colour_psnr']:.2f}"
                   if {"grey_psnr", "mean_colour_psnr"} <= set(trivial) else NONE)
        status = e["status"] + (" (kept)" if e.get("reused") else "")
        cells = [e["label"], e["kind"], str(s["captures"]) if "captures" in s else NONE,
                 _cell((contenders.get(OURS) or {}).get("final_psnr")),
                 _cell((contenders.get(THEIRS) or {}).get("final_psnr")),
                 _cell(s.get(f"gain_over_{THEIRS}_db"), signed=True), guesses, status, f"{e['seconds']:.0f}"]
        rows.append(dict(zip(HEAD, cells)))
    return rows


def format_suite(out: Path) -> str:
    """The table ``gi bench`` prints for a suite's output directory (:func:`summary_table` of its suite.json)."""
    return summary_table(json.loads((Path(out) / "suite.json").read_text()))

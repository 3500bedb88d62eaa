"""The files of ``gi bench``'s ``suite`` kind: ``config.yaml``, ``suite.json`` and ``summary.md`` (one table row
per member), and the table ``gi bench`` prints; the runner is :mod:`gi.experiments.suite`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gi.analysis.report import write_json, write_yaml

OURS, THEIRS = "gi", "breaching"  # the time-to-quality contenders the table sets side by side
NONE = "—"
LEGEND = ("Final PSNR: each contender's answer when it stopped (its budget or its own iterations), mean / median / "
          "min over the member's captures; ours − breaching: per capture; grey / mean colour: the trivial guesses' "
          "PSNR (mean), where the member's summary has them; — : not in the member's output. Each member's own "
          "table and plot are in its folder; suite.json has the time ratios and the PSNRs at equal time.")


def write_suite(out: Path, config: dict[str, Any], data: dict[str, Any]) -> None:
    """Write a suite directory's own files into ``out``: ``config.yaml`` (``config``), ``suite.json`` (``data``)
    and ``summary.md`` (:func:`summary_table` and its legend)."""
    write_yaml(out / "config.yaml", config)
    write_json(out / "suite.json", data)
    (out / "summary.md").write_text(f"# {data['name']}\n\n{summary_table(data)}\n\n{LEGEND}\n")


def _cell(block: dict[str, float] | None, signed: bool = False) -> str:
    if not block:
        return NONE
    sign = "+" if signed else ""
    return " / ".join(f"{block[k]:{sign}.2f}" for k in ("mean", "median", "min"))


def summary_table(data: dict[str, Any]) -> str:
    """The Markdown table of a ``suite.json``: one row per member, ours and breaching's final PSNR (mean /
    median / min over captures, dB), ours minus breaching's per capture, the trivial guesses when the member's
    summary has them, its status and seconds; then one line per failed member with its error."""
    head = ["setting", "kind", "captures", "ours final PSNR mean / median / min [dB]",
            "breaching mean / median / min [dB]", "ours − breaching mean / median / min [dB]",
            "grey / mean colour [dB]", "status", "seconds"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
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
        lines.append("| " + " | ".join(cells) + " |")
    for e in data["members"]:
        if e["status"] == "failed":
            lines.append(f"\n{e['label']} failed: {e['error']}")
    return "\n".join(lines)


def format_suite(out: Path) -> str:
    """The table ``gi bench`` prints for a suite's output directory (:func:`summary_table` of its suite.json)."""
    return summary_table(json.loads((Path(out) / "suite.json").read_text()))

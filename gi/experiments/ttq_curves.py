"""The time-to-quality bench's curves and their summary (``gi bench`` kind ``time-to-quality``,
:mod:`gi.experiments.ttq`): a contender's PSNR checkpoints on one capture (:class:`Curve`), the time it took to
reach a level (:func:`time_to`), its best wiring per capture (:func:`best_of`), what it spent (:func:`spent`), the
time both contenders are compared at under the fairness rule (:func:`compared_until`; docs/usage.md, "Against
breaching") and the ratios breaching/ours with their censoring (:func:`ratio`, :func:`summarize_curves`)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gi.experiments.config.ttq import TTQConfig
from gi.experiments.ttq_output import psnr_at


@dataclass
class Curve:
    """One contender (``variant``: which of its wirings, e.g. breaching's ``"24000 it"``) on one capture:
    checkpoints (iterations done, wall and CPU seconds, PSNR in dB); the last point is the answer the attack
    returned. ``info["stopped_by_budget"]``: the budget, not the attack's own iterations, ended it."""

    contender: str
    capture: int
    variant: str = ""
    iterations: list[int] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    psnr: list[float] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    def add(self, iterations: int, seconds: dict[str, float], value: float) -> None:
        self.iterations.append(int(iterations))
        self.wall.append(float(seconds["wall"]))
        self.cpu.append(float(seconds["cpu"]))
        self.psnr.append(float(value))

    def seconds(self, clock: str) -> list[float]:
        return self.wall if clock == "wall" else self.cpu


def time_to(seconds: Sequence[float], psnr: Sequence[float], level: float) -> float | None:
    """The time of the first checkpoint whose PSNR is >= ``level`` (None: never reached)."""
    for t, p in zip(seconds, psnr):
        if p >= level:
            return float(t)
    return None


RATIO_MIN_SECONDS = 0.05  # a time below this is within the clock's and the checkpoints' noise: no ratio of it


def ratio_terms(ours: float | None, theirs: float | None, ours_budget: float, theirs_budget: float
                ) -> tuple[float, float] | None:
    """The (numerator, denominator) times :func:`ratio` divides: theirs (or their censoring time) over ours (or
    our censoring time); None when neither reached the level."""
    if ours is None and theirs is None:
        return None
    return (theirs if theirs is not None else theirs_budget), (ours if ours is not None else ours_budget)


def ratio_not_applicable(ours: float | None, theirs: float | None, ours_budget: float, theirs_budget: float
                         ) -> str | None:
    """Why :func:`ratio` gives no value although a contender reached the level: a time it would divide, or divide
    by, is below :data:`RATIO_MIN_SECONDS` (e.g. a run that stopped after two iterations, censored at 0.02 s,
    would read "0.0x"); None when the ratio stands."""
    terms = ratio_terms(ours, theirs, ours_budget, theirs_budget)
    if terms is None:
        return None
    for who, t, reached in (("theirs", terms[0], theirs is not None), ("ours", terms[1], ours is not None)):
        if t < RATIO_MIN_SECONDS:
            what = "time to the level" if reached else "time when it stopped without reaching it"
            return f"{who} {what} is {seconds_text(t)} s, below {RATIO_MIN_SECONDS:g} s"
    return None


def ratio(ours: float | None, theirs: float | None, ours_budget: float, theirs_budget: float
          ) -> tuple[float | None, str]:
    """breaching's time over ours to a level: ``(value, "exact")`` when both reached it; ``(theirs_budget / ours,
    ">=")`` when only ours did (theirs is censored at its budget); ``(theirs / ours_budget, "<=")`` when only
    theirs did; ``(None, "neither")`` when neither did; ``(None, "n/a")`` when a time it would divide is near
    zero (:func:`ratio_not_applicable` says why)."""
    if ratio_not_applicable(ours, theirs, ours_budget, theirs_budget) is not None:
        return None, "n/a"
    if ours is not None and theirs is not None:
        return theirs / ours, "exact"
    if ours is not None:
        return theirs_budget / ours, ">="
    if theirs is not None:
        return theirs / ours_budget, "<="
    return None, "neither"


def stopped_by_budget(curve: Curve) -> bool:
    """Whether the budget (not the attack's own iterations) ended ``curve``: its ``info["stopped_by_budget"]``;
    for curves written before that key, fewer iterations than ``info["max_iterations"]`` (breaching), else True
    (the conservative reading: a level it missed is censored at its last reading)."""
    if "stopped_by_budget" in curve.info:
        return bool(curve.info["stopped_by_budget"])
    if "max_iterations" in curve.info:
        return curve.iterations[-1] < int(curve.info["max_iterations"])
    return True


def spent(curves: Sequence[Curve], clock: str) -> dict[str, Any]:
    """What a contender spent on one capture over ``curves`` (its variants): ``iterations`` actually run, ``runs``
    (its restarts included, :func:`attack_until_budget`; 1 for curves written before runs), ``cpu_seconds`` and
    ``wall_seconds`` (scoring left out), and ``finished_at``: on ``clock``, when its last variant finished before
    the budget (None where any variant ran until the budget, :func:`finished_at`)."""
    ends = [finished_at(c, clock) for c in curves]
    return {"iterations": sum(c.iterations[-1] for c in curves),
            "runs": sum(int(c.info.get("runs", 1)) for c in curves),
            "cpu_seconds": sum(c.cpu[-1] for c in curves), "wall_seconds": sum(c.wall[-1] for c in curves),
            "finished_at": None if any(t is None for t in ends) else max(ends)}


def compared_until(curves: Sequence[Curve], clock: str) -> float | None:
    """Until when a contender's ``curves`` (its variants on one capture) can be compared: where restarting was
    disabled (``fill_budget: false``, or curves written before the rule, which never restarted) and every variant
    finished before the budget, the last finish (:func:`finished_at`); else None (the budget). A contender that
    finished early because a new run would only repeat it (our analytic answer) holds its answer to the budget."""
    ends = [finished_at(c, clock) for c in curves]
    if any(t is None for t in ends) or any(c.info.get("fill_budget", False) for c in curves):
        return None
    return max(t for t in ends if t is not None)


def best_of(curves: Sequence[Curve], clock: str, levels: Sequence[float], when: float) -> dict[str, Any]:
    """One contender's best wiring on one capture over its variants' ``curves``: per level the earliest time
    (None: no variant reached it) and the variant that gave it, the highest final PSNR and PSNR at ``when``,
    what it spent (:func:`spent`, also per variant) and ``compared_until`` (:func:`compared_until`).
    ``seconds`` is where a level no variant reached is censored: the shortest variant the budget stopped (it might
    have reached the level just after), else (every variant ran its own iterations to the end and never reached
    it) the longest run (:func:`stopped_by_budget`)."""
    row: dict[str, Any] = {}
    finals = [c.seconds(clock)[-1] for c in curves]
    cut = [t for c, t in zip(curves, finals) if stopped_by_budget(c)]
    best_final = max(curves, key=lambda c: c.psnr[-1])
    row.update(final_psnr=best_final.psnr[-1], seconds=min(cut) if cut else max(finals), **spent(curves, clock),
               compared_until=compared_until(curves, clock))
    at = [v for c in curves for v in [psnr_at(c.seconds(clock), c.psnr, when)] if v is not None]
    row["psnr_at_equal_time"] = max(at) if at else None
    for lvl in levels:
        times = [(t, c.variant) for c in curves for t in [time_to(c.seconds(clock), c.psnr, lvl)] if t is not None]
        row[f"time_to_{lvl:g}"] = min(times)[0] if times else None
        if len(curves) > 1:
            row[f"best_variant_{lvl:g}"] = min(times)[1] if times else None
    if len(curves) > 1:
        row["variants"] = {c.variant: {"final_psnr": c.psnr[-1], "seconds": c.seconds(clock)[-1],
                                       **spent([c], clock), "stopped_by_budget": stopped_by_budget(c),
                                       **{f"time_to_{lvl:g}": time_to(c.seconds(clock), c.psnr, lvl)
                                          for lvl in levels}} for c in curves}
    return row


def median_bound(pairs: Sequence[tuple[float | None, str]]) -> tuple[float | None, str]:
    """Median and minimum of ratios some of which are bounds: the median of the values, marked ``>=`` when every
    value is exact or a lower bound and some are bounds, ``~`` when upper bounds are mixed in."""
    vals = [v for v, _ in pairs if v is not None]
    if not vals:
        return None, "neither"
    kinds = {k for v, k in pairs if v is not None}
    mark = "exact" if kinds == {"exact"} else (">=" if "<=" not in kinds else "~")
    return statistics.median(vals), mark


def summarize_curves(cfg: TTQConfig, curves: list[Curve]) -> dict[str, Any]:
    """Per capture: time to every level per contender (its best variant, :func:`best_of`; None: censored, at its
    ``seconds``), what it spent (:func:`spent`), the ratio to ``gi`` and the PSNRs at the row's ``equal_time``:
    ``cfg.equal_time`` (null: the budget), or earlier, when a contender finished before it (``finished_at``),
    the time it finished (docs/usage.md, "Against breaching": equal time means equal); over captures: median
    and min ratio (a ratio of a near-zero time is ``n/a``, :func:`ratio_not_applicable`), PSNRs at equal time."""
    clock = cfg.clock
    when = cfg.equal_time or cfg.budget
    by: dict[tuple[str, int], list[Curve]] = {}
    for c in curves:
        by.setdefault((c.contender, c.capture), []).append(c)
    captures = sorted({c.capture for c in curves})
    rows = []
    for k in captures:
        row: dict[str, Any] = {"capture": k}
        trivial = [c.info["trivial"] for c in by[(cfg.contenders[0], k)] if "trivial" in c.info]
        if trivial:  # the best trivial guesses on this capture's images (mean PSNR of a grey / mean-colour image)
            row["trivial"] = trivial[0]
        cuts = [compared_until(by[(name, k)], clock) for name in cfg.contenders]
        row["equal_time"] = min([when] + [t for t in cuts if t is not None])
        for name in cfg.contenders:
            row[name] = best_of(by[(name, k)], clock, cfg.levels, row["equal_time"])
        if "gi" in cfg.contenders:
            for name in cfg.contenders:
                if name == "gi":
                    continue
                for lvl in cfg.levels:
                    key = f"time_to_{lvl:g}"
                    args = (row["gi"][key], row[name][key], row["gi"]["seconds"], row[name]["seconds"])
                    v, kind = ratio(*args)
                    row[f"ratio_{name}_{lvl:g}"] = {"value": v, "kind": kind,
                                                    **({"why": ratio_not_applicable(*args)} if kind == "n/a" else {})}
                a, b = row["gi"]["psnr_at_equal_time"], row[name]["psnr_at_equal_time"]
                row[f"gain_over_{name}_db"] = None if a is None or b is None else a - b
        rows.append(row)
    out: dict[str, Any] = {"clock": clock, "equal_time": when, "rows": rows, "ratios": {}}
    for name in cfg.contenders:
        if name == "gi" or "gi" not in cfg.contenders:
            continue
        for lvl in cfg.levels:
            pairs = [(r[f"ratio_{name}_{lvl:g}"]["value"], r[f"ratio_{name}_{lvl:g}"]["kind"]) for r in rows]
            med, mark = median_bound(pairs)
            vals = [v for v, _ in pairs if v is not None]
            why = sorted({r[f"ratio_{name}_{lvl:g}"]["why"] for r in rows if "why" in r[f"ratio_{name}_{lvl:g}"]})
            out["ratios"][f"{name}_{lvl:g}"] = {
                "median": med, "median_kind": mark, "min": min(vals) if vals else None,
                "censored_theirs": sum(k == ">=" for _, k in pairs), "censored_ours": sum(k == "<=" for _, k in pairs),
                "neither": sum(k == "neither" for _, k in pairs), "not_applicable": sum(k == "n/a" for _, k in pairs),
                **({"why_not_applicable": why} if why else {})}
        gains = [r[f"gain_over_{name}_db"] for r in rows if r[f"gain_over_{name}_db"] is not None]
        out[f"gain_over_{name}_db"] = {"median": statistics.median(gains) if gains else None,
                                       "min": min(gains) if gains else None}
    return out


def finished_at(curve: Curve, clock: str) -> float | None:
    """When ``curve``'s contender finished before its budget, on ``clock`` (its last reading); None when the budget
    ended it (:func:`stopped_by_budget`)."""
    return None if stopped_by_budget(curve) else curve.seconds(clock)[-1]


def seconds_text(t: float) -> str:
    """Seconds as printed: one decimal from 1 s up, three significant digits below (a run stopped after two
    iterations reads ``0.0213 s``, not ``0.0 s``)."""
    return f"{t:.1f}" if abs(t) >= 1 else f"{t:.3g}"


def ratio_text(value: float) -> str:
    """A ratio as printed: one decimal from 1 up, two significant digits below (never "0.0x")."""
    return f"{value:.1f}" if value >= 1 else f"{value:.2g}"


"""The output directory of ``gi run`` / ``gi attack``: scores per image (:func:`truth_table`, or
:func:`plain_table` without truth), the summary (scores and baselines, labels, the verdict of
:mod:`gi.analysis.verdict`, the attack), plots and files (docs/architecture.md "Data flow", docs/usage.md
"Verdict"), and the truth monitor that draws PSNR against iterations during a fit. Scoring reads
:class:`~gi.capture.Truth`; nothing here feeds back into the attack."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gi.analysis.report import (
    Curve,
    save_caption_grid,
    save_curves,
    save_line_plot,
    save_png,
    write_csv,
    write_json,
    write_yaml,
)
from gi.attack.stages import AttackResult, LabelConfig, final_counts, mismatch_of, used_labels

if TYPE_CHECKING:
    from gi.attack.recon import Reconstruction
    from gi.capture import Capture, Truth


def truth_monitor(truths: Sequence[Truth], every: int) -> Any:
    """A Lightning callback that logs the PSNR of every capture's current best iterate against its truth every
    ``every`` steps, from outside the attack module: ``.curves[capture][fit][step]``, one curve per fit of each
    capture (``fit``: :attr:`gi.attack.recon.module.GradientInversion.fit_id`, which the reconstruction's
    ``history["fit"]`` names), so the plots draw the fit that was returned and the ones a retry replaced
    (:func:`psnr_curves`). It follows the captures by ``Problem.capture_ids`` through every problem of a split fit
    (``attack.pack``), every retry (``attack.retries``) and every alternative (``attack.alternatives``)."""
    import itertools

    import lightning as L

    own_ids = itertools.count(-1, -1)  # a module without a fit_id (a test's stand-in): numbers of the monitor's own

    class TruthMonitor(L.Callback):
        def __init__(self, curves: dict[int, dict[int, dict[int, float]]] | None = None,
                     ids: list[int] | None = None) -> None:
            self.truth, self.every = [t.images for t in truths], every
            self.ids = list(range(len(truths))) if ids is None else ids
            # capture -> fit -> step -> PSNR
            self.curves: dict[int, dict[int, dict[int, float]]] = {} if curves is None else curves
            self.fit: int = 0

        def on_train_start(self, trainer, pl_module) -> None:
            self.fit = getattr(pl_module, "fit_id", None)
            self.fit = next(own_ids) if self.fit is None else self.fit

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if batch_idx % self.every and batch_idx != trainer.max_steps - 1:
                return
            ids = pl_module.problem.capture_ids
            if max(ids) >= len(self.truth):
                return
            from gi.analysis.metrics import match_images, psnr

            batch_now = pl_module.current_batch().cpu()
            for k, rec in zip(ids, batch_now):
                truth = self.truth[k]
                perm = match_images(rec, truth) if rec.shape[0] > 1 else [0]
                self.curves.setdefault(k, {}).setdefault(self.fit, {})[batch_idx] = float(
                    psnr(rec[perm], truth).clamp(max=100).mean())

        def part(self, lo: int, hi: int) -> Any:
            """The curves of captures ``lo:hi`` alone (a job packed with others: :func:`reconstruct_prepared`)."""
            return TruthMonitor(self.curves, self.ids[lo:hi])

    return TruthMonitor()


def fit_name(attempt: int) -> str:
    """A fit of ``attack.retries`` by its attempt: 0 the first fit, k the k-th retry."""
    return "first fit" if attempt == 0 else f"retry {attempt}"


def psnr_curves(curves: dict[int, dict[int, dict[int, float]]], ids: Sequence[int],
                recs: Sequence[Reconstruction]) -> list[Curve]:
    """What psnr.png draws, from the truth monitor's ``curves`` (capture -> fit -> step -> PSNR) of the captures
    ``ids`` (in the order of ``recs``): the PSNR of the fit each reconstruction was returned from
    (``history["fit"]``), averaged over the optimised captures at the steps all were scored at; and, dashed, each
    fit a retry replaced (``history["replaced"]``, :func:`gi.attack.recon.api.replaced_record`). A capture
    answered by the analytic inversion has no fit and no curve."""
    returned: list[dict[int, float]] = []
    replaced: list[Curve] = []
    for pos, (k, rec) in enumerate(zip(ids, recs)):
        fits = curves.get(k, {})
        if rec.history.get("fit") in fits:
            returned.append(fits[rec.history["fit"]])
        for entry in rec.history.get("replaced", []):
            if entry.get("fit") in fits:
                steps = sorted(fits[entry["fit"]])
                who = f"capture {pos}: " if len(recs) > 1 else ""
                replaced.append(Curve(f"{who}replaced ({fit_name(entry['attempt'])})", steps,
                                      [fits[entry["fit"]][t] for t in steps], style="replaced"))
    if not returned:
        return []
    steps = sorted(set.intersection(*(set(c) for c in returned)))
    answered = len(recs) - len(returned)
    label = "PSNR of the returned fit (best restart)" + (
        f", mean of the {len(returned)} optimised captures" if len(returned) > 1 else "") + (
        f" ({answered} answered analytically)" if answered else "")
    mean = [sum(c[t] for c in returned) / len(returned) for t in steps]
    return [Curve(label, steps, mean), *replaced]


MANY_RESTARTS = 10  # objective.png: above this many restarts, a min-max band and the best restart's curve


def objective_curves(rec: Reconstruction) -> list[Curve]:
    """What objective.png draws for one reconstruction: its returned fit's restarts (one curve each, or above
    :data:`MANY_RESTARTS` their min-max band and the best restart's curve; a restart culled early,
    ``attack.cull_after``, ends there), and, dashed, the best restart of each fit a retry replaced
    (``history["replaced"]``)."""
    import math

    steps, logged = list(rec.history.get("step", [])), rec.history.get("objective", [])
    restarts, best = len(rec.objective), rec.best_restart
    if not steps:
        return []
    if restarts <= MANY_RESTARTS:
        out = [Curve(f"restart {r}" + (" (returned)" if r == best and restarts > 1 else ""), steps,
                     [o[r] for o in logged]) for r in range(restarts)]
    else:
        alive = [[v for v in o if not math.isnan(v)] or [math.nan] for o in logged]
        out = [Curve(f"{restarts} restarts: min to max", steps, [max(v) for v in alive], style="band",
                     lower=[min(v) for v in alive]),
               Curve(f"restart {best} (returned)", steps, [o[best] for o in logged])]
    return out + [Curve(f"replaced ({fit_name(e['attempt'])}): its best restart", e["step"], e["objective"],
                        style="replaced") for e in rec.history.get("replaced", [])]


def _mean_dicts(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Numeric entries averaged over rows (the single row as it is)."""
    if len(rows) == 1:
        return dict(rows[0])
    keys = [k for k in rows[0] if all(isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)
                                      for r in rows)]
    return {k: sum(float(r[k]) for r in rows) / len(rows) for k in keys}


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values))


@dataclass
class Table:
    """What :func:`write_outputs` scored, image by image: the results.csv ``rows``, the grid's ``captions`` and
    images, and per capture the image ``scores`` (:func:`gi.analysis.metrics.score`) and label scores; per image
    the trivial-guess ``baselines`` (:func:`gi.analysis.verdict.trivial_baselines`) and the uniform-noise PSNR."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    captions: list[str] = field(default_factory=list)
    shown_rec: list[Any] = field(default_factory=list)
    shown_truth: list[Any] = field(default_factory=list)
    scores: list[dict[str, Any]] = field(default_factory=list)
    baselines: dict[str, list[float]] = field(default_factory=dict)
    random_psnr: list[float] = field(default_factory=list)
    label_scores: list[dict[str, float]] = field(default_factory=list)
    final_label_scores: list[dict[str, float]] = field(default_factory=list)


def label_name(label: int, classes: Sequence[str] = ()) -> str:
    """A label as a page or a caption shows it: its number and, where the dataset names its classes
    (:func:`gi.world.data.class_names`), its name."""
    return f"{label} {classes[label]}" if 0 <= label < len(classes) else str(label)


def slot_words(rec: Reconstruction, mismatch: float, known: bool) -> tuple[list[str] | None, list[str]]:
    """A reconstruction's words per slot without truth: the slot verdicts (:func:`gi.analysis.verdict.slot_verdicts`;
    None where its slots were not swapped) and the estimates (:func:`gi.analysis.verdict.image_estimates` by its
    ``history["evidence"]``), from its capture's ``mismatch`` and whether it can be re-simulated (``known``)."""
    from gi.analysis.verdict import image_estimates, slot_verdicts

    swaps = rec.history.get("slot_swap_distance")
    return (slot_verdicts(mismatch, swaps, known),
            image_estimates(mismatch, swaps, rec.history.get("evidence"), known, rec.images.shape[0]))


def truth_table(outcome: AttackResult, truths: Sequence[Truth], lcfg: LabelConfig, seed: int,
                metric_options: dict[str, Any], classes: Sequence[str] = ()) -> Table:
    """Every truth image scored against its pixel-matched reconstruction slot (one row each), beside the trivial
    guesses and a uniform-noise image, with the verdict (:func:`gi.analysis.verdict.image_verdict`). A row's
    ``slot_label`` is the label that slot was reconstructed with; ``true_label_in_slots`` says whether the true
    label is among the capture's slot labels at all (in a batch the pixel matching need not pair equal labels).
    ``classes``: the dataset's class names, for the grid's captions (:func:`label_name`)."""
    import torch

    from gi.analysis.metrics import label_metrics, score
    from gi.analysis.verdict import image_verdict, mismatch_verdict, trivial_baselines

    table = Table()
    simulable = outcome.simulable  # per capture, once: it derives each capture's local schedule
    for k, (rec, truth, label_result) in enumerate(zip(outcome.reconstructions, truths, outcome.label_results)):
        s = score(rec.images, truth.images, labels_rec=rec.labels.argmax(1), labels_true=truth.labels,
                  match=metric_options["match"], vgg=metric_options["lpips_vgg"])
        table.scores.append(s)
        base = trivial_baselines(truth.images)
        for key, values in base.items():
            table.baselines.setdefault(key, []).extend(values)
        rnd = torch.rand(truth.images.shape, generator=torch.Generator().manual_seed(seed + 7 + k))
        table.random_psnr.extend(score(rnd, truth.images, match=metric_options["match"], vgg=False)["psnr"])
        if label_result is not None:
            table.label_scores.append(label_metrics(label_result, truth))
        table.final_label_scores.append(label_metrics(used_labels(rec, lcfg.mode), truth))
        slots = rec.labels.argmax(1).tolist()
        mismatch, known = mismatch_of(rec), simulable[k]
        words, guesses = slot_words(rec, mismatch, known)
        indices = truth.meta.get("indices") or [None] * truth.images.shape[0]
        for i in range(truth.images.shape[0]):
            trivial = max(base["grey_psnr"][i], base["mean_colour_psnr"][i])
            verdict = image_verdict(s["psnr"][i], trivial)
            true, slot = int(truth.labels[i]), slots[s["perm"][i]]
            table.rows.append({
                "capture": k, "image": i, "dataset_index": indices[i], "psnr": s["psnr"][i], "ssim": s["ssim"][i],
                "lpips_alex": s["lpips_alex"][i], "verdict": verdict, **{key: v[i] for key, v in base.items()},
                "true_label": true, "slot_label": slot, "true_label_in_slots": true in slots,
                "matched_slot": s["perm"][i], "answered_by": rec.history.get("answered_by", "optimisation"),
                "analytic_residual": rec.history.get("analytic_residual"), "gradient_mismatch": mismatch,
                "mismatch_verdict": mismatch_verdict(mismatch, known) if words is None else words[s["perm"][i]],
                "estimate": guesses[s["perm"][i]]})
            table.captions.append(f"{s['psnr'][i]:.1f} dB {verdict}\nslot: {label_name(slot, classes)}\n"
                                  f"true: {label_name(true, classes)}" + ("" if true in slots else " (no slot)"))
        table.shown_truth.append(truth.images)
        table.shown_rec.append(rec.images[torch.as_tensor(s["perm"])])
    return table


def plain_table(outcome: AttackResult, classes: Sequence[str] = ()) -> Table:
    """Without truth: one row per reconstruction slot, with its label (named by ``classes``, :func:`label_name`, in
    the captions) and its verdict (:func:`gi.analysis.verdict.slot_verdict`: its capture's mismatch verdict, or
    ``not pinned``)."""
    from gi.analysis.verdict import mismatch_verdict

    table = Table()
    for k, (rec, known) in enumerate(zip(outcome.reconstructions, outcome.simulable)):
        mismatch = mismatch_of(rec)
        words, guesses = slot_words(rec, mismatch, known)
        for i in range(rec.images.shape[0]):
            label = int(rec.labels[i].argmax())
            table.rows.append({"capture": k, "image": i, "slot_label": label, "gradient_mismatch": mismatch,
                               "mismatch_verdict": mismatch_verdict(mismatch, known) if words is None else words[i],
                               "estimate": guesses[i],
                               "answered_by": rec.history.get("answered_by", "optimisation"),
                               "analytic_residual": rec.history.get("analytic_residual")})
            table.captions.append(f"slot label {label_name(label, classes)}\nmismatch {mismatch:.2g}")
        table.shown_rec.append(rec.images)
    return table


def score_summary(table: Table, metric_options: dict[str, Any]) -> dict[str, Any]:
    """The image scores of metrics.json: mean / median / min over every image, the baselines' means (uniform
    noise, a flat grey image, each image's mean colour) and ``images`` (per-image lists and their stats)."""
    from gi.analysis.metrics import summarize

    images: dict[str, Any] = {}
    for metric in ("psnr", "ssim", "lpips_alex", "mse") + (("lpips_vgg",) if metric_options["lpips_vgg"] else ()):
        stats = summarize([v for s in table.scores for v in s[metric]])
        images[metric] = stats.pop("values")
        images.update({f"{metric}_{k}": v for k, v in stats.items()})
    if len(table.scores) == 1:
        images = table.scores[0]
    return {"psnr_mean": images["psnr_mean"], "psnr_median": images["psnr_median"], "psnr_min": images["psnr_min"],
            "ssim_mean": images["ssim_mean"], "lpips_alex_mean": images["lpips_alex_mean"],
            "random_image_psnr_mean": _mean(table.random_psnr),
            **{f"{key}_mean": _mean(values) for key, values in table.baselines.items()},
            "images": images}


def label_summary(outcome: AttackResult, lcfg: LabelConfig, table: Table, truths: Sequence[Truth] | None
                  ) -> dict[str, Any]:
    """metrics.json's ``labels`` (the label stage: mode, method, why, counts; scored with truth) and, with truth,
    ``final_labels`` (the labels the reconstructions ended with); one capture's counts as a plain list."""
    recs, label_results = outcome.reconstructions, outcome.label_results
    one = len(recs) == 1
    info: dict[str, Any] = {"mode": lcfg.mode, "method": outcome.stages[0]["method"], "why": outcome.stages[0]["why"],
                            "ok": all(result.ok for result in label_results if result is not None),
                            "counts": [(result.counts if result is not None else final_counts(r)).tolist()
                                       for result, r in zip(label_results, recs)]}
    info["counts"] = info["counts"][0] if one else info["counts"]
    out: dict[str, Any] = {"labels": info}
    if truths is None:
        return out
    info.update(_mean_dicts(table.label_scores) if table.label_scores else {})
    info["true_counts"] = [t.counts.tolist() for t in truths][0] if one else [t.counts.tolist() for t in truths]
    final = {**_mean_dicts(table.final_label_scores), "counts": [final_counts(r).tolist() for r in recs]}
    final["counts"] = final["counts"][0] if one else final["counts"]
    final["L_r"] = final.get("soft_l1")
    out["final_labels"] = final
    return out


def verdict_summary(table: Table, outcome: AttackResult, truths: Sequence[Truth] | None) -> dict[str, Any]:
    """metrics.json's ``verdict`` (:mod:`gi.analysis.verdict`): without truth, the attack's own
    (:attr:`gi.attack.stages.AttackResult.verdict`'s ``record``: the mismatch verdict, the labels); with truth, per
    image against the best trivial guess, with the mismatch verdict under ``gradient``. Where the attack matched
    features, ``features`` (:func:`gi.analysis.verdict.feature_summary`) in both, and where the analytic walk's
    prior filled input values, ``prior`` (:func:`gi.analysis.verdict.prior_summary`)."""
    from gi.analysis.verdict import image_summary

    own = outcome.verdict
    if truths is None:
        return own.record
    rows = table.rows
    return {**image_summary([r["psnr"] for r in rows], [r["grey_psnr"] for r in rows],
                            [r["mean_colour_psnr"] for r in rows]), "gradient": own.gradient,
            **({"features": own.features} if own.features is not None else {}),
            **({"prior": own.prior} if own.prior is not None else {})}


def attack_summary(outcome: AttackResult, num_images: int) -> dict[str, Any]:
    """metrics.json's ``attack``: the objective and best restart (per capture when several), seconds and
    iterations."""
    recs = outcome.reconstructions
    seconds = sum(r.seconds for r in recs)
    iterations = max(r.iterations for r in recs)
    many = len(recs) > 1
    return {"objective": [r.objective.tolist() for r in recs] if many else recs[0].objective.tolist(),
            "best_restart": [r.best_restart for r in recs] if many else recs[0].best_restart,
            "seconds": seconds, "seconds_per_image": seconds / max(num_images, 1), "iterations": iterations,
            "seconds_per_100_iterations": 100 * seconds / iterations if iterations else None}


@dataclass
class Summary:
    """What an output directory of ``gi run`` / ``gi attack`` says of an attack, before it is written
    (:func:`summarise`): the per-image :class:`Table` (``rows``: results.csv) and ``metrics`` (metrics.json, less
    the run's timing and platform). ``verdict`` is metrics.json's ``verdict`` (docs/usage.md, "Verdict"), ``sentence``
    the verdict line ``gi run`` / ``gi attack`` print."""

    table: Table
    metrics: dict[str, Any]

    @property
    def rows(self) -> list[dict[str, Any]]:
        """One row per image: with truth its PSNR / SSIM / LPIPS, the trivial guesses and its ``verdict``."""
        return self.table.rows

    @property
    def verdict(self) -> dict[str, Any]:
        """metrics.json's ``verdict``: with truth per image (``images``) and the run's word, ``gradient`` beside."""
        return self.metrics["verdict"]

    @property
    def sentence(self) -> str:
        """The verdict line (:func:`gi.analysis.verdict.verdict_line`)."""
        from gi.analysis.verdict import verdict_line

        return verdict_line(self.verdict)


def summarise(name: str, captures: Sequence[Capture], truths: Sequence[Truth] | None, outcome: AttackResult,
              lcfg: LabelConfig, seed: int, metric_options: dict[str, Any], classes: Sequence[str] = ()) -> Summary:
    """The rows and metrics of an attack's output directory: with ``truths`` (one per capture) every image scored
    (:func:`truth_table`, :func:`score_summary`), without them the reconstruction slots (:func:`plain_table`); the
    labels (:func:`label_summary`), the verdict (:func:`verdict_summary`), the attack, its stages and warnings.
    ``seed`` draws the uniform-noise baseline; ``metric_options``: ``match`` (pixel matching of a batch) and
    ``lpips_vgg``; ``classes``: the dataset's class names (the captions)."""
    from gi.attack.recon.problem import image_slots

    table = (truth_table(outcome, truths, lcfg, seed, metric_options, classes) if truths is not None
             else plain_table(outcome, classes))
    metrics: dict[str, Any] = {"name": name, "num_captures": len(captures),
                               "num_images": sum(image_slots(c) for c in captures)}
    if truths is not None:
        metrics.update(score_summary(table, metric_options))
    metrics.update(label_summary(outcome, lcfg, table, truths))
    metrics["verdict"] = verdict_summary(table, outcome, truths)
    metrics["attack"] = attack_summary(outcome, metrics["num_images"])
    metrics["stages"] = outcome.stages
    metrics["warnings"] = outcome.warnings
    return Summary(table, metrics)


def write_outputs(tmp: Path, name: str, config: dict[str, Any], captures: Sequence[Capture],
                  truths: Sequence[Truth] | None, outcome: AttackResult, lcfg: LabelConfig, seed: int,
                  metric_options: dict[str, Any], monitor: Any = None, t0: float | None = None) -> dict[str, Any]:
    """Write the self-contained output directory of ``gi run`` / ``gi attack`` (and of
    :meth:`gi.attack.Attack.save`): config.yaml, metrics.json (:func:`summarise`: ``stages`` and the ``verdict``;
    scores, baselines and their mean/median/min over every image when truths are given), results.csv (one row per
    image), grid.png, plots, the reconstructed images (:func:`save_reconstructions`: reconstructions.safetensors,
    images/*.png), report.html (:func:`write_report`), the captures (and truths). Returns the metrics."""
    import torch

    classes = dataset_classes(config, captures)
    summary = summarise(name, captures, truths, outcome, lcfg, seed, metric_options, classes)
    table, metrics = summary.table, summary.metrics
    if t0 is not None:
        metrics["total_seconds"] = time.perf_counter() - t0
    metrics["device"] = "cuda" if torch.cuda.is_available() and config.get("attack", {}).get("device") != "cpu" \
        else "cpu"
    metrics["torch"] = torch.__version__
    write_yaml(tmp / "config.yaml", config)
    write_json(tmp / "metrics.json", metrics)
    write_csv(tmp / "results.csv", table.rows)
    legend = (" (PSNR, verdict; label of the pixel-matched slot / true label)" if truths is not None
              else " (slot label; relative gradient mismatch)")
    save_caption_grid(tmp / "grid.png", torch.cat(table.shown_rec),
                      torch.cat(table.shown_truth) if table.shown_truth else None, table.captions,
                      title=name + legend)
    write_plots(tmp, name, outcome, monitor, len(captures))
    save_reconstructions(tmp, outcome, truths, table)
    write_report(tmp, name, config, summary, classes)
    save_captures(tmp, captures, truths)
    return metrics


def dataset_classes(config: dict[str, Any], captures: Sequence[Capture]) -> list[str]:
    """The class names a config gives (``class_names``: a list, as :meth:`gi.attack.Attack.save` writes it), else
    those of the dataset it names (``gi run``'s ``data``, else ``gi attack``'s ``aux_data``;
    :func:`gi.world.data.class_names`), when they are as many as every capture's classes; else none."""
    from gi.world.data import class_names

    given = config.get("class_names")
    if isinstance(given, list) and given and all(c.model_spec.get("num_classes") == len(given) for c in captures):
        return [str(n) for n in given]
    for key in ("data", "aux_data"):
        section = config.get(key)
        if isinstance(section, dict) and isinstance(section.get("name"), str):
            names = class_names(section["name"])
            if names and all(c.model_spec.get("num_classes") == len(names) for c in captures):
                return names
    return []


REPORT = "report.html"
REPORT_PLOTS = ("psnr.png", "objective.png", "analytic.png")


def image_cards(tmp: Path, table: Table, classes: Sequence[str]) -> list[str]:
    """One card per reconstructed image of ``images/`` (:func:`save_reconstructions`), each once: with truth, per
    results.csv row its pixel-matched slot beside the truth image, its verdict, PSNR, SSIM and labels; without, per
    slot its label and its capture's mismatch verdict."""
    from gi.analysis import html

    cards = []
    for row in table.rows:
        k = row["capture"]
        slot = row.get("matched_slot", row["image"])
        figures = [html.image(tmp / "images" / f"c{k}_i{slot}.png", f"reconstruction: capture {k}, slot {slot}",
                              "reconstruction", css="pixels")]
        if "psnr" in row:
            figures.append(html.image(tmp / "images" / f"c{k}_i{slot}_truth.png", f"truth: capture {k}, image "
                                      f"{row['image']}", "truth", css="pixels"))
            words = (f"{row['verdict']}\nPSNR {row['psnr']:.2f} dB, SSIM {row['ssim']:.3f}\n"
                     f"slot label: {label_name(row['slot_label'], classes)}\n"
                     f"true label: {label_name(row['true_label'], classes)}"
                     + ("" if row["true_label_in_slots"] else " (in no slot)")
                     + (f"\nwithout truth: {row['estimate']}" if "estimate" in row else ""))
        else:
            words = (f"slot label: {label_name(row['slot_label'], classes)}\n"
                     f"gradient: {row['mismatch_verdict']} (mismatch {row['gradient_mismatch']:.2g})"
                     + (f"\nestimate: {row['estimate']}" if "estimate" in row else ""))
        cards.append(html.card(*figures, html.paragraph(f"capture {k}, image {row['image']}\n{words}", "caption")))
    return cards


def label_tables(metrics: dict[str, Any], classes: Sequence[str]) -> list[str]:
    """The label stage on the page: its record (mode, method, why, scores) and, per class with a sample, the
    recovered, true and final counts (one column per capture when several)."""
    from gi.analysis import html

    info, final = metrics["labels"], metrics.get("final_labels", {})
    keys = [key for key in dict.fromkeys([*info, *final]) if "counts" not in key]
    record = [{"": key, "label stage": info.get(key), **({"final labels": final.get(key)} if final else {})}
              for key in keys]
    columns = {"recovered": info["counts"], "true": info.get("true_counts"), "final": final.get("counts")}
    several = metrics["num_captures"] > 1
    per = {f"{what} (capture {k})" if several else what: counts
           for what, all_counts in columns.items() if all_counts is not None
           for k, counts in enumerate(all_counts if several else [all_counts])}
    rows = [{"class": label_name(c, classes), **{col: counts[c] for col, counts in per.items()}}
            for c in range(len(next(iter(per.values()))))
            if any(counts[c] for counts in per.values())]
    return [html.table(record), html.paragraph("Counts per class (classes with a sample):"), html.table(rows)]


def write_report(tmp: Path, name: str, config: dict[str, Any], summary: Summary, classes: Sequence[str] = ()
                 ) -> Path:
    """``report.html``, the output directory on one self-contained page (:mod:`gi.analysis.html`): the verdict
    sentence (docs/usage.md, "Verdict"), every reconstructed image beside its truth with its verdict, PSNR and
    labels (:func:`image_cards`), the trivial guesses, the labels (:func:`label_tables`), the plots, warnings,
    every row of results.csv and the config. Written after the images and plots it embeds."""
    import yaml

    from gi.analysis import html
    from gi.analysis.report import jsonable

    table, metrics = summary.table, summary.metrics
    parts = [html.paragraph(summary.sentence, "verdict"), html.section("Images", *image_cards(tmp, table, classes))]
    if "psnr_mean" in metrics:
        guesses = [{"capture": r["capture"], "image": r["image"], "PSNR [dB]": r["psnr"],
                    "mean colour [dB]": r["mean_colour_psnr"], "grey [dB]": r["grey_psnr"], "verdict": r["verdict"]}
                   for r in table.rows]
        parts.append(html.section("Trivial guesses", html.paragraph(
            "An image counts as recovered only well above the better of two guesses that need no attack: a flat "
            f"grey image and the image's mean colour. Means: reconstruction {metrics['psnr_mean']:.2f} dB, mean "
            f"colour {metrics['mean_colour_psnr_mean']:.2f} dB, grey {metrics['grey_psnr_mean']:.2f} dB, uniform "
            f"noise {metrics['random_image_psnr_mean']:.2f} dB."), html.table(guesses)))
    parts.append(html.section("Labels", *label_tables(metrics, classes)))
    parts.append(html.plot_section(tmp, REPORT_PLOTS))
    if metrics.get("warnings"):
        parts.append(html.section("Warnings", *(html.paragraph(str(w)) for w in metrics["warnings"])))
    parts.append(html.section("Every image (results.csv)", html.table(table.rows), folded=True))
    parts.append(html.section("Config (config.yaml)", html.preformatted(yaml.safe_dump(jsonable(config),
                                                                                        sort_keys=False))))
    return html.write_page(tmp / REPORT, html.page(f"{name}: gradient inversion report", *parts))


RECONSTRUCTIONS = "reconstructions.safetensors"


def save_reconstructions(tmp: Path, outcome: AttackResult, truths: Sequence[Truth] | None, table: Table) -> None:
    """The reconstructed images as data: ``reconstructions.safetensors`` holds, per capture k, ``capture{k}`` (its
    images (B, C, H, W), float32 pixels in [0, 1], exactly as the attack returned them) and ``labels{k}`` (the label
    of each slot, int64); ``images/c{k}_i{i}.png`` is slot i of capture k (8-bit), and with truth
    ``images/c{k}_i{i}_truth.png`` the truth image paired with that slot by pixels (results.csv's ``matched_slot``).
    A storage failure inside safetensors is raised as the ``OSError`` it is (:func:`gi.core.errors.as_os_error`),
    which the output directory's writer reports as an ``OutputError``."""
    import json

    from safetensors.torch import save_file

    from gi.core.errors import as_os_error

    recs = outcome.reconstructions
    tensors = {}
    for k, rec in enumerate(recs):
        tensors[f"capture{k}"] = rec.images.detach().float().cpu().contiguous()
        tensors[f"labels{k}"] = rec.labels.detach().argmax(1).cpu().contiguous()
    path = tmp / RECONSTRUCTIONS
    meta = {"kind": "reconstructions", "captures": len(recs), "images": "capture{k}: (B, C, H, W) float32 in [0, 1]",
            "labels": "labels{k}: (B,) the label of each slot"}
    try:
        save_file(tensors, str(path), metadata={"gi": json.dumps(meta)})
    except Exception as exc:  # a full disk inside safetensors: the OSError it is
        raise as_os_error(exc, path) from None
    (tmp / "images").mkdir()
    for k, rec in enumerate(recs):
        paired = {} if truths is None else {int(slot): i for i, slot in enumerate(table.scores[k]["perm"])}
        for i in range(rec.images.shape[0]):
            save_png(tmp / "images" / f"c{k}_i{i}.png", rec.images[i])
            if i in paired:
                save_png(tmp / "images" / f"c{k}_i{i}_truth.png", truths[k].images[paired[i]])


def write_plots(tmp: Path, name: str, outcome: AttackResult, monitor: Any, num_captures: int) -> None:
    """psnr.png (the truth monitor's curves: :func:`psnr_curves`), objective.png (the first capture's restarts:
    :func:`objective_curves`) and analytic.png (the analytic inversion's residual per layer), each when there is
    something to draw."""
    import torch

    recs = outcome.reconstructions
    psnr = psnr_curves(monitor.curves, monitor.ids, recs) if monitor is not None else []
    if psnr:
        save_curves(tmp / "psnr.png", psnr, "iteration", "PSNR [dB]", title=name)
    objective = objective_curves(recs[0])
    if objective:
        many = f" (capture 0 of {len(recs)})" if len(recs) > 1 else ""
        save_curves(tmp / "objective.png", objective, "iteration", "attack objective", title=name + many,
                    logy=True)
    layers = next((st.get("analytic_layers") for st in outcome.stages if st.get("analytic_layers")), None)
    if layers:  # the analytic inversion's residual per layer, from the last layer down to the input
        solved = [[r for r in la["residual"] if r is not None] for la in layers]  # stopped inversions: fewer
        series = {"gradient residual, largest": [max(rs) for rs in solved],
                  "gradient residual, median": [float(torch.tensor(rs).median()) for rs in solved]}
        if any(f is not None for la in layers for f in la["forward"]):
            series["forward mismatch, largest"] = [max((f for f in la["forward"] if f is not None),
                                                       default=float("nan")) for la in layers]  # fc: none
        floor = 1e-12  # an exact layer (0) still shows on the log axis
        save_line_plot(tmp / "analytic.png", list(range(len(layers))),
                       {k: [max(v, floor) if v == v else v for v in vs] for k, vs in series.items()},
                       "layer (0 = last: " + ", ".join(la["name"] for la in layers) + ")",
                       "relative residual", title=f"{name}: analytic inversion over {num_captures} capture(s)",
                       logy=True)


def save_captures(tmp: Path, captures: Sequence[Capture], truths: Sequence[Truth] | None) -> None:
    """One capture: ``capture.safetensors`` (+ ``truth.safetensors``); several: ``captures/NNN.safetensors``
    (+ ``truths/NNN.safetensors``)."""
    if len(captures) == 1:
        captures[0].save(tmp / "capture.safetensors")
        if truths is not None:
            truths[0].save(tmp / "truth.safetensors")
        return
    for sub, items in (("captures", captures), ("truths", truths)):
        if items is None:
            continue
        (tmp / sub).mkdir()
        for k, item in enumerate(items):
            item.save(tmp / sub / f"{k:03d}.safetensors")

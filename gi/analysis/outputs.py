"""The output directory of ``gi run`` / ``gi attack``: scores per image, the summary, plots and files
(docs/architecture.md "Data flow"), and the truth monitor that draws PSNR against iterations during a fit.
Scoring reads :class:`~gi.capture.Truth`; nothing here feeds back into the attack."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gi.analysis.report import save_caption_grid, save_line_plot, write_csv, write_json, write_yaml
from gi.attack.stages import AttackResult, LabelConfig, final_counts, used_labels

if TYPE_CHECKING:
    from gi.capture import Capture, Truth


def truth_monitor(truths: Sequence[Truth], every: int) -> Any:
    """A Lightning callback that logs the PSNR of every capture's current best iterate against its truth every
    ``every`` steps, from outside the attack module: ``.steps`` and ``.psnr`` (the mean over captures at the steps
    every capture was scored at), ``.per_capture``. It follows the captures by ``Problem.capture_ids`` through
    every problem of a split fit (``attack.pack``); a capture's retry (``attack.retries``) is not drawn, its first
    fit is."""
    import lightning as L
    import torch

    class TruthMonitor(L.Callback):
        def __init__(self, curves: dict[int, dict[int, float]] | None = None, ids: list[int] | None = None) -> None:
            self.truth, self.every = [t.images for t in truths], every
            self.ids = list(range(len(truths))) if ids is None else ids
            self.curves: dict[int, dict[int, float]] = {} if curves is None else curves  # capture -> step -> PSNR
            self.fitting: set[int] = set()

        def on_train_start(self, trainer, pl_module) -> None:
            self.fitting = {i for i in pl_module.problem.capture_ids if i not in self.curves}  # first fits only

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if batch_idx % self.every and batch_idx != trainer.max_steps - 1:
                return
            ids = pl_module.problem.capture_ids
            if not self.fitting or max(ids) >= len(self.truth):
                return
            from gi.analysis.metrics import match_images, psnr

            batch_now = pl_module.current_batch().cpu()
            for k, rec in zip(ids, batch_now):
                if k in self.fitting:
                    truth = self.truth[k]
                    perm = match_images(rec, truth) if rec.shape[0] > 1 else [0]
                    self.curves.setdefault(k, {})[batch_idx] = float(psnr(rec[perm], truth).clamp(max=100).mean())

        @property
        def fitted(self) -> list[int]:
            """The captures with a curve: those optimised (an analytically answered capture has none)."""
            return [k for k in self.ids if k in self.curves]

        @property
        def steps(self) -> list[int]:
            fitted = self.fitted
            return sorted(set.intersection(*(set(self.curves[k]) for k in fitted))) if fitted else []

        @property
        def per_capture(self) -> list[list[float]]:
            return [[self.curves[k][step] for k in self.fitted] for step in self.steps]

        @property
        def psnr(self) -> list[float]:
            return [float(torch.tensor(row).mean()) for row in self.per_capture]

        def part(self, lo: int, hi: int) -> Any:
            """The curve of captures ``lo:hi`` alone (a job packed with others: :func:`reconstruct_prepared`)."""
            return TruthMonitor(self.curves, self.ids[lo:hi])

    return TruthMonitor()


def _mean_dicts(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Numeric entries averaged over rows (the single row as it is)."""
    if len(rows) == 1:
        return dict(rows[0])
    keys = [k for k in rows[0] if all(isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)
                                      for r in rows)]
    return {k: sum(float(r[k]) for r in rows) / len(rows) for k in keys}


def write_outputs(tmp: Path, name: str, config: dict[str, Any], captures: Sequence[Capture],
                  truths: Sequence[Truth] | None, outcome: AttackResult, lcfg: LabelConfig, seed: int,
                  metric_options: dict[str, Any], monitor: Any = None, t0: float | None = None) -> dict[str, Any]:
    """Write the self-contained output directory of ``gi run`` / ``gi attack``: config.yaml, metrics.json (with
    ``stages``; scores and their mean/median/min over every image when truths are given), results.csv (one row
    per image), grid.png, plots, the captures (and truths). Returns the metrics."""
    import torch

    from gi.analysis.metrics import label_metrics, score, summarize
    from gi.attack.recon.problem import image_slots

    recs = outcome.reconstructions
    metrics: dict[str, Any] = {"name": name, "num_captures": len(captures),
                               "num_images": sum(image_slots(c) for c in captures)}
    rows: list[dict[str, Any]] = []
    shown_rec, shown_truth, captions = [], [], []
    lrs = outcome.label_results
    label_info = {"mode": lcfg.mode,
                  "method": outcome.stages[0]["method"], "why": outcome.stages[0]["why"],
                  "ok": all(lr.ok for lr in lrs if lr is not None),
                  "counts": [(lr.counts if lr is not None else final_counts(r)).tolist() for lr, r in zip(lrs, recs)]}
    if truths is not None:
        per_capture, random_psnr, lab, final = [], [], [], []
        for k, (rec, truth, lr) in enumerate(zip(recs, truths, lrs)):
            s = score(rec.images, truth.images, labels_rec=rec.labels.argmax(1), labels_true=truth.labels,
                      match=metric_options["match"], vgg=metric_options["lpips_vgg"])
            per_capture.append(s)
            rnd = torch.rand(truth.images.shape, generator=torch.Generator().manual_seed(seed + 7 + k))
            random_psnr.extend(score(rnd, truth.images, match=metric_options["match"], vgg=False)["psnr"])
            if lr is not None:
                lab.append(label_metrics(lr, truth))
            final.append(label_metrics(used_labels(rec, lcfg.mode), truth))
            perm = torch.as_tensor(s["perm"])
            rec_labels = rec.labels.argmax(1)[perm]
            for i in range(truth.images.shape[0]):
                rows.append({"capture": k, "image": i, "dataset_index": truth.meta.get("indices", [None] * (i + 1))[i],
                             "psnr": s["psnr"][i], "ssim": s["ssim"][i], "lpips_alex": s["lpips_alex"][i],
                             "true_label": int(truth.labels[i]), "recovered_label": int(rec_labels[i]),
                             "matched_reconstruction": s["perm"][i],
                             "answered_by": rec.history.get("answered_by", "optimisation"),
                             "analytic_residual": rec.history.get("analytic_residual")})
                captions.append(f"{s['psnr'][i]:.1f} dB\nlabel {int(rec_labels[i])} / {int(truth.labels[i])}")
            shown_truth.append(truth.images)
            shown_rec.append(rec.images[perm])
        images: dict[str, Any] = {}
        for metric in ("psnr", "ssim", "lpips_alex", "mse") + (("lpips_vgg",) if metric_options["lpips_vgg"] else ()):
            stats = summarize([v for s in per_capture for v in s[metric]])
            images[metric] = stats.pop("values")
            images.update({f"{metric}_{k}": v for k, v in stats.items()})
        if len(per_capture) == 1:
            images = per_capture[0]
        metrics.update({
            "psnr_mean": images["psnr_mean"], "psnr_median": images["psnr_median"], "psnr_min": images["psnr_min"],
            "ssim_mean": images["ssim_mean"], "lpips_alex_mean": images["lpips_alex_mean"],
            "random_image_psnr_mean": float(sum(random_psnr) / len(random_psnr)),
        })
        label_info.update(_mean_dicts(lab) if lab else {})
        label_info["true_counts"] = [t.counts.tolist() for t in truths]
        metrics["final_labels"] = {**_mean_dicts(final), "counts": [final_counts(r).tolist() for r in recs]}
        metrics["final_labels"]["L_r"] = metrics["final_labels"].get("soft_l1")
        metrics["images"] = images
    else:
        for k, rec in enumerate(recs):
            for i in range(rec.images.shape[0]):
                rows.append({"capture": k, "image": i, "recovered_label": int(rec.labels[i].argmax())})
                captions.append(f"label {int(rec.labels[i].argmax())}")
            shown_rec.append(rec.images)
    if len(captures) == 1:  # one capture: its counts as a plain list (as before)
        label_info["counts"] = label_info["counts"][0]
        if "true_counts" in label_info:
            label_info["true_counts"] = label_info["true_counts"][0]
        if "final_labels" in metrics:
            metrics["final_labels"]["counts"] = metrics["final_labels"]["counts"][0]
    metrics["labels"] = label_info
    seconds = sum(r.seconds for r in recs)
    iterations = max(r.iterations for r in recs)
    many = len(recs) > 1
    metrics["attack"] = {"objective": [r.objective.tolist() for r in recs] if many else recs[0].objective.tolist(),
                         "best_restart": [r.best_restart for r in recs] if many else recs[0].best_restart,
                         "seconds": seconds, "seconds_per_image": seconds / max(metrics["num_images"], 1),
                         "iterations": iterations,
                         "seconds_per_100_iterations": 100 * seconds / iterations if iterations else None}
    metrics["stages"] = outcome.stages
    metrics["warnings"] = outcome.warnings
    if t0 is not None:
        metrics["total_seconds"] = time.perf_counter() - t0
    metrics["device"] = "cuda" if torch.cuda.is_available() and config.get("attack", {}).get("device") != "cpu" \
        else "cpu"
    metrics["torch"] = torch.__version__
    write_yaml(tmp / "config.yaml", config)
    write_json(tmp / "metrics.json", metrics)
    write_csv(tmp / "results.csv", rows)
    legend = " (PSNR; recovered / true label)" if truths is not None else " (recovered label)"
    save_caption_grid(tmp / "grid.png", torch.cat(shown_rec), torch.cat(shown_truth) if shown_truth else None,
                      captions, title=name + legend)
    if monitor is not None and monitor.steps:
        answered = len(monitor.ids) - len(monitor.fitted)  # a mixed run: the optimised captures' mean alone
        label = "PSNR (best restart)" + (f", mean of the {len(monitor.fitted)} optimised captures ({answered} "
                                         "answered analytically)" if answered else "")
        save_line_plot(tmp / "psnr.png", monitor.steps, {label: monitor.psnr}, "iteration", "PSNR [dB]", title=name)
    if recs[0].history.get("step"):
        save_line_plot(tmp / "objective.png", recs[0].history["step"],
                       {f"restart {r}": [o[r] for o in recs[0].history["objective"]]
                        for r in range(len(recs[0].objective))}, "iteration", "attack objective", logy=True)
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
                       "relative residual", title=f"{name}: analytic inversion over {len(captures)} capture(s)",
                       logy=True)
    save_captures(tmp, captures, truths)
    return metrics


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

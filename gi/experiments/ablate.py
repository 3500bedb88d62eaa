"""``gi ablate CONFIG``: how much does label (and feature) knowledge help the reconstruction?

The same captures are reconstructed under every label-knowledge mode (``truth``, ``recovered``, ``hard``,
``joint``, ``recovered+joint``; :data:`gi.attack.stages.LABEL_MODES`) and every α/β variant of the
soft-label paper's eq. 8, giving its Tables 3 and 4 (Wang, Liang & He 2024, §4.3 and §5.1): PSNR / SSIM /
LPIPS and the label error L_r (Σ_c |ŷ_c − y_c| per image, rows matched one-to-one), with per-image values and
a PNG grid per row.

A config holds one base experiment (``data``, ``model``, ``protocol``, ``labels``, ``attack`` as in ``gi run``),
``settings`` (named dotted overrides of the base that change the captures, e.g. mixup vs smoothing, trained vs
untrained, L2 vs cosine), ``attack_variants`` (named overrides of ``attack``, e.g. α/β) and ``modes``. Each
(setting, variant, mode) row reconstructs all ``trials`` captures of its setting as one batched problem.

Long ablations resume: every finished row is kept (atomically) in ``.<out>.cells/`` next to the output
directory, keyed by a hash of everything that determines it (the setting's resolved config, the variant, the
mode); re-running the same command after an interruption reloads those rows and computes only the missing ones.
The cache is removed once the output directory is complete.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import shutil
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gi.analysis.report import save_grid, write_yaml
from gi.attack.recon.config import ReconConfig
from gi.attack.stages import LABEL_MODES, used_labels
from gi.core.config import to_dict
from gi.core.errors import GIError
from gi.experiments.ablate_output import write_ablation
from gi.experiments.config.ablate import AblateConfig, setting_config
from gi.experiments.outdir import (
    cells_dir,
    file_slug,
    link_latest,
    load_cell,
    restore_cell_file,
    save_cell,
    staged_output,
    stamped_out,
)
from gi.world.build import build_victim, capture_client, make_aux

log = logging.getLogger("gi.experiments.ablate")
METRIC_KEYS = ("psnr", "ssim", "lpips", "L_r")


def _paper_value(cfg: AblateConfig, setting: str, variant: str, mode: str) -> dict[str, float]:
    for key in (f"{setting}/{variant}/{mode}", f"{setting}/{mode}", f"{setting}/*/{mode}", f"*/{variant}/{mode}",
                f"{setting}/{variant}/*", f"{setting}/{variant}", f"*/*/{mode}", f"{setting}/*/*", f"*/{variant}/*"):
        if key in cfg.paper:
            return cfg.paper[key]
    return {}


@dataclass
class Row:
    setting: str
    variant: str
    mode: str
    per_image: list[dict[str, Any]]
    seconds: float
    label_ok: float
    error: str | None = None

    def summary(self) -> dict[str, Any]:
        def mean(key: str) -> float:
            vals = [r[key] for r in self.per_image if r.get(key) is not None]
            return float(sum(vals) / len(vals)) if vals else float("nan")

        out = {"setting": self.setting, "variant": self.variant, "mode": self.mode}
        out.update({k: mean(k) for k in METRIC_KEYS})
        out.update({"label_top1": mean("label_top1"), "labels_ok": self.label_ok, "images": len(self.per_image),
                    "seconds": self.seconds})
        if self.error:
            out["error"] = self.error
        return out


def _cell_key(scfg: AblateConfig, setting: str, variant: str, mode: str, attack: ReconConfig) -> str:
    """Hash of everything that determines one row (not the output paths, the paper values, the other rows)."""
    keep = {k: v for k, v in to_dict(scfg).items()
            if k not in ("out", "overwrite", "paper", "only", "modes", "attack_variants", "settings", "mode_attack")}
    text = json.dumps([keep, setting, variant, mode, to_dict(attack)], sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def _load_cell(cache: Path | None, key: str) -> Row | None:
    record = load_cell(cache, key)
    return None if record is None else Row(**record)


def reconstruct_many(*args: Any, **kwargs: Any) -> Any:
    """:func:`gi.attack.recon.reconstruct_many`, imported on first use (importing this module loads no
    torch/Lightning)."""
    from gi.attack.recon import reconstruct_many as reconstruct

    return reconstruct(*args, **kwargs)


def _captures(cfg: AblateConfig, layers: Collection[str] = ()) -> tuple[list, list, Any]:
    """The setting's captures, truths and aux set; every ``attack.feature_layer`` of its rows (``layers``) is
    checked against the victim's model first, so a bad name answers before any capture."""
    import torch

    from gi.attack.recon.problem import check_feature_layer

    dataset, model = build_victim(cfg)
    for layer in sorted(layers):
        check_feature_layer(model, layer)
    gen = torch.Generator().manual_seed(cfg.seed)
    pairs = [capture_client(cfg, dataset, model, gen) for _ in range(cfg.trials)]
    aux = make_aux(cfg, dataset, gen, [p[1] for p in pairs])
    return [p[0] for p in pairs], [p[1] for p in pairs], aux


def run_setting(cfg: AblateConfig, setting: str, out: Path, cache: Path | None = None) -> list[Row]:
    """All (variant, mode) rows of one setting on the same captures; rows found in ``cache`` are reused."""
    import torch

    from gi.analysis.metrics import label_metrics, score
    from gi.attack.recon.problem import capture_features  # torch: loaded with the first setting, not at import

    scfg = setting_config(cfg, setting)
    variants = cfg.attack_variants or {"base": {}}
    layers = {scfg.attack.feature_layer, *(over.get("feature_layer") for over in variants.values()),
              *(over.get("feature_layer") for over in cfg.mode_attack.values())} - {None}
    captures, truths, aux = _captures(scfg, layers)
    labels_cache: dict[Any, list[Any]] = {}  # one label stage per source (recovered serves recovered+joint too)
    features_cache: dict[Any, list[Any]] = {}  # f* per label source and feature layer
    rows = []
    for mode in cfg.modes:
        lcfg = dataclasses.replace(scfg.labels, mode=mode)
        source, kind = LABEL_MODES[mode].labels, LABEL_MODES[mode].kind
        for variant, over in variants.items():
            attack = dataclasses.replace(scfg.attack, **{**cfg.mode_attack.get(mode, {}), **over}, labels=kind,
                                         progress=False)
            key = _cell_key(scfg, setting, variant, mode, attack)
            grid = out / f"grid-{file_slug(setting)}-{file_slug(variant)}-{file_slug(mode)}.png"
            cached = _load_cell(cache, key)
            if cached is not None:
                restore_cell_file(cache, key, "png", grid)
                rows.append(cached)
                print(f"  {setting:>24s} {variant:>12s} {mode:>16s}  (finished earlier, reused)", flush=True)
                continue
            if source not in labels_cache:
                labels_cache[source] = [source(lcfg, c, t, aux) for c, t in zip(captures, truths)]
            results = labels_cache[source]
            start = time.perf_counter()
            try:
                fkey = (source, attack.feature_layer_name if attack.feature_weight > 0 else None, attack.seed,
                        attack.feature_draws)
                if fkey not in features_cache:  # gi run's rule (capture_features), once per label source and layer
                    features_cache[fkey] = capture_features(attack, captures, results)
                recs = reconstruct_many(captures, results, features_cache[fkey], attack,
                                        aux_images=getattr(aux, "images", None))
            except GIError as exc:  # e.g. a feature term without a feature target: the row reports why
                print(f"  {setting:>24s} {variant:>12s} {mode:>16s}  FAILED: {exc}", flush=True)
                rows.append(Row(setting, variant, mode, [], 0.0, 0.0, error=str(exc)))
                save_cell(cache, key, dataclasses.asdict(rows[-1]), {"png": grid})
                continue
            seconds = time.perf_counter() - start
            per_image = []
            for t, (rec, truth) in enumerate(zip(recs, truths)):
                sc = score(rec.images, truth.images, match=True, vgg=scfg.metrics.lpips_vgg)
                lab = label_metrics(used_labels(rec, mode), truth)
                for i in range(truth.images.shape[0]):
                    per_image.append({"setting": setting, "variant": variant, "mode": mode, "trial": t, "image": i,
                                      "psnr": sc["psnr"][i], "ssim": sc["ssim"][i], "lpips": sc["lpips_alex"][i],
                                      "L_r": lab.get("soft_l1"), "label_top1": lab.get("top1"),
                                      "true_label": int(truth.labels[i]), "objective": float(rec.objective.min())})
                rec.history["perm"] = sc["perm"]
            row = Row(setting, variant, mode, per_image, seconds,
                      float(sum(r is None or r.ok for r in results) / len(results)))
            rows.append(row)
            s = row.summary()
            print(f"  {setting:>24s} {variant:>12s} {mode:>16s}  PSNR {s['psnr']:6.2f}  SSIM {s['ssim']:.3f}  "
                  f"LPIPS {s['lpips']:.3f}  L_r {s['L_r']:.2e}  ({seconds:.0f} s)", flush=True)
            truth_row = torch.cat([t.images for t in truths])
            rec_row = torch.cat([r.images[torch.as_tensor(r.history["perm"])] for r in recs])
            save_grid(grid, [truth_row, rec_row], scale=2)
            save_cell(cache, key, dataclasses.asdict(row), {"png": grid})
    return rows


def run_ablation(cfg: AblateConfig) -> Path:
    """Run every setting × variant × mode and write the table (Markdown/CSV/JSON), per-image CSV, grids, plot."""
    import torch

    out = Path(cfg.out) if cfg.out else stamped_out(f"ablate-{cfg.name}", "runs")
    torch.manual_seed(cfg.seed)
    cache = cells_dir(out)
    with staged_output(out, overwrite=cfg.overwrite) as tmp:
        t0 = time.perf_counter()
        write_yaml(tmp / "config.yaml", cfg.written())
        rows: list[Row] = []
        for setting in cfg.only or cfg.settings or {"base": {}}:
            rows += run_setting(cfg, setting, tmp, cache)
        table = []
        for row in rows:
            s = row.summary()
            ref = _paper_value(cfg, row.setting, row.variant, row.mode)
            s.update({f"paper_{k}": ref.get(k) for k in METRIC_KEYS if k in ref})
            table.append(s)
        print(write_ablation(tmp, cfg.name, table, [r for row in rows for r in row.per_image], t0))
    shutil.rmtree(cache, ignore_errors=True)
    if not cfg.out:  # runs/<name>-latest names the newest (docs/usage.md, "Where a run writes")
        link_latest(out, f"ablate-{cfg.name}")
    return out

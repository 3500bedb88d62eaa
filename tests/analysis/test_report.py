"""report.html of an output directory (gi/analysis/html.py, gi/analysis/outputs.py write_report) and the plots'
data (psnr_curves, objective_curves): every string escaped, every image once, every image's verdict, the
returned fit drawn and the replaced one dashed."""

from __future__ import annotations

import csv
import html
import re
from pathlib import Path

import pytest
import torch

from gi.analysis.html import data_uri
from gi.analysis.outputs import REPORT_PLOTS, objective_curves
from gi.attack.recon import Reconstruction
from tests.analysis.conftest import EVIL_CLASS, EVIL_NAME


def test_the_report_escapes_every_string_of_the_config_and_the_captures(demo_report):
    page = demo_report.read_text()
    assert "<script" not in page.lower() and "<img src=x" not in page  # the name and the class names
    assert html.escape(EVIL_NAME) in page  # the title and the config, as text
    assert html.escape(EVIL_CLASS + "3") in page  # image 0 is a cat: its slot and true label
    assert 'http-equiv="Content-Security-Policy" content="default-src \'none\'' in page


def test_every_image_of_the_run_appears_once_and_nothing_else_is_loaded(demo_report):
    page = demo_report.read_text()
    pngs = sorted((demo_report.parent / "images").glob("*.png"))
    assert len(pngs) == 4  # two reconstructions, two truths
    for png in pngs:
        assert page.count(data_uri(png)) == 1, png.name
    plots = [p for p in REPORT_PLOTS if (demo_report.parent / p).is_file()]
    assert plots == ["psnr.png", "objective.png"]
    for plot in plots:
        assert page.count(data_uri(demo_report.parent / plot)) == 1
    sources = re.findall(r"<img [^>]*src=\"([^\"]*)\"", page)
    assert len(sources) == len(pngs) + len(plots) and all(s.startswith("data:image/png;base64,") for s in sources)


def test_the_report_gives_the_verdict_and_every_image_s_verdict_psnr_and_labels(demo_run, demo_report):
    from gi.analysis.verdict import verdict_line

    page = html.unescape(demo_report.read_text())
    assert verdict_line(demo_run.metrics["verdict"]) in page
    rows = list(csv.DictReader((demo_report.parent / "results.csv").open()))
    assert len(rows) == 2
    for row in rows:
        card = (f"capture {row['capture']}, image {row['image']}\n{row['verdict']}\n"
                f"PSNR {float(row['psnr']):.2f} dB")
        assert card in page, card
        assert f"without truth: {row['estimate']}" in page
        assert f"true label: {row['true_label']} {EVIL_CLASS}{row['true_label']}" in page
    for guess in ("mean_colour_psnr_mean", "grey_psnr_mean"):
        assert f"{demo_run.metrics[guess]:.2f} dB" in page
    assert "Counts per class" in page and "Config (config.yaml)" in page


def test_a_report_without_truth_gives_each_slot_s_label_and_the_mismatch_verdict(demo_run, tmp_path):
    from gi.experiments.attack import run_attack
    from gi.experiments.config.attack import load_attack_config

    result = run_attack(load_attack_config(str(demo_run.out), ["attack.iterations=2", "attack.progress=false",
                                                                "attack.retries=0", "attack.analytic=false",
                                                                f"out={tmp_path / 'a'}"]))
    page = html.unescape((result.out / "report.html").read_text())
    rows = list(csv.DictReader((result.out / "results.csv").open()))
    for row in rows:
        assert (f"capture {row['capture']}, image {row['image']}\nslot label: {row['slot_label']}\n"
                f"gradient: {row['mismatch_verdict']}") in page
        assert row["estimate"] == "not recovered"  # 2 iterations from noise leave the gradient far off (>= 0.03)
        assert f"\nestimate: {row['estimate']}" in page
    assert page.count("data:image/png;base64,") == len(rows) + 1  # the slots and objective.png
    assert "Trivial guesses" not in page


def _rec(restarts: int, history: dict, final: float | None = None) -> Reconstruction:
    image = torch.zeros(1, 3, 4, 4)
    objective = torch.arange(restarts, dtype=torch.float32) if final is None else torch.tensor([final])
    return Reconstruction(images=image, all_images=image.repeat(restarts, 1, 1, 1, 1), labels=torch.ones(1, 10),
                          objective=objective, best_restart=0, history=history)


def test_the_objective_plot_draws_the_returned_fit_and_the_replaced_one_dashed():
    steps = [0, 10, 20]
    few = _rec(3, {"step": steps, "objective": [[3.0, 2.0, 1.0]] * 3,
                   "replaced": [{"fit": 1, "attempt": 0, "step": steps, "objective": [9.0, 8.0, 7.0]}]})
    curves = objective_curves(few)
    assert [c.style for c in curves] == ["line", "line", "line", "replaced"]
    assert curves[0].label == "restart 0 (returned)" and curves[0].y == [3.0, 3.0, 3.0]
    assert curves[-1].label == "replaced (first fit): its best restart" and curves[-1].y == [9.0, 8.0, 7.0]
    nan = float("nan")
    many = _rec(16, {"step": steps, "objective": [list(map(float, range(16))), [1.0] + [nan] * 15,
                                                  [0.5] + [nan] * 15]})  # culled after step 0
    band, best = objective_curves(many)
    assert band.style == "band" and band.lower == [0.0, 1.0, 0.5] and band.y == [15.0, 1.0, 0.5]
    assert best.label == "restart 0 (returned)" and best.y == [0.0, 1.0, 0.5]


def test_a_retry_that_wins_records_the_fit_it_replaced(monkeypatch):
    """reconstruct_many keeps the fit with the lower objective; the returned one names its fit and, when a retry
    won, the replaced fit's best-restart curve (what the plots draw dashed)."""
    import gi.attack.recon.api as api
    from gi.attack.recon.config import ReconConfig

    def fake(finals):
        fits = iter(finals)

        def fit_many(captures, label_results, features, cfg, callbacks=(), stage="", ids=None, priors=None,
                     aux_images=None):
            final = next(fits)
            return [_rec(1, {"fit": final, "step": [0, 10], "objective": [[6.0], [float(final)]]}, float(final))
                    for _ in captures]
        return fit_many

    monkeypatch.setattr(api, "check_inputs", lambda c, lr, f: (list(c), list(lr), [None] * len(c)))
    cfg = ReconConfig(retries=1, retry_ratio=0.5, init="uniform")
    monkeypatch.setattr(api, "fit_many", fake([5, 1]))  # stalled (5 > 0.5 * 6), the retry wins
    (rec,) = api.reconstruct_many([object()], [None], config=cfg)
    assert rec.history["fit"] == 1 and rec.history["retries"] == 1
    assert rec.history["replaced"] == [{"fit": 5, "attempt": 0, "step": [0, 10], "objective": [6.0, 5.0]}]
    monkeypatch.setattr(api, "fit_many", fake([5, 9]))  # the retry loses: the first fit, nothing replaced
    (rec,) = api.reconstruct_many([object()], [None], config=cfg)
    assert rec.history["fit"] == 5 and "replaced" not in rec.history


def test_a_one_image_grid_s_title_is_wrapped_not_clipped(tmp_path):
    from PIL import Image

    from gi.analysis.report import save_caption_grid, wrap_title

    title = "demo (PSNR, verdict; label of the pixel-matched slot / true label)"
    save_caption_grid(tmp_path / "grid.png", torch.rand(1, 3, 8, 8), torch.rand(1, 3, 8, 8), ["17.5 dB partial"],
                      title=title)
    pixels = torch.tensor(list(Image.open(tmp_path / "grid.png").convert("L").getdata())).view(
        *reversed(Image.open(tmp_path / "grid.png").size))
    assert (pixels[:, :2] == 255).all() and (pixels[:, -2:] == 255).all()  # no text runs off either side
    assert (pixels[:2] == 255).all()  # nor off the top
    lines = wrap_title(title, 2.1, 9).split("\n")
    assert len(lines) > 1 and " ".join(lines) == title


@pytest.mark.parametrize("plot", ["psnr.png", "objective.png"])
def test_the_demo_run_draws_its_plots(demo_run, plot):
    assert (Path(demo_run.out) / plot).stat().st_size > 1000

"""Culling restarts (``attack.cull_after``: successive halving in one step) and the fit diagnostics of
:func:`gi.attack.recon.api.diagnose` (the regulariser-dominance warning only while the gradients are not yet
matched)."""

from __future__ import annotations

import math

import pytest
import torch

from gi.attack.recon import ReconConfig, reconstruct, reconstruct_many
from gi.attack.recon.api import DOMINANT, MATCHED, STALL_RATIO, diagnose
from gi.attack.recon.module import GradientInversion
from gi.attack.recon.problem import build_problem
from gi.core.errors import ConfigError
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import capture_gradients
from gi.world.models import build
from labels import LabelResult

C = 4


def _capture(sample: int = 0, b: int = 1):
    """Sample ``sample`` of one global model (seed 0); its images are not the attack's start (seed 0)."""
    model = build("cnn", C, in_shape=(3, 8, 8), seed=0, activation="tanh", channels=(4,), hidden=8)
    images = torch.rand(b, 3, 8, 8, generator=torch.Generator().manual_seed(100 + sample))
    labels = torch.randint(C, (b,), generator=torch.Generator().manual_seed(sample))
    capture, truth = capture_gradients(model, images, labels, Protocol(batch_size=b))
    return capture, truth, LabelResult.from_counts("truth", truth.counts, soft=truth.targets)


def _config(**keys) -> ReconConfig:
    base = dict(optimizer="lbfgs", lr=1.0, objective="l2", schedule="constant", signed=False, regularizers={},
                iterations=16, restarts=3, progress=False, threads=1, log_every=1)
    return ReconConfig(**{**base, **keys})


@pytest.mark.parametrize(("optimizer", "batching", "labels"),
                         [("lbfgs", "vmap", "fixed"), ("adam", "vmap", "fixed"), ("lbfgs", "loop", "fixed"),
                          ("lbfgs", "vmap", "joint")])
def test_cull_keeps_the_best_restart_by_objective_and_its_trajectory(optimizer, batching, labels):
    """The survivor is the restart with the lowest objective over the first k steps, and it ends where it ends
    without culling (its optimiser state, the L-BFGS memory, goes with it); culled restarts keep their best
    iterate from before the cull and log NaN after it."""
    k = 8
    keys = dict(optimizer=optimizer, lr=1.0 if optimizer == "lbfgs" else 0.05, batching=batching, labels=labels)
    captures, results = zip(*[(c, result) for c, _, result in (_capture(s) for s in (0, 1))])
    full = reconstruct_many(captures, results, None, _config(**keys))
    culled = reconstruct_many(captures, results, None, _config(cull_after=k, **keys))
    for f, c in zip(full, culled):
        before = torch.tensor(f.history["objective"][:k])  # steps 0..k-1, one column per restart
        survivor = int(before.min(0).values.argmin())
        assert c.best_restart == survivor
        assert torch.allclose(c.images, f.all_images[survivor], atol=1e-4)
        assert torch.allclose(c.labels, f.all_labels[survivor], atol=1e-4)  # joint labels follow their images
        assert math.isclose(float(c.objective[survivor]), float(f.objective[survivor]), rel_tol=1e-3)
        for r in range(3):
            if r != survivor:  # its best before the cull, never better than the survivor's end
                assert math.isclose(float(c.objective[r]), float(before[:, r].min()), rel_tol=1e-5)
                assert float(c.objective[r]) >= float(c.objective[survivor])
        after = torch.tensor(c.history["objective"][k:])
        assert torch.isnan(after).sum() == 2 * after.shape[0] and not torch.isnan(after[:, survivor]).any()
        assert c.all_images.shape == f.all_images.shape


def test_cull_config_is_checked_and_zero_or_one_restart_is_no_cull():
    with pytest.raises(ConfigError, match="cull_after must be >= 0"):
        ReconConfig(cull_after=-1)
    capture, _, label = _capture()
    once = reconstruct(capture, label, config=_config(restarts=1))
    culled_one = reconstruct(capture, label, config=_config(restarts=1, cull_after=5))
    assert torch.equal(once.images, culled_one.images)
    late = reconstruct(capture, label, config=_config(cull_after=100))  # after the last step: all run to the end
    assert not any(math.isnan(v) for o in late.history["objective"] for v in o)


# ------------------------------------------------------------------------------------------ diagnose
def _fitted(weight: float, end: torch.Tensor, start: torch.Tensor, capture, label) -> tuple:
    """A module whose best iterate is ``end`` (as if a fit had ended there) and the warnings about it."""
    cfg = _config(restarts=1, iterations=5, regularizers={"tv": weight})
    module = GradientInversion(build_problem([capture], [label], cfg), cfg)
    module.best_images = end.reshape(module.best_images.shape).clone()
    module.best_loss = torch.zeros(1)
    with torch.enable_grad():
        _, parts_end = module.objective(module.best_images)
        _, parts_start = module.objective(start.reshape(module.best_images.shape))
    kept = float(parts_end["match"] / parts_start["match"])
    share = float(parts_end["tv"] / sum(parts_end.values()))
    return diagnose(module, cfg, start.reshape(module.best_images.shape)), kept, share


def test_regulariser_dominance_is_warned_only_while_the_gradients_are_not_matched():
    """Both sides of :data:`MATCHED`: the same TV share of the objective warns when the match term kept more
    than 1 % of its start and is silent once the gradients are matched (kept below 1 %)."""
    capture, truth, label = _capture()
    start = torch.rand(truth.images.shape, generator=torch.Generator().manual_seed(5))
    near = truth.images + 1e-3 * (start - truth.images)  # the gradients matched: the match term ~1e-6 of start
    half = truth.images + 0.3 * (start - truth.images)  # not matched yet: a few % to tens of % of its start
    weight = 10.0
    matched, kept, share = _fitted(weight, near, start, capture, label)
    assert kept < MATCHED and share > DOMINANT, (kept, share)  # the premise: TV dominates a matched fit
    assert not any("regulariser tv" in w for w in matched), matched
    unmatched, kept, share = _fitted(weight, half, start, capture, label)
    assert MATCHED < kept < STALL_RATIO and share > DOMINANT, (kept, share)
    assert [w for w in unmatched if "regulariser tv" in w and "lower attack.regularizers.tv" in w], unmatched
    assert not any("stalled" in w for w in unmatched)


def test_pack_splits_the_captures_into_problems_with_the_same_results():
    """attack.pack=N: problems of at most N captures one after another; every capture starts from its own seed's
    image, so the reconstructions equal those of one packed problem (float rounding of vmap aside)."""
    captures, results = zip(*[(c, result) for c, _, result in (_capture(s) for s in (0, 1, 2))])
    whole = reconstruct_many(captures, results, None, _config())
    import lightning as L

    class Fits(L.Callback):
        sizes: list[int] = []

        def on_train_start(self, trainer, module):
            self.sizes.append(module.problem.num_problems)

    split = reconstruct_many(captures, results, None, _config(pack=2), callbacks=[Fits()])
    assert len(split) == 3 and Fits.sizes == [2, 1]  # two problems: captures 0-1, then capture 2
    for w, s in zip(whole, split):
        assert torch.allclose(w.images, s.images, atol=1e-4)
        assert s.best_restart == w.best_restart
    with pytest.raises(ConfigError, match="attack.pack must be auto or an int >= 0"):
        ReconConfig(pack=-1)


def test_stalled_compares_the_best_restarts_end_with_its_start():
    from gi.attack.recon.api import Reconstruction, stalled

    def rec(final: float) -> Reconstruction:
        return Reconstruction(images=torch.zeros(1), all_images=torch.zeros(2, 1), labels=torch.zeros(1),
                              objective=torch.tensor([1.0, final]), best_restart=1,
                              history={"objective": [[0.5, 10.0], [0.4, 1.0]]})

    assert not stalled(rec(0.009), 1e-3)  # 0.009 <= 1e-3 x 10 (the best restart's own start, not restart 0's)
    assert stalled(rec(0.011), 1e-3)
    assert not stalled(Reconstruction(images=torch.zeros(1), all_images=torch.zeros(1, 1), labels=torch.zeros(1),
                                      objective=torch.tensor([5.0]), best_restart=0), 1e-3)  # nothing logged


def test_retries_refit_stalled_captures_from_new_starts_and_keep_the_lower_objective():
    """With retry_ratio tiny every capture counts as stalled: one retry refits all of them with seed + 1 and 4x the
    restarts, and each keeps the fit (seed 0 or the retry, each run alone here) with the lower objective."""
    import lightning as L

    class Fits(L.Callback):
        count = 0

        def on_train_start(self, trainer, module):
            Fits.count += 1

    captures, results = zip(*[(c, result) for c, _, result in (_capture(s) for s in (0, 1))])
    seed0 = reconstruct_many(captures, results, None, _config(restarts=1))
    seed1 = reconstruct_many(captures, results, None, _config(restarts=4, seed=1))
    got = reconstruct_many(captures, results, None, _config(restarts=1, retries=1, retry_ratio=1e-30),
                           callbacks=[Fits()])
    assert Fits.count == 2
    for a, b, g in zip(seed0, seed1, got):
        win = a if float(a.objective.min()) < float(b.objective.min()) else b
        assert torch.allclose(g.images, win.images, atol=1e-5) and g.history["retries"] == 1
        assert len(g.objective) == len(win.objective)
    none = reconstruct_many(captures, results, None, _config(restarts=1, retries=3, retry_ratio=0.999))
    assert all("retries" not in r.history for r in none)  # the objective fell: no stall, no retry


@pytest.mark.parametrize(("keys", "match"), [({"retries": -1}, "retries must be >= 0"),
                                             ({"retry_ratio": 0.0}, "retry_ratio must be in"),
                                             ({"retry_ratio": 1.0}, "retry_ratio must be in"),
                                             ({"lbfgs_history": 0}, "lbfgs_history must be >= 1")])
def test_bad_retry_settings_are_clear_errors(keys, match):
    with pytest.raises(ConfigError, match=match):
        ReconConfig(**keys)


def test_a_retry_culls_no_earlier_than_retry_min_cull_with_the_retry_memory(monkeypatch):
    """The retry of a stalled capture runs 4x the starts, culled no earlier than RETRY_MIN_CULL, with
    RETRY_LBFGS_HISTORY pairs (the recipe that rescued the Fashion-MNIST plateau case); no cull stays no cull."""
    import gi.attack.recon.api as api

    seen = []
    real = api.fit_many

    def spy(captures, label_results, features, cfg, callbacks=(), **kw):
        seen.append(cfg)
        return real(captures, label_results, features, cfg, callbacks, **kw)

    monkeypatch.setattr(api, "fit_many", spy)
    capture, _, result = _capture(0)
    for cull, want in ((5, api.RETRY_MIN_CULL), (0, 0)):
        seen.clear()
        reconstruct_many([capture], [result], None, _config(restarts=2, cull_after=cull, retries=1, retry_ratio=1e-30))
        first, retry = seen
        assert (first.cull_after, first.lbfgs_history) == (cull, None)
        assert (retry.restarts, retry.cull_after, retry.lbfgs_history) == (8, want, api.RETRY_LBFGS_HISTORY)


def _ended(cfg: ReconConfig, best: torch.Tensor, last: torch.Tensor, start: torch.Tensor, capture, label) -> list:
    """The warnings about a fit from ``start`` whose best iterate is ``best`` and whose last iterate is ``last``."""
    module = GradientInversion(build_problem([capture], [label], cfg), cfg)
    shape = module.best_images.shape
    module.best_images = best.reshape(shape).clone()
    module.images.data = last.reshape(shape).clone()
    module.best_loss = torch.zeros(1)
    return diagnose(module, cfg, start.reshape(shape))


def test_an_objective_that_grew_is_called_diverged_not_stalled():
    """Every step made it worse: the best iterate is the start (the match term kept 100 %), the last iterate's
    objective is 3.1x the start's (the images x3, measured: 3.69 -> 11.3). That is a divergence, with its knobs;
    the same fit ending where it started is a stall."""
    capture, truth, label = _capture()
    start = torch.rand(truth.images.shape, generator=torch.Generator().manual_seed(5))
    cfg = _config(restarts=1, iterations=5)
    diverged = _ended(cfg, start, 3 * start, start, capture, label)
    assert len(diverged) == 1 and not any("stalled" in w for w in diverged), diverged
    assert diverged[0].startswith("the objective grew 3.07x (from 3.69 to 11.3) over 5 iterations: the optimisation "
                                  "diverged; lower attack.lr (now 1) or change attack.optimizer (now lbfgs)")
    stalled_fit = _ended(cfg, start, start, start, capture, label)
    assert len(stalled_fit) == 1 and "stalled" in stalled_fit[0] and "kept 100%" in stalled_fit[0], stalled_fit


def test_a_match_term_that_grew_under_a_heavy_regulariser_names_the_regulariser():
    """TV weight 10: a flat white image has no TV, so the whole objective fell (10.5 -> 7.9) while the match term
    grew 2.1x (3.69 -> 7.90): the regulariser pulled the images from the gradient."""
    capture, truth, label = _capture()
    start = torch.rand(truth.images.shape, generator=torch.Generator().manual_seed(5))
    white = torch.ones_like(start)
    warnings = _ended(_config(restarts=1, iterations=5, regularizers={"tv": 10.0}), white, white, start, capture,
                      label)
    assert len(warnings) == 1 and warnings[0].startswith("the gradient-matching term grew 2.14x from its start")
    assert warnings[0].endswith("lower attack.regularizers.tv (now 10)") and "stalled" not in warnings[0]

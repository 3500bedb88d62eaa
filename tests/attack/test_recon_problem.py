"""The plan before the loop: build_problem's Problem (without Lightning), the weighted terms table, and
reconstruct_many as build_problem + optimise + results."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gi.attack.recon import ReconConfig, reconstruct_many
from gi.attack.recon.objectives import OBJECTIVES
from gi.attack.recon.problem import Problem, build_problem, check_inputs, choose_batching, same_model
from gi.attack.recon.terms import REGULARIZERS, TERMS, Evaluation, register_term, term_weights
from gi.core.errors import CaptureError, ConfigError
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import simulate_client
from gi.world.models import build
from tests.factories import fedsgd_capture, tiny_cnn

C = 4
ROOT = Path(__file__).resolve().parents[2]
FAST = dict(iterations=3, progress=False, threads=1, log_every=1)


def _cnn(seed: int = 0, **kw):
    return tiny_cnn(C, seed, **kw)


def _capture(model, b: int, seed: int, protocol: Protocol | None = None):
    return fedsgd_capture(model, b, seed, C, protocol=protocol)


def _captures(n: int = 3, b: int = 2):
    model = _cnn()
    pairs = [_capture(model, b, s) for s in range(n)]
    return [c for c, _ in pairs], [result for _, result in pairs]


# ------------------------------------------------------------------------------------------ build_problem
def test_build_problem_stacks_targets_labels_features_and_plans_terms_and_batching():
    caps, label_results = _captures(3, 2)
    cfg = ReconConfig(restarts=2, feature_weight=0.5, last_layer_weight=0.0, regularizers={"tv": 1e-3, "l2": 0.0},
                      **FAST)
    problem = build_problem(caps, label_results, cfg)
    names = list(caps[0].gradients)
    assert list(problem.targets) == names and problem.num_problems == 3 and problem.num_samples == 2
    for k in names:
        assert torch.equal(problem.targets[k], torch.stack([c.gradients[k] for c in caps]))
    assert problem.matched == [k for k in names if not k.startswith("fc.")]  # α = 0 drops the last layer
    assert problem.weights["fc.weight"] == 0.0 and problem.weights["body.1.weight"] == 1.0
    assert problem.soft.shape == (3, 2, C) and problem.features.shape == (3, 2, 8)
    assert problem.terms == {"match": 1.0, "features": 0.5, "tv": 1e-3}  # λ = 0 drops l2
    assert problem.kind == "gradient" and problem.image_shape == (3, 8, 8) and problem.batching == "vmap"
    assert problem.prior is None and problem.bn_targets is None
    assert problem.model is not caps[0].model  # a fresh model: the captures are only read


def test_build_problem_without_lightning_in_a_fresh_interpreter():
    """The plan is testable (and usable) without Lightning: building a Problem imports none of it."""
    code = """
import json, sys, torch
from gi.world.fl.victim import capture_gradients
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import simulate_client
from gi.world.models import build
from gi.attack.recon.config import ReconConfig
from gi.attack.recon.problem import build_problem
from labels import LabelResult
model = build("cnn", 4, in_shape=(3, 8, 8), seed=0, channels=(4,), hidden=8)
x, y = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(0)), torch.tensor([1, 3])
capture, truth = simulate_client(model, (x, y), Protocol(scheme="fedavg", batch_size=2, local_epochs=2),
                                 torch.Generator().manual_seed(0))
p = build_problem([capture], [LabelResult.from_counts("t", truth.counts)], ReconConfig(regularizers={"tv": 0.1}))
print(json.dumps({"lightning": [m for m in sys.modules if "lightning" in m], "kind": p.kind,
                  "soft": list(p.soft.shape), "terms": p.terms, "batching": p.batching, "n": p.num_problems,
                  "shapes": {k: list(v.shape) for k, v in p.targets.items()}}))
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    fields = json.loads(out.stdout.strip().splitlines()[-1])
    assert fields["lightning"] == []
    assert fields["kind"] == "update" and fields["soft"] == [1, 2, C] and fields["n"] == 1
    assert fields["terms"] == {"match": 1.0, "tv": 0.1} and fields["batching"] == "loop"
    assert fields["shapes"]["fc.weight"] == [1, C, 8]


def test_build_problem_refuses_mixed_models_and_a_feature_term_without_targets():
    caps, label_results = _captures(1, 2)
    other, other_result = _capture(_cnn(seed=1), 2, 0)
    assert same_model(caps[0], caps[0]) and not same_model(caps[0], other)
    with pytest.raises(ConfigError, match="one global model"):
        build_problem([caps[0], other], [label_results[0], other_result], ReconConfig(**FAST))
    problem = build_problem(caps, label_results, ReconConfig(**FAST))
    with pytest.raises(ConfigError, match="feature targets"):
        dataclasses.replace(problem, terms={"match": 1.0, "features": 1.0})


def test_check_inputs_fills_and_checks_the_lists():
    caps, label_results = _captures(2, 2)
    assert check_inputs(caps, None, None)[1:] == ([None, None], [None, None])
    with pytest.raises(ConfigError, match="at least one"):
        check_inputs([], None, None)
    with pytest.raises(ConfigError, match="2 captures but 1 label"):
        check_inputs(caps, label_results[:1], None)
    with pytest.raises(CaptureError, match="gi.Capture"):
        check_inputs([{"gradients": {}}], None, None)


def test_choose_batching():
    small = _cnn()
    assert choose_batching("loop", 8, small, "gpu") == "loop" and choose_batching("vmap", 1, small, "cpu") == "vmap"
    assert choose_batching("auto", 2, small, "cpu") == "vmap"  # several rows of a small net
    assert choose_batching("auto", 1, small, "gpu") == "loop"  # one row: plain autograd
    big = build("resnet18", 10, seed=0)
    assert choose_batching("auto", 4, big, "cpu") == "loop" and choose_batching("auto", 4, big, "gpu") == "vmap"


# ------------------------------------------------------------------------------------------ terms
def test_term_weights_order_and_the_regularizer_view():
    cfg = ReconConfig(feature_weight=2.0, regularizers={"l2": 0.1, "tv": 0.0, "bn": 0.5})
    assert list(term_weights(cfg).items()) == [("match", 1.0), ("features", 2.0), ("l2", 0.1), ("bn", 0.5)]
    assert term_weights(cfg, matched=False) == {"features": 2.0, "l2": 0.1, "bn": 0.5}
    assert set(REGULARIZERS) == set(TERMS) - {"match", "features"} and len(REGULARIZERS) == len(TERMS) - 2
    assert "features" not in REGULARIZERS and REGULARIZERS["tv"] is TERMS["tv"]
    with pytest.raises(ConfigError, match="regularizers has unknown 'features'"):
        ReconConfig(regularizers={"features": 1.0})


def test_match_and_feature_terms_are_the_distance_of_the_evaluation():
    g = torch.Generator().manual_seed(0)
    shared, target = {"a": torch.randn(3, 4, generator=g)}, {"a": torch.randn(1, 4, generator=g)}
    f, ft = torch.randn(3, 2, 5, generator=g), torch.randn(1, 2, 5, generator=g)
    ev = Evaluation(distance=OBJECTIVES["l2"], shared=shared, shared_target=target, shared_weights={"a": 2.0},
                    features=f, feature_target=ft)
    x = torch.zeros(3, 1, 3, 2, 2)
    torch.testing.assert_close(TERMS["match"](x, ev), 2.0 * (shared["a"] - target["a"]).pow(2).sum(1))
    torch.testing.assert_close(TERMS["features"](x, ev), (f - ft).pow(2).flatten(1).sum(1))
    assert ev.model is None and ev.bn_targets is None


def test_a_new_term_is_one_decorated_function():
    """Registered, it is a valid ``attack.regularizers`` key and one weighted part of the objective."""
    caps, label_results = _captures(1, 2)

    @register_term("test-mean-pixel")
    def mean_pixel(images, ev):
        return images.mean(dim=(1, 2, 3, 4))

    try:
        cfg = ReconConfig(objective="l2", regularizers={"test-mean-pixel": 3.0}, **FAST)
        from gi.attack.recon.module import GradientInversion

        module = GradientInversion(build_problem(caps, label_results, cfg), cfg)
        x = torch.full((1, 2, 3, 8, 8), 0.25)
        total, parts = module.objective(x)
        assert list(parts) == ["match", "test-mean-pixel"]
        torch.testing.assert_close(parts["test-mean-pixel"], torch.tensor([0.75]))
        torch.testing.assert_close(total, parts["match"] + 0.75)
        with pytest.raises(ValueError, match="registered twice"):
            register_term("test-mean-pixel")(mean_pixel)
    finally:
        TERMS.pop("test-mean-pixel")


# ------------------------------------------------------------------------------------------ the loop
def test_reconstruct_many_is_build_problem_optimise_results():
    from gi.attack.recon.api import optimise, results

    caps, label_results = _captures(2, 2)
    cfg = ReconConfig(restarts=2, objective="l2", **FAST)
    recs = reconstruct_many(caps, label_results, config=cfg)
    module, seconds, threads = optimise(build_problem(caps, label_results, cfg), cfg)
    again = results(module, cfg, seconds, threads)
    assert threads == 1 and len(again) == 2
    for a, b in zip(recs, again):
        assert torch.equal(a.all_images, b.all_images) and torch.equal(a.objective, b.objective)
        assert a.best_restart == b.best_restart and a.history["objective"] == b.history["objective"]


def test_problem_rows_of_an_update_capture_follow_the_client():
    model = _cnn()
    protocol = Protocol(scheme="fedavg", batch_size=2, lr=0.1, local_epochs=2)
    x, y = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(3)), torch.tensor([0, 2])
    capture, truth = simulate_client(model, (x, y), protocol, torch.Generator().manual_seed(0))
    problem = build_problem([capture], [None], ReconConfig(labels="joint", **FAST))
    assert problem.kind == "update" and problem.soft is None and set(problem.targets) == set(capture.update)
    assert isinstance(problem, Problem) and problem.history == capture.history

"""Issue 15, point 1: ``attack.pack: auto`` sizes packed problems to a memory budget (gi/attack/recon/memory.py), and an
auto pack that runs out of CUDA memory is halved and the failed problem rerun."""

from __future__ import annotations

import pytest
import torch

from gi.attack.recon import ReconConfig, reconstruct_many
from gi.attack.recon import api as recon_api
from gi.attack.recon.memory import GIB, activation_elements, budget_bytes, bytes_per_capture, free_bytes
from gi.core.errors import ConfigError
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import capture_gradients
from gi.world.models import build


def _linear_capture(batch: int = 1):
    model = build("linear", 3, in_shape=(1, 4, 4), seed=0)
    x = torch.rand(batch, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    capture, truth = capture_gradients(model, x, torch.arange(batch) % 3, Protocol(batch_size=batch))
    return capture, truth


def test_activation_elements_counts_every_leaf_output_and_every_unfolded_conv_input_of_one_sample():
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    assert activation_elements(net, (4,)) == (3 + 3 + 2, 0)
    model = build("linear", 3, in_shape=(1, 4, 4), seed=0)  # normalize (16) -> flatten (16) -> fc (3)
    assert activation_elements(model, (1, 4, 4)) == (16 + 16 + 3, 0)
    conv = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3, groups=2), torch.nn.Flatten())  # 4 x 2 x 2 out, twice
    assert activation_elements(conv, (2, 4, 4)) == (16 + 16, 1 * 3 * 3 * 2 * 2)


def test_activation_elements_leaves_a_training_batchnorm_model_in_training_mode():
    model = build("resnet18", 10, seed=0)
    model.train()
    assert min(activation_elements(model, (3, 32, 32))) > 0 and model.training


def test_bytes_per_capture_is_the_memory_model_exactly():
    capture, _ = _linear_capture(batch=2)
    p, a, n, b = 16 * 3 + 3, 35, 16, 2  # parameters, activations of one sample, image elements, samples
    for opt, state, keys in (("adam", 2, {}), ("sgd", 1, {}), ("lbfgs", 350, {}),
                             ("lbfgs", 700, {"lbfgs_history": 200})):
        cfg = ReconConfig(optimizer=opt, restarts=3, **keys)
        assert bytes_per_capture(capture, cfg) == 4 * (3 * (4 * p + 3 * a * b + (state + 3) * n * b) + p)


def test_bytes_per_capture_grows_with_restarts_batch_and_optimiser_state():
    one, _ = _linear_capture(batch=1)
    two, _ = _linear_capture(batch=2)
    adam = ReconConfig(optimizer="adam")
    assert bytes_per_capture(one, ReconConfig(optimizer="adam", restarts=4)) > bytes_per_capture(one, adam)
    assert bytes_per_capture(two, adam) > bytes_per_capture(one, adam)
    assert bytes_per_capture(one, ReconConfig(optimizer="lbfgs")) > bytes_per_capture(one, adam)


def test_budget_is_the_configured_gib_or_half_the_free_memory():
    assert budget_bytes(1.5, "cpu") == int(1.5 * GIB)
    free = free_bytes("cpu")
    assert free > 0
    assert abs(budget_bytes(None, "cpu") - free // 2) < 0.05 * free  # free memory moves a little between calls


def test_auto_pack_splits_the_captures_to_fit_the_budget_and_keeps_the_results(lenet_captures):
    caps = [(c, result) for c, result, _ in lenet_captures(3)]
    cfg = ReconConfig(iterations=4, lr=0.01, progress=False, threads=1, restarts=2)
    per = bytes_per_capture(caps[0][0], cfg)
    auto = ReconConfig(**{**cfg.__dict__, "pack": "auto", "memory_budget": 2.5 * per / GIB})
    recs = reconstruct_many([c for c, _ in caps], [result for _, result in caps], config=auto)
    assert [r.history["pack"] for r in recs] == [2, 2, 1]  # two captures fit, then the one left
    fixed = reconstruct_many([c for c, _ in caps], [result for _, result in caps],
                             config=ReconConfig(**{**cfg.__dict__, "pack": 2}))
    for a, f in zip(recs, fixed):
        assert torch.equal(a.images, f.images)


def test_an_auto_pack_out_of_cuda_memory_is_halved_and_the_failed_problem_rerun(monkeypatch, lenet_captures):
    caps = [(c, result) for c, result, _ in lenet_captures(3)]
    real = recon_api.optimise
    sizes = []

    def tight(problem, cfg, callbacks=(), stage="reconstruct"):
        sizes.append(problem.num_problems)
        if problem.num_problems > 1:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(problem, cfg, callbacks, stage)

    monkeypatch.setattr(recon_api, "optimise", tight)
    cfg = ReconConfig(iterations=2, progress=False, threads=1, pack="auto", memory_budget=64.0)
    recs = reconstruct_many([c for c, _ in caps], [result for _, result in caps], config=cfg)
    assert sizes == [3, 1, 1, 1] and [r.history["pack"] for r in recs] == [1, 1, 1]
    with pytest.raises(torch.OutOfMemoryError):  # an explicit pack is the user's choice: the error stands
        reconstruct_many([c for c, _ in caps], [result for _, result in caps],
                         config=ReconConfig(iterations=2, progress=False, threads=1, pack=3))


@pytest.mark.parametrize("keys, needle", [
    ({"pack": "fast"}, "attack.pack"), ({"pack": -1}, "attack.pack"), ({"pack": True}, "attack.pack"),
    ({"pack": 1.5}, "attack.pack"), ({"pack": "auto", "memory_budget": 0.0}, "attack.memory_budget"),
])
def test_bad_pack_settings_are_clear_config_errors(keys, needle):
    with pytest.raises(ConfigError, match=needle):
        ReconConfig(**keys)

"""The reconstruction engine: registries (objectives, regularisers, inits, simulators), batched restarts and
problems, joint labels, eq. 8's feature term, FedAvg unrolling, no route for ground truth."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

from gi.attack.recon import INITS, OBJECTIVES, REGULARIZERS, SIMULATORS, ReconConfig, reconstruct, reconstruct_many
from gi.attack.recon.api import cpu_threads
from gi.attack.recon.module import GradientInversion, records_history
from gi.attack.recon.problem import Problem, bn_targets, build_problem, feature_targets, labels_for_slots, match_weights
from gi.attack.recon.terms import Evaluation
from gi.capture import Capture
from gi.core.errors import ConfigError
from gi.world.fl import SCHEMES
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import capture_gradients, simulate_client
from gi.world.models import build
from labels import LabelResult
from tests.factories import oracle, tiny_cnn

C = 4


def _images(b: int, seed: int = 0, shape=(3, 8, 8)) -> torch.Tensor:
    return torch.rand(b, *shape, generator=torch.Generator().manual_seed(seed))


def _labels(b: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(C, (b,), generator=torch.Generator().manual_seed(seed))


def _cnn(seed: int = 0, **kw):
    return tiny_cnn(C, seed, **kw)


_oracle = oracle


FAST = dict(iterations=3, progress=False, threads=1, log_every=1)


# ------------------------------------------------------------------------------------------ objectives
def _grads(p: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"a": torch.randn(p, 3, 2, generator=g), "b": torch.randn(p, 5, generator=g)}


def test_objective_registry_closed_forms():
    dummy, target = _grads(3, 0), _grads(1, 1)
    w = {"a": 2.0, "b": 0.5}
    flat_d = {k: v.reshape(3, -1) for k, v in dummy.items()}
    flat_t = {k: v.reshape(1, -1) for k, v in target.items()}
    l2 = sum(w[k] * (flat_d[k] - flat_t[k]).pow(2).sum(1) for k in w)
    l1 = sum(w[k] * (flat_d[k] - flat_t[k]).abs().sum(1) for k in w)
    dot = sum(w[k] * (flat_d[k] * flat_t[k]).sum(1) for k in w)
    nd = sum(w[k] * flat_d[k].pow(2).sum(1) for k in w).sqrt()
    nt = sum(w[k] * flat_t[k].pow(2).sum(1) for k in w).sqrt()
    local = sum(w[k] * (1 - torch.nn.functional.cosine_similarity(flat_d[k], flat_t[k], dim=1)) for k in w) / 2.5
    expected = {"l2": l2, "l1": l1, "cosine": 1 - dot / (nd * nt), "cosine-layerwise": local}
    assert set(OBJECTIVES) == set(expected)
    for name, value in expected.items():
        torch.testing.assert_close(OBJECTIVES[name](dummy, target, w), value, rtol=1e-5, atol=1e-6)
        # a per-problem target (P, …) gives the same as a shared (1, …) one
        per = {k: v.expand(3, *v.shape[1:]).clone() for k, v in target.items()}
        torch.testing.assert_close(OBJECTIVES[name](dummy, per, w), value, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["l2", "l1", "cosine", "cosine-layerwise"])
def test_objective_is_zero_at_the_target_and_positive_elsewhere(name):
    t = _grads(1, 2)
    both = {k: torch.cat([v, 3 * v + 1]) for k, v in t.items()}
    out = OBJECTIVES[name](both, t, {"a": 1.0, "b": 1.0})
    assert abs(float(out[0])) < 1e-6 and float(out[1]) > 1e-3


# ------------------------------------------------------------------------------------------ regularisers
def test_tv_variants_vanish_on_constant_images_and_match_closed_forms():
    const = torch.full((2, 1, 3, 4, 4), 0.3)
    ramp = torch.arange(4.0).view(1, 1, 1, 1, 4).expand(2, 1, 3, 4, 4) / 4  # x-gradient 0.25, y-gradient 0
    assert torch.allclose(REGULARIZERS["tv"](const), torch.zeros(2))
    assert torch.allclose(REGULARIZERS["tv-kornia"](const), torch.zeros(2))
    assert torch.allclose(REGULARIZERS["tv-iso"](const), torch.full((2,), 1e-4), atol=1e-6)
    torch.testing.assert_close(REGULARIZERS["tv"](ramp), torch.full((2,), 0.25))  # mean |dx| + mean |dy|
    # kornia: sum of |dx| over the image / pixel count = 0.25 · 3·4·3 / 48
    torch.testing.assert_close(REGULARIZERS["tv-kornia"](ramp), torch.full((2,), 0.25 * 36 / 48))
    assert REGULARIZERS["tv-iso"](ramp)[0] > 0.1


def test_l2_priors():
    x = torch.full((2, 1, 3, 2, 2), 0.7)
    torch.testing.assert_close(REGULARIZERS["l2"](x), torch.full((2,), 0.04))
    torch.testing.assert_close(REGULARIZERS["l2-norm"](x), torch.full((2,), 0.49))


def test_bn_regulariser_is_zero_at_the_client_batch_statistics():
    model = _cnn(batch_norm=True).eval()
    x = _images(3)
    capture, _ = capture_gradients(model, x, _labels(3), Protocol(batch_size=3))
    from gi.world.build import share_bn_statistics

    share_bn_statistics(model, x, capture)
    targets = bn_targets(capture, model, "shared")
    assert list(targets) == ["body.0.1"]
    problem = build_problem([capture], [None], ReconConfig(labels="joint", regularizers={"bn": 1.0}, **FAST))
    assert all(torch.equal(a, b) for a, b in zip(problem.bn_targets["body.0.1"], targets["body.0.1"]))
    both = torch.stack([x, _images(3, seed=5)])
    value = REGULARIZERS["bn"](both, Evaluation(problem))
    assert float(value[0]) < 1e-5 and float(value[1]) > 1e-2
    running = bn_targets(capture, model, "running")  # DeepInversion's source: running mean 0, var 1 when fresh
    assert torch.equal(running["body.0.1"][0], torch.zeros(1, 4))
    with pytest.raises(ConfigError, match="BatchNorm statistics"):
        REGULARIZERS["bn"](both, Evaluation(dataclasses.replace(problem, bn_targets=None)))


def test_every_registered_regulariser_has_a_test_above():  # aux-span: tests/attack/test_fc_inputs.py
    assert set(REGULARIZERS) == {"tv", "tv-iso", "tv-kornia", "l2", "l2-norm", "bn", "aux-span"}


# ------------------------------------------------------------------------------------------ inits
def test_inits_shapes_ranges_and_analytic_prior():
    shape = (2, 3, 1, 3, 4, 4)
    gen = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    assert set(INITS) == {"uniform", "gaussian", "constant", "analytic", "aux-mean"}  # aux-mean: test_fc_inputs.py
    for name in ("uniform", "gaussian", "constant"):
        out = INITS[name](shape, gen(), None, 0.0)
        assert out.shape == shape and float(out.min()) >= 0 and float(out.max()) <= 1
    assert torch.all(INITS["constant"](shape, gen(), None, 0.0) == 0.5)
    prior = torch.rand(2, 1, 3, 4, 4)
    out = INITS["analytic"](shape, gen(), prior, 0.1)
    assert torch.equal(out[:, 0], prior) and not torch.equal(out[:, 1], prior)
    with pytest.raises(ConfigError, match="analytic"):
        INITS["analytic"](shape, gen(), None, 0.1)


# ------------------------------------------------------------------------------------------ simulators
def test_gradient_simulator_reproduces_the_capture_exactly():
    model = _cnn()
    x, y = _images(3), _labels(3)
    capture, truth = capture_gradients(model, x, y, Protocol(batch_size=3))
    names = list(capture.gradients)
    sim = SIMULATORS["gradient"](capture.model(), capture.protocol, names, features=True)
    g, f = sim(x, truth.targets)
    for k in names:
        torch.testing.assert_close(g[k], capture.gradients[k], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(f, model.features(x))


# every registered update scheme (with its coefficient switched on) plus the optimiser rules
SCHEME_COEFFICIENTS = {"fedprox": {"prox_mu": 2.0}, "feddyn": {"feddyn_alpha": 0.5}, "feddc": {"feddc_alpha": 0.5}}
UPDATE_CASES = [dict(scheme=name, local_epochs=3, **SCHEME_COEFFICIENTS.get(name, {}))
                for name, scheme in SCHEMES.items() if scheme.shares == "update"] + [
    dict(scheme="fedavg", optimizer="sgdm", momentum=0.9, local_epochs=3, weight_decay=1e-2),
    dict(scheme="fedavg", optimizer="nesterov", momentum=0.5, local_epochs=2),
    dict(scheme="feddyn", optimizer="sgdm", momentum=0.9, feddyn_alpha=0.5, local_epochs=2),
    dict(scheme="fedavg", optimizer="adadelta", lr=1.0, local_epochs=2),
]


@pytest.mark.parametrize("case", UPDATE_CASES, ids=lambda c: "-".join(str(v) for v in c.values()))
def test_update_simulator_unrolls_the_client_exactly(case):
    """One step per epoch (B = N): the unrolled update equals gi.world.fl.victim's, whatever the shuffle."""
    model = _cnn()
    x, y = _images(4), _labels(4)
    protocol = Protocol(**{"batch_size": 4, "lr": 0.1, **case})
    g = torch.Generator().manual_seed(1)
    history = {f"{t}/{n}": 0.05 * torch.randn(p.shape, generator=g) for t in SCHEMES[protocol.scheme].history
               for n, p in model.named_parameters()}
    capture, truth = simulate_client(model, (x, y), protocol, torch.Generator().manual_seed(2), history=history)
    names = list(capture.update)
    sim = SIMULATORS["update"](capture.model(), capture.protocol, names, num_samples=4, history=capture.history)
    upd, _ = sim(truth.images, truth.targets)
    for k in names:
        torch.testing.assert_close(upd[k], capture.update[k], rtol=1e-4, atol=1e-6)


def test_fedavg_capture_objective_is_zero_at_the_truth_and_reconstruct_runs():
    model = _cnn()
    protocol = Protocol(scheme="fedavg", batch_size=2, lr=0.1, local_epochs=2)
    capture, truth = simulate_client(model, (_images(2), _labels(2)), protocol, torch.Generator().manual_seed(0))
    cfg = ReconConfig(objective="l2", regularizers={}, **FAST)
    problem = dataclasses.replace(build_problem([capture], [_oracle(truth)], cfg), soft=truth.targets[None])
    assert problem.kind == "update"
    module = GradientInversion(problem, cfg)
    # slots 0, 1 vs the client's shuffled order: one epoch = one step over both, so the order does not matter
    assert float(module.objective(truth.images[None])[0]) < 1e-10
    rec = reconstruct(capture, _oracle(truth), config=cfg)
    assert rec.images.shape == (2, 3, 8, 8) and rec.objective.shape == (1,)


# ------------------------------------------------------------------------------------------ batching
@pytest.mark.parametrize("batching", ["vmap", "loop"])
def test_batched_problems_and_restarts_equal_separate_objectives(batching):
    model = _cnn()
    caps = [capture_gradients(model, _images(2, s), _labels(2, s), Protocol(batch_size=2)) for s in range(3)]
    cfg = ReconConfig(restarts=2, objective="cosine", regularizers={"tv": 0.01}, batching=batching, **FAST)
    batched = GradientInversion(build_problem([c for c, _ in caps], [_oracle(t) for _, t in caps], cfg), cfg)
    x = torch.rand(6, 2, 3, 8, 8, generator=torch.Generator().manual_seed(9))
    both = batched.objective(x)[0]
    for i, (c, t) in enumerate(caps):
        single = GradientInversion(build_problem([c], [_oracle(t)], cfg), cfg)
        torch.testing.assert_close(single.objective(x[2 * i:2 * i + 2])[0], both[2 * i:2 * i + 2], rtol=1e-5,
                                   atol=1e-6)


@pytest.mark.parametrize("objective,weights", [
    ("l2", {}), ("cosine", {"last_layer_weight": 0.3, "layer_weights": {"fc.weight": 2.0}}),
    ("cosine-layerwise", {"last_layer_weight": 0.5}), ("l1", {})])
def test_loop_and_vmap_batching_give_the_same_objective_and_image_gradient(objective, weights):
    """``batching=loop`` (one problem at a time: plain autograd, and for l2/cosine one concatenated √w-scaled
    vector) is the same computation as ``vmap``, problem by problem, with any layer weights."""
    model = _cnn()
    c, t = capture_gradients(model, _images(2, 0), _labels(2, 0), Protocol(batch_size=2))
    x = torch.rand(3, 2, 3, 8, 8, generator=torch.Generator().manual_seed(4))
    out = {}
    for batching in ("vmap", "loop"):
        cfg = ReconConfig(restarts=3, objective=objective, regularizers={"tv": 0.01}, batching=batching, **weights,
                          **FAST)
        module = GradientInversion(build_problem([c], [_oracle(t)], cfg), cfg)
        assert module.vectorised() == (batching == "vmap")
        assert module.flat() == (objective in ("l2", "cosine") and batching == "loop")
        xi = x.clone().requires_grad_(True)
        loss = module.objective(xi)[0]
        loss.sum().backward()
        out[batching] = (loss.detach(), xi.grad)
        module.images = torch.nn.Parameter(x.clone())  # the training step's path: per-problem backward for loop
        module.manual_backward = lambda loss, **kw: loss.backward(**kw)
        out[batching] += (module.objective_and_backward(), module.images.grad)
    torch.testing.assert_close(out["loop"][0], out["vmap"][0], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(out["loop"][1], out["vmap"][1], rtol=1e-4, atol=1e-7)
    for name in ("vmap", "loop"):
        for i in (0, 1):
            torch.testing.assert_close(out[name][2 + i], out["vmap"][i], rtol=1e-4, atol=1e-7)
    auto = GradientInversion(build_problem([c], [_oracle(t)], ReconConfig(restarts=2, **FAST)),
                             ReconConfig(restarts=2, **FAST))
    assert auto.vectorised()  # several problems of a small net on CPU: vmap
    one = GradientInversion(build_problem([c], [_oracle(t)], ReconConfig(**FAST)), ReconConfig(**FAST))
    assert not one.vectorised()  # one problem: plain autograd


@pytest.mark.parametrize("batching,restarts", [("loop", 1), ("vmap", 3)])
def test_the_concatenated_objective_equals_the_per_layer_one(monkeypatch, batching, restarts):
    """One concatenated √w-scaled vector per row (one row at a time, or all rows under vmap) gives the per-layer
    objective and image gradient, with layer weights."""
    c, t = capture_gradients(_cnn(), _images(2, 0), _labels(2, 0), Protocol(batch_size=2))
    cfg = ReconConfig(objective="cosine", regularizers={}, last_layer_weight=0.4, restarts=restarts,
                      batching=batching, **FAST)
    x = torch.rand(restarts, 2, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    out = {}
    for flat in (True, False):
        monkeypatch.setattr(GradientInversion, "flat", lambda self, flat=flat: flat)
        module = GradientInversion(build_problem([c], [_oracle(t)], cfg), cfg)
        assert module.vectorised() == (batching == "vmap")
        xi = x.clone().requires_grad_(True)
        loss = module.objective(xi)[0]
        loss.sum().backward()
        out[flat] = (loss.detach(), xi.grad)
        assert hasattr(module, "target_flat") == flat  # built on first use only
    torch.testing.assert_close(out[False][0], out[True][0], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(out[False][1], out[True][1], rtol=1e-4, atol=1e-7)


def test_the_concatenated_objective_is_used_off_the_cpu_and_on_it_one_row_up_to_flat_max(monkeypatch):
    """A GPU step is launch-bound: off the CPU the objective always concatenates the layers; on the CPU only one
    row at a time, up to FLAT_MAX entries (under vmap the packed iterates would drift from the lone ones)."""
    import gi.attack.recon.module as module_mod

    c, t = capture_gradients(_cnn(), _images(2, 0), _labels(2, 0), Protocol(batch_size=2))
    for batching, restarts in (("loop", 1), ("vmap", 3)):
        cfg = ReconConfig(objective="cosine", restarts=restarts, batching=batching, **FAST)
        module = GradientInversion(build_problem([c], [_oracle(t)], cfg), cfg)
        monkeypatch.setattr(module_mod, "FLAT_MAX", module.flat_numel)
        assert module.flat() == (batching == "loop")
        monkeypatch.setattr(module_mod, "FLAT_MAX", module.flat_numel - 1)
        assert not module.flat()
        module.images = torch.nn.Parameter(torch.empty_like(module.images, device="meta"))
        assert module.flat()  # the same module off the CPU
    for objective in ("cosine-layerwise", "l1"):  # no concatenated form: never flat
        other_cfg = ReconConfig(objective=objective, **FAST)
        other = GradientInversion(build_problem([c], [_oracle(t)], other_cfg), other_cfg)
        other.images = torch.nn.Parameter(torch.empty_like(other.images, device="meta"))
        assert not other.flat()


def test_reconstruct_many_matches_shapes_and_ranks_restarts_by_objective():
    model = _cnn()
    caps = [capture_gradients(model, _images(1, s), _labels(1, s), Protocol()) for s in range(2)]
    cfg = ReconConfig(restarts=3, objective="l2", **FAST)
    recs = reconstruct_many([c for c, _ in caps], [_oracle(t) for _, t in caps], config=cfg)
    assert len(recs) == 2
    for rec in recs:
        assert rec.all_images.shape == (3, 1, 3, 8, 8)
        assert rec.best_restart == int(torch.argmin(rec.objective))
        assert torch.equal(rec.images, rec.all_images[rec.best_restart])


def test_the_attack_api_has_no_route_for_ground_truth():
    """Oracle selection is impossible by construction: the attack sees captures, labels, features, a config."""
    for fn in (reconstruct, reconstruct_many):
        params = set(inspect.signature(fn).parameters)
        # priors: the attack's own analytic images; ids: the captures' positions in the caller's list;
        # aux_images: the attacker's own aux set (never the victims' images: gi.world.build.make_aux excludes them)
        assert params <= {"capture", "captures", "label_result", "label_results", "features", "config", "callbacks",
                          "priors", "ids", "aux_images"}
    assert "truth" not in {f.name for f in dataclasses.fields(Problem)}
    assert "truth" not in inspect.signature(GradientInversion.__init__).parameters
    assert "truth" not in inspect.signature(build_problem).parameters


@pytest.mark.parametrize("iterations,log_every,steps", [(7, 3, [0, 3, 6]), (8, 3, [0, 3, 6, 7]), (5, 100, [0, 4])])
def test_the_history_records_the_steps_records_history_names(iterations, log_every, steps):
    """The steps that copy the objective to the host (scripts/gpu/sync_check.py counts them apart) are exactly the
    ones ``records_history`` names: every ``log_every`` and the last."""
    cap, truth = capture_gradients(_cnn(), _images(1), _labels(1), Protocol())
    cfg = ReconConfig(**{**FAST, "iterations": iterations, "log_every": log_every})
    rec = reconstruct(cap, _oracle(truth), config=cfg)
    assert rec.history["step"] == steps == [s for s in range(iterations) if records_history(cfg, s)]
    assert len(rec.history["objective"]) == len(steps)


# ------------------------------------------------------------------------------------------ labels
def test_labels_for_slots_counts_soft_and_errors():
    counts = torch.tensor([2, 0, 1, 0])
    slots = labels_for_slots(LabelResult.from_counts("m", counts), 3, C)
    assert slots.argmax(1).tolist() == [0, 0, 2]
    soft = torch.tensor([[0.1, 0.1, 0.7, 0.1], [0.6, 0.2, 0.1, 0.1]])
    assert labels_for_slots(LabelResult.from_counts("m", torch.tensor([1, 0, 1, 0]), soft=soft), 2, C).argmax(
        1).tolist() == [0, 2]  # canonical order: by class
    with pytest.raises(ConfigError, match="sum to 3 but the capture has 4"):
        labels_for_slots(LabelResult.from_counts("m", counts), 4, C)
    with pytest.raises(ConfigError, match="joint"):
        labels_for_slots(None, 1, C)


def test_joint_labels_start_from_the_given_labels_and_move():
    model = _cnn()
    capture, truth = capture_gradients(model, _images(1), _labels(1), Protocol())
    soft = torch.tensor([[0.5, 0.3, 0.1, 0.1]])
    cfg = ReconConfig(labels="joint", label_lr=0.1, objective="l2", regularizers={}, iterations=20, progress=False)
    given = LabelResult.from_counts("m", torch.tensor([1, 0, 0, 0]), soft=soft)
    module = GradientInversion(build_problem([capture], [given], cfg), cfg)
    torch.testing.assert_close(module.current_soft()[0], soft)
    rec = reconstruct(capture, given, config=cfg)
    assert not torch.allclose(rec.labels, soft) and torch.allclose(rec.labels.sum(1), torch.ones(1))
    rnd = reconstruct(capture, None, config=dataclasses.replace(cfg, iterations=2))  # DLG: random start
    assert rnd.labels.shape == (1, C)


# ------------------------------------------------------------------------------------------ eq. 8
def test_match_weights_apply_alpha_to_the_last_layer_only():
    cfg = ReconConfig(last_layer_weight=2.0, layer_weights={"body.0.weight": 0.5, "fc.bias": 3.0})
    w = match_weights(["body.0.weight", "body.0.bias", "fc.weight", "fc.bias"], cfg)
    assert w == {"body.0.weight": 0.5, "body.0.bias": 1.0, "fc.weight": 2.0, "fc.bias": 6.0}


def test_feature_term_alone_is_zero_at_the_true_image_and_targets_are_exact_for_one_sample():
    model = _cnn()
    x = _images(1)
    capture, truth = capture_gradients(model, x, _labels(1), Protocol())
    f_star = feature_targets(capture, _oracle(truth), truth.targets)
    torch.testing.assert_close(f_star.float(), model.features(x), rtol=1e-4, atol=1e-6)
    cfg = ReconConfig(last_layer_weight=0.0, feature_weight=2.0, objective="l2", regularizers={}, **FAST)
    module = GradientInversion(build_problem([capture], [_oracle(truth)], cfg, features=[f_star]), cfg)
    assert "fc.weight" not in module.names and "fc.bias" not in module.names  # α = 0 drops the last layer
    at_truth = module.objective(x[None])[1]["features"]
    elsewhere = module.objective(_images(1, 4)[None])[1]["features"]
    assert float(at_truth) < 1e-8 and float(elsewhere) > 1e-4
    rec = reconstruct(capture, _oracle(truth), config=cfg)  # f* derived from the capture inside
    assert rec.images.shape == (1, 3, 8, 8)


def test_feature_weight_without_a_feature_target_drops_the_term_and_says_so():
    """One rule for gi run, gi ablate and gi defend: a capture without f* (a bias-free batch of B ≥ C samples
    here: no class means, and the per-slot solve needs B ≤ C − 1) loses the feature term, and the fit's warnings
    name why."""
    model = build("cnn", C, in_shape=(3, 8, 8), seed=0, channels=(4,), hidden=8, bias_last=False)
    capture, truth = capture_gradients(model, _images(C), _labels(C), Protocol(batch_size=C))
    problem = build_problem([capture], [_oracle(truth)], ReconConfig(feature_weight=1.0, **FAST))
    assert "features" not in problem.terms and problem.features is None
    note, = problem.notes
    assert "feature_weight (β) set to 0" in note and "1 of 1" in note
    rec = reconstruct(capture, _oracle(truth), config=ReconConfig(feature_weight=1.0, **FAST))
    assert any("set to 0" in w for w in rec.history["warnings"])
    kept = build_problem([capture], [_oracle(truth)], ReconConfig(feature_weight=0.0, **FAST))
    assert kept.notes == () and "features" not in kept.terms


def test_joint_labels_use_only_a_label_free_feature_target():
    """DLG's joint labels from a random start: one sample with a last-layer bias has the label-free f* =
    ∇Wᵀ∇b/‖∇b‖² (the true features); without a bias no λ can be fitted, so the term is dropped, not guessed."""
    cfg = ReconConfig(labels="joint", feature_weight=1.0, **FAST)
    model = _cnn()
    x = _images(1)
    capture, _ = capture_gradients(model, x, _labels(1), Protocol())
    problem = build_problem([capture], [None], cfg)
    assert "features" in problem.terms and problem.notes == ()
    torch.testing.assert_close(problem.features[0].float(), model.features(x), rtol=1e-4, atol=1e-6)
    bare = build("cnn", C, in_shape=(3, 8, 8), seed=0, channels=(4,), hidden=8, bias_last=False)
    capture, _ = capture_gradients(bare, x, _labels(1), Protocol())
    problem = build_problem([capture], [None], cfg)
    assert "features" not in problem.terms and problem.notes


# ------------------------------------------------------------------------------------------ config, threads
def test_recon_config_errors_name_the_key():
    for kwargs, key in ((dict(objective="l3"), "objective"), (dict(init="zeros"), "init"),
                        (dict(labels="oracle"), "labels"), (dict(regularizers={"tvv": 1.0}), "regularizers"),
                        (dict(feature_weight=-1.0), "feature_weight"), (dict(threads=0), "threads"),
                        (dict(bn_stats="exact"), "bn_stats"), (dict(batching="pmap"), "batching"),
                        (dict(compile="fastest"), "compile.*reduce-overhead")):
        with pytest.raises(ConfigError, match=key):
            ReconConfig(**kwargs)


def test_cpu_threads_are_restored():
    before = torch.get_num_threads()
    with cpu_threads(1, _cnn(), "cpu") as n:
        assert n == 1 and torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_bad_captures_are_capture_errors():
    from gi.core.errors import CaptureError

    model = _cnn()
    capture, truth = capture_gradients(model, _images(1), _labels(1), Protocol())
    broken = Capture(capture.model_spec, capture.model_state, capture.protocol)
    with pytest.raises(CaptureError, match="exactly one"):
        reconstruct(broken, _oracle(truth), config=ReconConfig(**FAST))
    with pytest.raises(CaptureError, match="gi.Capture"):
        reconstruct({"gradients": {}}, _oracle(truth), config=ReconConfig(**FAST))


# ------------------------------------------------------------------------------------------ optimisers
def _quadratic_steps(opt_name: str, x0: torch.Tensor, scales: torch.Tensor, steps: int) -> torch.Tensor:
    from gi.attack.recon.optim import OPTIMIZERS

    x = torch.nn.Parameter(x0.clone())
    opt = OPTIMIZERS[opt_name]([{"params": [x], "lr": 1.0 if opt_name == "lbfgs" else 0.05}],
                               ReconConfig(lr=1.0 if opt_name == "lbfgs" else 0.05))
    for _ in range(steps):
        opt.zero_grad()
        (0.5 * scales * (x - 1.0).pow(2)).sum().backward()
        opt.step()
    return x.detach()


def test_optimizer_registry_minimises_a_quadratic():
    from gi.attack.recon.optim import OPTIMIZERS

    assert set(OPTIMIZERS) == {"adam", "sgd", "lbfgs"}
    x0 = torch.zeros(2, 6)
    scales = torch.linspace(0.5, 3.0, 6).expand(2, 6)
    for name, steps, tol in (("adam", 400, 1e-2), ("sgd", 400, 1e-3), ("lbfgs", 30, 1e-4)):
        assert (_quadratic_steps(name, x0, scales, steps) - 1).abs().max() < tol, name


def test_batched_lbfgs_problems_follow_their_separate_iterates():
    """Per-problem L-BFGS: optimising problems together gives each one the iterates of its own run."""
    g = torch.Generator().manual_seed(0)
    x0, scales = torch.randn(3, 5, generator=g), torch.rand(3, 5, generator=g) * 4 + 0.1
    together = _quadratic_steps("lbfgs", x0, scales, 4)
    for p in range(3):
        alone = _quadratic_steps("lbfgs", x0[p:p + 1], scales[p:p + 1], 4)
        torch.testing.assert_close(together[p:p + 1], alone, rtol=1e-6, atol=1e-7)


def test_analytic_init_starts_from_the_fcn_inversion():
    """A bias-free FCN: ``fcn_analytic.invert`` of the recovered soft label is the restart-0 initial image."""
    import labels
    from gi.analysis.metrics import psnr

    model = build("fcn4", C, in_shape=(3, 8, 8), widths=(64, 32), seed=0, norm="half")
    x = _images(1)
    soft = torch.tensor([[0.1, 0.6, 0.2, 0.1]])
    capture, truth = capture_gradients(model, x, soft, Protocol(label_aug="smoothing"))
    result = labels.recover(capture, "soft-lambda")
    cfg = ReconConfig(init="analytic", restarts=2, objective="l2", regularizers={}, iterations=1, lr=1e-6,
                      progress=False, threads=1)
    rec = reconstruct(capture, result, config=cfg)
    assert float(psnr(rec.all_images[0], x)) > 40  # restart 0 is the analytic image (one tiny step)
    assert float(psnr(rec.all_images[1], x)) < float(psnr(rec.all_images[0], x))  # restart 1 is perturbed
    bad = build("cnn", C, in_shape=(3, 8, 8), seed=0, channels=(4,), hidden=8)
    cap2, t2 = capture_gradients(bad, x, soft, Protocol())
    with pytest.raises(ConfigError, match="fully connected.*Conv2d"):  # max-pooling: not invertible
        reconstruct(cap2, _oracle(t2), config=cfg)


def test_batched_lbfgs_tests_are_relative_so_tiny_objectives_still_converge():
    """A FedAvg update's cosine distance has pixel gradients below 1e-7; torch's absolute tolerances would stop."""
    x0, scales = torch.zeros(1, 6), torch.linspace(0.5, 3.0, 6).expand(1, 6)
    tiny = _quadratic_steps("lbfgs", x0, 1e-9 * scales, 40)
    assert (tiny - 1).abs().max() < 1e-3


@pytest.mark.parametrize("kind,options", [
    ("gradient", {"features": True}),
    ("gradient", {"autograd": True}),
    ("update", {"num_samples": 2}),
])
def test_simulators_follow_the_module_to_another_device(kind, options):
    """Lightning moves the module after the simulator is built (to a GPU in real runs); parameters, buffers
    (the input normalisation) and Scaffold's history must be read where the module now is. The meta device
    stands in for CUDA here: mixing it with CPU tensors fails the same way."""
    model = build("lenet", 10, seed=0)
    names = [n for n, _ in model.named_parameters()]
    protocol = Protocol(scheme="scaffold", batch_size=1, optimizer="sgdm", momentum=0.5) if kind == "update" \
        else Protocol()
    history = {f"scaffold.c/{n}": torch.ones_like(p) for n, p in model.named_parameters()}
    simulate = SIMULATORS[kind](model, protocol, names, history=history, **options)
    model.to("meta")
    shared, _ = simulate(torch.zeros(2, 3, 32, 32, device="meta"), torch.zeros(2, 10, device="meta"))
    assert set(shared) == set(names) and all(v.device.type == "meta" for v in shared.values())


def test_bn_targets_follow_the_module_to_its_device():
    """A GPU run failed: the BN prior's targets stayed on the CPU. They are buffers now (meta device stands in)."""
    from gi.attack.recon.module import GradientInversion
    from gi.attack.recon.problem import build_problem

    model = build("resnet18", 10, seed=0)
    capture, truth = capture_gradients(model, _images(1, 0, (3, 32, 32)), _labels(1), Protocol())
    cfg = ReconConfig(objective="l2", regularizers={"bn": 1e-3}, bn_stats="running", **FAST)
    module = GradientInversion(build_problem([capture], [_oracle(truth)], cfg), cfg)
    targets = module.device_bn_targets()
    assert targets and all(m.device.type == "cpu" for m, _ in targets.values())
    module.to("meta")
    assert all(m.device.type == "meta" and v.device.type == "meta" for m, v in module.device_bn_targets().values())


def test_the_terminal_bar_is_named_after_the_stage_and_counts_iterations():
    import lightning as L

    from gi.attack.recon.api import stage_bar

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def train_dataloader(self):
            return torch.utils.data.DataLoader(torch.zeros(1000, 1), batch_size=1)

        def training_step(self, batch, idx):
            return (self.w - 1).pow(2).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    bar = stage_bar("reconstruct")
    L.Trainer(max_steps=5, max_epochs=1, logger=False, enable_checkpointing=False, enable_model_summary=False,
              callbacks=[bar]).fit(Tiny())
    assert bar.train_progress_bar.desc.startswith("reconstruct") and bar.train_progress_bar.total == 5

"""The fc-inputs attack's parts: a named layer's per-slot inputs as the feature target (``attack.feature_layer``),
the aux-span image prior and its aux-mean start, the match term's weight and the relative feature distance."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gi.attack.recon import ReconConfig, reconstruct
from gi.attack.recon.mismatch import feature_mismatch
from gi.attack.recon.module import GradientInversion
from gi.attack.recon.problem import aux_span, build_problem, feature_targets, labels_for_slots, resolve_feature_layer
from gi.attack.recon.regularizers import aux_span_distance
from gi.attack.recon.terms import Evaluation
from gi.core.errors import ConfigError
from gi.world.data import load
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import capture_gradients
from gi.world.models import build
from tests.factories import first_of_classes, oracle

FAST = dict(iterations=3, progress=False, threads=1, log_every=1)


@pytest.fixture(scope="module")
def fmnist_batch():
    """Four Fashion-MNIST test images of four different classes, the zoo's BatchNorm ReLU cnn in train mode, its
    capture and every image's true input of ``body.1`` (the first Linear: the max-pooled ReLU map)."""
    data = load("fashion-mnist")
    first: dict[int, int] = {}
    for i, y in enumerate(data.labels.tolist()):
        first.setdefault(y, i)
    idx = [first[c] for c in (7, 2, 5, 0)]
    images, labels = data.images[idx], data.labels[idx]
    model = build("cnn", 10, activation="relu", in_shape=(1, 28, 28), seed=0, batch_norm=True, channels=[16, 32],
                  hidden=64)
    capture, truth = capture_gradients(model, images, labels, Protocol(batch_size=4, model_mode="train"))
    seen: dict[str, torch.Tensor] = {}
    hook = model.body[1].register_forward_pre_hook(lambda m, a: seen.__setitem__("x", a[0].detach()))
    model.train()(images)
    hook.remove()
    return capture, truth, seen["x"].double(), data


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_a_named_layer_gives_every_slot_its_own_image_input_in_slot_order(fmnist_batch):
    capture, truth, x, _ = fmnist_batch
    assert resolve_feature_layer(capture, "first-linear") == "body.1"
    soft = labels_for_slots(oracle(truth), 4, 10)  # slots sorted by class: 0, 2, 5, 7
    rows = feature_targets(capture, oracle(truth), soft, "first-linear")
    for slot, cls in enumerate(soft.argmax(1).tolist()):
        image = truth.labels.tolist().index(cls)
        assert _rel(rows[slot], x[image]) < 1e-3, (slot, cls)
    flipped = feature_targets(capture, oracle(truth), soft.flip(0), "body.1")  # the rows follow the slots
    assert _rel(flipped, rows.flip(0)) < 1e-6
    joint = feature_targets(capture, None, None, "body.1")  # no labels: the inputs, in the order found
    assert all(min(_rel(r, x[i]) for i in range(4)) < 1e-3 for r in joint)


def test_one_sample_layer_input_is_the_bias_ratio_and_misfits_are_none(fmnist_batch):
    capture, truth, x, data = fmnist_batch
    model = build("cnn", 10, activation="relu", in_shape=(1, 28, 28), seed=0, channels=[4], hidden=8)
    one, t1 = capture_gradients(model, data.images[:1], data.labels[:1], Protocol())
    seen: dict[str, torch.Tensor] = {}
    hook = model.body[1].register_forward_pre_hook(lambda m, a: seen.__setitem__("x", a[0].detach()))
    model(data.images[:1])
    hook.remove()
    got = feature_targets(one, oracle(t1), labels_for_slots(oracle(t1), 1, 10), "body.1")
    assert _rel(got, seen["x"].double()) < 1e-4
    bare = build("cnn", 10, activation="relu", in_shape=(1, 28, 28), seed=0, channels=[4], hidden=8, bias_last=False)
    nb, tb = capture_gradients(bare, data.images[:10], data.labels[:10], Protocol(batch_size=10))
    assert feature_targets(nb, oracle(tb), labels_for_slots(oracle(tb), 10, 10), "fc") is None  # no bias, B = C
    with pytest.raises(ConfigError, match=r"attack.feature_layer='body.9' is no module .*first-linear.*body.1"):
        resolve_feature_layer(capture, "body.9")


def test_aux_span_is_the_distance_from_the_aux_images_affine_span():
    g = torch.Generator().manual_seed(0)
    aux = torch.rand(6, 1, 4, 4, generator=g)
    mu, basis = aux_span(aux, 3)
    assert basis.shape == (3, 16) and torch.allclose(basis @ basis.T, torch.eye(3), atol=1e-5)
    assert torch.allclose(mu, aux.flatten(1).mean(0))
    inside = (mu + torch.tensor([0.3, -0.2, 0.1]) @ basis).view(1, 1, 1, 4, 4)
    ev = Evaluation(device_aux_span=(mu, basis))
    assert float(aux_span_distance(inside, ev)) < 1e-10
    e = torch.randn(16, generator=g)
    e = e - (e @ basis.T) @ basis  # orthogonal to the span
    assert float(aux_span_distance(inside + e.view(1, 1, 1, 4, 4), ev)) == pytest.approx(float(e @ e), rel=1e-4)
    assert aux_span(aux, 50)[1].shape == (6, 16)  # never more directions than images
    with pytest.raises(ConfigError, match="aux images"):
        aux_span_distance(inside, Evaluation())


def test_aux_mean_start_and_the_prior_need_aux_images(fmnist_batch):
    capture, truth, _, data = fmnist_batch
    aux = data.images[100:110]
    cfg = ReconConfig(init="aux-mean", regularizers={"aux-span": 1.0}, **FAST)
    problem = build_problem([capture], [oracle(truth)], cfg, aux_images=aux)
    module = GradientInversion(problem, cfg)
    assert torch.allclose(module.images[0], aux.mean(0).expand(4, 1, 28, 28), atol=1e-6)
    with pytest.raises(ConfigError, match="aux.per_class > 0"):
        build_problem([capture], [oracle(truth)], cfg)
    with pytest.raises(ConfigError, match="aux images are"):
        build_problem([capture], [oracle(truth)], cfg, aux_images=torch.rand(5, 3, 8, 8))


def test_match_weight_zero_fits_the_features_alone_and_falls_back_without_them(fmnist_batch):
    capture, truth, x, data = fmnist_batch
    cfg = ReconConfig(match_weight=0.0, feature_weight=1.0, feature_layer="first-linear", feature_relative=True,
                      objective="l2", **FAST)
    problem = build_problem([capture], [oracle(truth)], cfg)
    assert problem.matched == [] and "match" not in problem.terms and problem.feature_layer == "body.1"
    module = GradientInversion(problem, cfg)
    images = torch.rand(1, 4, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    _, parts = module.objective(images)
    seen: dict[str, torch.Tensor] = {}
    net = problem.model
    hook = net.get_submodule("body.1").register_forward_pre_hook(lambda m, a: seen.__setitem__("f", a[0]))
    net(images[0])
    hook.remove()
    target = problem.features[0].float()
    want = ((seen["f"] - target) ** 2).sum() / (target ** 2).sum()  # relative: ‖f − f*‖² / ‖f*‖²
    assert float(parts["features"]) == pytest.approx(float(want), rel=1e-4)
    rec = reconstruct(capture, oracle(truth), config=cfg)  # forward passes only, no gradient simulated
    assert rec.images.shape == (4, 1, 28, 28)
    bare = ReconConfig(match_weight=0.0, feature_weight=1.0, feature_layer="fc", **FAST)  # B = C, no bias: no f*
    upd, tu = capture_gradients(build("cnn", 10, activation="relu", in_shape=(1, 28, 28), seed=0, channels=[4],
                                      hidden=8, bias_last=False), data.images[:10], data.labels[:10],
                                Protocol(batch_size=10))
    fallback = build_problem([upd], [oracle(tu)], bare)
    assert "match" in fallback.terms and "features" not in fallback.terms
    assert "match_weight 0 → 1" in fallback.notes[0]
    with pytest.raises(ConfigError, match="nothing of the capture to match"):
        ReconConfig(match_weight=0.0, feature_weight=0.0)
    with pytest.raises(ConfigError, match="aux_rank"):
        ReconConfig(aux_rank=0)


def test_a_run_config_asking_for_the_aux_prior_without_aux_data_fails_at_load():
    from gi.core.config import load
    from gi.experiments.config.run import RunConfig

    with pytest.raises(ConfigError, match=r"aux-span and attack.init=aux-mean .*set aux.per_class > 0"):
        load(RunConfig, "configs/demo.yaml", ["attack.preset=fc-inputs"])
    cfg = load(RunConfig, "configs/demo.yaml", ["attack.preset=fc-inputs", "aux.per_class=5"])
    assert cfg.attack.init == "aux-mean" and cfg.attack.regularizers == {"aux-span": 1.0}


def test_feature_mismatch_is_zero_for_the_true_images_and_large_for_a_flat_one(fmnist_batch):
    """‖f(x̂) − f*‖ / ‖f*‖ at body.1, the batch forwarded together in train mode (BatchNorm sees the batch)."""
    capture, truth, x, _ = fmnist_batch
    assert feature_mismatch(capture, truth.images, x, "body.1") < 1e-5
    assert feature_mismatch(capture, truth.images.flip(0), x, "body.1") > 0.3  # the slots' order matters
    grey = torch.full_like(truth.images, 0.5)
    assert feature_mismatch(capture, grey, x, "body.1") > 0.3


def test_each_slot_is_judged_against_its_own_target_only():
    """Per slot ‖f_i(x̂) − f*_i‖ / ‖f*_i‖ on a net without normalisation (the slots do not interact): the true
    images reproduce every target exactly; a grey image in slot 2 spoils slot 2 and no other; the pooled ratio is
    the root of the slots' squared errors over the targets' total."""
    from gi.attack.recon.mismatch import feature_mismatches

    capture, truth, _ = _round()
    model = capture.model()
    with torch.no_grad():
        target = model.body[0](model.normalize(truth.images))
    pooled, slots = feature_mismatches(capture, truth.images, target, "body.1")
    assert pooled == 0.0 and slots == [0.0] * 6
    spoiled = truth.images.clone()
    spoiled[2] = 0.5
    pooled, slots = feature_mismatches(capture, spoiled, target, "body.1")
    assert slots[2] > 0.3 and slots[:2] + slots[3:] == [0.0] * 5
    share = float(target[2].double().norm() / target.double().norm())
    assert pooled == pytest.approx(slots[2] * share, rel=1e-9)


def _round(momentum: float = 0.0):
    """A FedAvg client's round: six Fashion-MNIST images of six classes, one epoch of three SGD steps of two, on a
    ReLU cnn without normalisation; the capture, its truth and every image's input of ``body.1`` at the parameters
    of the step that saw it (the client's order replayed with torch.optim.SGD: the generator's first permutation)."""
    from gi.world.fl.victim import simulate_client

    images, labels = first_of_classes()
    model = build("cnn", 10, activation="relu", in_shape=(1, 28, 28), seed=0, channels=[16, 32], hidden=64)
    protocol = Protocol(scheme="fedavg", num_samples=6, batch_size=2, lr=0.01, momentum=momentum)
    capture, truth = simulate_client(model, (images, labels), protocol, rng=torch.Generator().manual_seed(0))
    order = torch.randperm(6, generator=torch.Generator().manual_seed(0))
    replay = build("cnn", 10, activation="relu", in_shape=(1, 28, 28), seed=0, channels=[16, 32], hidden=64)
    sgd = torch.optim.SGD(replay.parameters(), lr=0.01)
    x = torch.zeros(6, 32 * 7 * 7, dtype=torch.float64)
    for step in order.view(3, 2):
        with torch.no_grad():
            x[step] = replay.body[0](replay.normalize(images[step])).double()
        sgd.zero_grad()
        torch.nn.functional.cross_entropy(replay(images[step]), labels[step]).backward()
        sgd.step()
    assert all(torch.allclose(replay.state_dict()[k] - v, capture.update[k], atol=1e-6)
               for k, v in model.state_dict().items() if k in capture.update)  # the replay is the client's round
    return capture, truth, x


def test_a_plain_sgd_round_gives_every_slot_its_input_and_other_optimisers_none():
    from gi.world.fl.local import sums_gradients

    capture, truth, x = _round()
    assert sums_gradients(capture.protocol) and capture.num_samples == 6
    soft = labels_for_slots(oracle(truth), 6, 10)
    rows = feature_targets(capture, oracle(truth), soft, "first-linear")
    for slot, cls in enumerate(soft.argmax(1).tolist()):  # each slot's row: its image's input where it was seen
        image = truth.labels.tolist().index(cls)  # (measured ≤ 3e-4 from the float32 update; other images > 0.5)
        assert _rel(rows[slot], x[image]) < 1e-2, (slot, cls)
    momentum, mt, _ = _round(momentum=0.9)
    assert not sums_gradients(momentum.protocol)
    assert feature_targets(momentum, oracle(mt), soft, "first-linear") is None  # not a sum of gradients


def test_where_the_cone_programs_fall_short_the_round_takes_the_pursuit(monkeypatch):
    import fcn_analytic.disaggregate as disaggregate
    from gi.attack.recon.problem import input_search, layer_inputs

    def short(*args, **kwargs):
        raise disaggregate.GIError("linear_inputs: 4 of 6 inputs found")

    capture, truth, x = _round()
    monkeypatch.setattr(disaggregate, "linear_inputs", short)
    soft = labels_for_slots(oracle(truth), 6, 10)
    rows = layer_inputs(capture, "body.1", soft, seed=11)  # a seed no other test searched with (one search each)
    assert input_search(capture, "body.1") == ("pursued_inputs", 6)
    for slot, cls in enumerate(soft.argmax(1).tolist()):
        assert _rel(rows[slot], x[truth.labels.tolist().index(cls)]) < 1e-2, (slot, cls)


def test_an_update_problem_that_matches_no_layer_runs_the_forward_pass_alone():
    from gi.attack.recon.simulate import update_simulator

    capture, truth, x = _round()
    model = capture.model()
    simulate = update_simulator(model, capture.protocol, [], num_samples=6, features=True, feature_layer="body.1")
    shared, features = simulate(truth.images, truth.targets)
    with torch.no_grad():
        expect = model.body[0](model.normalize(truth.images))
    assert shared == {} and torch.allclose(features, expect)


def test_a_multi_epoch_round_refreshes_each_slot_target_from_its_images_zeros():
    """Over E = 3 epochs the visits of an image differ by the drift, so the feature stage's inputs are approximate;
    the refresh replaces each slot's target by the row-space direction that vanishes where the slot's image's input
    does: with the true images, each image's input at the global model (measured: cosine 0.9994 or more to its own
    image, at most 0.87 to another; the feature maps of two images of this net are that alike)."""
    capture, truth, model = _refreshing_round()
    with torch.no_grad():
        x0 = model.body[0](model.normalize(truth.images)).double()
    cfg = ReconConfig(match_weight=0.0, feature_weight=1.0, feature_layer="first-linear", feature_relative=True,
                      objective="l2", feature_refresh=10, **FAST)
    problem = build_problem([capture], [oracle(truth)], cfg)
    assert problem.feature_basis is not None and problem.feature_basis[0].shape[1] == 18  # 3 visits of 6 images
    module = GradientInversion(problem, cfg)
    with torch.no_grad():
        module.images.copy_(truth.images[None])
    before = module.feature_target.clone()
    module.refresh_features()
    after = module.feature_target[0].double()
    cos = torch.nn.functional.normalize(after, dim=1) @ torch.nn.functional.normalize(x0, dim=1).T
    assert bool((cos.diagonal() > 0.99).all()) and float((cos - 2 * torch.eye(6)).max()) < 0.9
    assert not torch.equal(after, before[0].double())
    one_epoch = build_problem([_round()[0]], [oracle(_round()[1])], cfg)
    assert one_epoch.feature_basis is None  # one epoch: the inputs are exact, nothing to refresh
    with pytest.raises(ConfigError, match="feature_refresh"):
        ReconConfig(feature_refresh=-1)


def _refreshing_round():
    """A 6-image client over E = 3 epochs (the feature stage's inputs approximate, so the fit refreshes them): its
    capture, truth and the global model."""
    from gi.world.fl.victim import simulate_client

    images, labels = first_of_classes((7, 2, 5, 0, 9, 3))
    model = build("cnn", 10, activation="relu", in_shape=(1, 28, 28), seed=0, channels=[16, 32], hidden=64)
    protocol = Protocol(scheme="fedavg", num_samples=6, batch_size=2, lr=0.01, local_epochs=3)
    capture, truth = simulate_client(model, (images, labels), protocol, rng=torch.Generator().manual_seed(0))
    return capture, truth, model


def _rates(module: GradientInversion, steps: int) -> list[float]:
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    sched = module._schedule(opt)
    rates = []
    for _ in range(steps):
        rates.append(round(opt.param_groups[0]["lr"], 12))
        opt.step()
        sched.step()
    return rates


def test_the_cycled_schedule_restarts_the_multistep_steps_at_every_refresh():
    """``multistep-cycle``: Inverting Gradients' ×0.1 at 3/8, 5/8 and 7/8 of every ``feature_refresh`` period where
    the fit refreshes its targets; without a refresh (one epoch: exact inputs), ``multistep`` over the run."""
    cfg = ReconConfig(match_weight=0.0, feature_weight=1.0, feature_layer="first-linear", feature_relative=True,
                      objective="l2", feature_refresh=8, schedule="multistep-cycle", **{**FAST, "iterations": 24})
    capture, truth, _ = _refreshing_round()
    cycled = _rates(GradientInversion(build_problem([capture], [oracle(truth)], cfg), cfg), 24)
    period = [1.0] * 3 + [0.1] * 2 + [0.01] * 2 + [0.001]
    assert cycled == period * 3
    once = GradientInversion(build_problem([_round()[0]], [oracle(_round()[1])], cfg), cfg)
    plain = dataclasses.replace(cfg, schedule="multistep")
    assert _rates(once, 24) == _rates(GradientInversion(once.problem, plain), 24) == \
        [1.0] * 9 + [0.1] * 6 + [0.01] * 6 + [0.001] * 3

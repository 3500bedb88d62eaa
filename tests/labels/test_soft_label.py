"""Soft-label recovery (Wang, Liang & He 2024, §3): exact cases, Theorem 1, corner cases, clear errors."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import labels
from gi.capture import Capture
from gi.core.errors import CaptureError, ConfigError
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import capture_gradients
from gi.world.models import build
from labels import soft_label as sl

C = 10


def _linear(bias: bool = False, seed: int = 0, shape=(1, 6, 6), double: bool = True):
    model = build("linear", C, in_shape=shape, bias_last=bias, seed=seed)
    return model.double() if double else model


def _capture(model, target: torch.Tensor, seed: int = 0, aug: str = "smoothing", **proto) -> tuple[Capture, object]:
    g = torch.Generator().manual_seed(seed)
    shape = tuple(model.spec["in_shape"])
    x = torch.rand((1, *shape), generator=g, dtype=next(model.parameters()).dtype)
    return capture_gradients(model, x, target.reshape(1, -1).to(x.dtype), Protocol(label_aug=aug, **proto))


def _smooth(label: int, eps: float) -> torch.Tensor:
    """Smoothed label; tests pick ε = 10·2^-k so every entry is exact in float32 and the label sums to 1 exactly
    (capture_gradients stores float32 targets, and a sum off by 1e-8 would break Theorem 1 by as much)."""
    y = torch.full((C,), eps / C, dtype=torch.float64)
    y[label] += 1 - eps
    return y


def _mix(a: int, b: int, lam: float) -> torch.Tensor:
    y = torch.zeros(C, dtype=torch.float64)
    y[a] += 1 - lam
    y[b] += lam
    return y


@pytest.mark.parametrize("eps", [0.078125, 0.15625, 0.3125])
def test_exact_smoothing_on_linear_softmax(eps):
    model = _linear()
    capture, truth = _capture(model, _smooth(3, eps))
    r = labels.recover(capture, "soft-lambda")
    assert r.ok and r.info["stage"] == "grid" and r.info["loss"] < sl.THRESHOLD
    torch.testing.assert_close(r.soft, truth.targets.double(), atol=1e-9, rtol=0)
    assert int(r.counts.argmax()) == 3 and int(r.counts.sum()) == 1
    x = model.features(truth.images).double()  # the normalised pixels are the last-layer input
    torch.testing.assert_close(r.features, x, atol=1e-9, rtol=1e-9)
    # λ* = 1/δ_r with δ = p − y (eq. 3)
    p = torch.softmax(model(truth.images), 1)[0]
    assert r.info["lambda"] == pytest.approx(1 / float(p[r.info["row"]] - truth.targets[0, r.info["row"]]), rel=1e-9)


def test_exact_mixup_and_onehot_on_linear_softmax():
    model = _linear(seed=1)
    capture, truth = _capture(model, _mix(2, 7, 0.375), aug="mixup")
    r = labels.recover(capture, "soft-lambda")
    assert r.ok and r.info["kind"] == "mixup"
    torch.testing.assert_close(r.soft, truth.targets.double(), atol=1e-9, rtol=0)
    capture, truth = _capture(model, _smooth(5, 0.0), aug="onehot")
    r = labels.recover(capture, "soft-lambda")
    assert r.ok and r.info["kind"] == "onehot" and int(r.counts.argmax()) == 5
    torch.testing.assert_close(r.soft, truth.targets.double(), atol=1e-9, rtol=0)


def test_temperature_and_kind_auto():
    model = _linear(seed=2)
    capture, truth = _capture(model, _smooth(1, 0.3125), temperature=2.5)
    r = labels.recover(capture, "soft-lambda", kind="auto")
    assert r.ok and r.info["kind"] == "smoothing"  # the most restrictive kind that fits
    torch.testing.assert_close(r.soft, truth.targets.double(), atol=1e-9, rtol=0)
    capture, truth = _capture(model, _mix(4, 8, 0.625), aug="onehot")  # protocol says one-hot, data is mixup
    assert labels.recover(capture, "soft-lambda").ok is False
    r = labels.recover(capture, "soft-lambda", kind="auto")
    assert r.ok and r.info["kind"] == "mixup"
    torch.testing.assert_close(r.soft, truth.targets.double(), atol=1e-9, rtol=0)


@settings(max_examples=40, deadline=None)
@given(lam=st.floats(0.01, 1e4) | st.floats(-1e4, -0.01), seed=st.integers(0, 2**16),
       eps=st.floats(0.0, 0.5), bias=st.booleans())
def test_theorem1_pseudo_label_sums_to_one(lam, seed, eps, bias):
    """Theorem 1: Σ_i ŷ_i(λ) = 1 for every λ and every row (exact float64 gradient)."""
    model = _linear(bias=bias, seed=seed % 97)
    capture, _ = _capture(model, _smooth(seed % C, eps), seed=seed)
    prob, _, _ = sl._problem([sl._read(capture)], "smoothing")
    yhat = sl.pseudo_label(torch.tensor([[lam]], dtype=torch.float64), prob)
    assert float(yhat.sum()) == pytest.approx(1.0, abs=1e-9 * max(1.0, 1 / abs(lam)))


def test_bias_route_equals_lambda_route():
    model = _linear(bias=True, seed=3)
    capture, truth = _capture(model, _smooth(6, 0.15625))
    by_bias = labels.recover(capture, "soft-lambda")
    by_lambda = labels.recover(capture, "soft-lambda", route="lambda")
    assert by_bias.info["route"] == "bias" and by_lambda.info["route"] == "lambda"
    assert by_bias.ok and by_lambda.ok
    torch.testing.assert_close(by_bias.soft, truth.targets.double(), atol=1e-9, rtol=0)
    torch.testing.assert_close(by_lambda.soft, by_bias.soft, atol=1e-9, rtol=0)
    torch.testing.assert_close(by_lambda.features, by_bias.features, atol=1e-9, rtol=1e-9)
    assert by_lambda.info["lambda"] == pytest.approx(by_bias.info["lambda"], rel=1e-9)
    no_bias = _capture(_linear(seed=3), _smooth(6, 0.15625))[0]
    assert labels.recover(no_bias, "soft-lambda", route="bias").ok is False


def test_batch_form_equals_single_form():
    model = build("lenet", C, init="uniform", bias_last=False, seed=4)
    g = torch.Generator().manual_seed(0)
    caps = []
    for i in range(6):
        x = torch.rand(1, 3, 32, 32, generator=g)
        y = _smooth(i, 0.1 * i) if i % 2 else _mix(i, (i + 3) % C, 0.2 + 0.1 * i)
        caps.append(capture_gradients(model, x, y[None].float(), Protocol(label_aug="smoothing" if i % 2 else
                                                                          "mixup"))[0])
    many = labels.recover_many(caps, "soft-lambda")
    assert "soft-lambda" in labels.BATCH_METHODS
    for cap, batch_result in zip(caps, many):
        single = labels.recover(cap, "soft-lambda")
        assert single.ok and batch_result.ok
        # same λ up to float rounding (batched einsum sums in another order)
        assert single.info["lambda"] == pytest.approx(batch_result.info["lambda"], rel=1e-9)
        assert single.info["stage"] == batch_result.info["stage"]
        torch.testing.assert_close(single.soft, batch_result.soft, atol=1e-10, rtol=0)
        torch.testing.assert_close(single.features, batch_result.features, atol=1e-10, rtol=1e-9)


def test_untrained_lenet_float32_captures():
    """The paper's setting: DLG LeNet with U(−0.5, 0.5) init, bias-free fc, float32 gradients."""
    model = build("lenet", C, init="uniform", bias_last=False, seed=5)
    g = torch.Generator().manual_seed(1)
    for i in range(5):
        x = torch.rand(1, 3, 32, 32, generator=g)
        y = _smooth(i, float(torch.rand(1, generator=g)) * 0.5)
        cap, truth = capture_gradients(model, x, y[None].float(), Protocol(label_aug="smoothing"))
        r = labels.recover(cap, "soft-lambda")
        assert r.ok and float((r.soft - truth.targets.double()).abs().sum()) < 1e-4


@pytest.mark.parametrize("stage", ["pso", "lbfgs"])
def test_paper_stages_alone(stage):
    """The paper's own searches: the particle swarm over its windows and the reference L-BFGS."""
    model = _linear(seed=6)
    capture, truth = _capture(model, _smooth(0, 0.3125))
    r = labels.recover(capture, "soft-lambda", stages=[stage], pso={"pop": 200, "iters": 30})
    assert r.ok and r.info["stage"] == stage
    torch.testing.assert_close(r.soft, truth.targets.double(), atol=1e-6, rtol=0)


def test_reference_column_ratio_agrees_on_exact_gradients():
    """ρ from the reference's single column equals the least-squares ρ when the gradient is exactly rank one."""
    model = _linear(seed=11)
    capture, truth = _capture(model, _smooth(4, 0.15625))
    r = labels.recover(capture, "soft-lambda", ratio="column")
    assert r.ok
    torch.testing.assert_close(r.soft, truth.targets.double(), atol=1e-9, rtol=0)


def test_pso_windows_match_the_reference_log():
    wins = sl.pso_windows(coe=1.0, interval=50.0, bound=70.0)
    expected = [(0.7, 6), (-6.3, -1), (5.7, 16), (-16.3, -6), (15.7, 66), (-66.3, -16)]
    assert [tuple(round(v, 6) for v in w) for w in wins] == expected


def test_zero_gradient_is_a_failure():
    capture, _ = _capture(_linear(), _smooth(0, 0.1))
    capture.gradients = {k: torch.zeros_like(v) for k, v in capture.gradients.items()}
    r = labels.recover(capture, "soft-lambda")
    assert not r.ok and "zero" in r.info["reason"] and int(r.counts.sum()) == 0


def test_out_of_bound_is_a_failure():
    model = _linear(seed=7)
    capture, _ = _capture(model, _smooth(2, 0.2))
    r = labels.recover(capture, "soft-lambda")
    assert r.ok and abs(r.info["lambda"]) > 1.2
    bounded = labels.recover(capture, "soft-lambda", bound=1.2, stages=["grid"])
    assert not bounded.ok and "bound" in bounded.info["reason"]


def _hand_capture(gw: torch.Tensor, w: torch.Tensor, aug: str = "onehot") -> Capture:
    """A bias-free capture with a hand-made last-layer gradient."""
    model = build("linear", gw.shape[0], in_shape=(1, 1, gw.shape[1]), bias_last=False, seed=0)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["fc.weight"] = w.float()
    return Capture(model_spec=dict(model.spec), model_state=state, protocol=Protocol(label_aug=aug),
                   gradients={"fc.weight": gw.float()}, meta={"num_samples": 1})


def test_saturated_predict_correct_onehot_returns_the_prediction():
    """Appendix B.3, first case: p_i rounds to 1 = y_i, so row i of ∇W is exactly zero."""
    x = torch.rand(8, generator=torch.Generator().manual_seed(0)) + 0.1
    p = torch.full((C,), 1e-9, dtype=torch.float64)
    gw = p[:, None] * x[None].double()
    gw[4] = 0.0
    w = torch.zeros(C, 8)
    w[4] = 5.0  # the model predicts class 4 on any positive feature
    r = labels.recover(_hand_capture(gw, w), "soft-lambda")
    assert r.ok and r.info["stage"] == "saturated-onehot" and int(r.counts.argmax()) == 4


@pytest.mark.parametrize("nonneg", [True, False])
def test_onehot_swap_corner_case(nonneg):
    """Appendix B.3, second case: p_i = 1 and y_j = 1, so ∇W_i = −∇W_j and λ = ±1 both give a one-hot
    label. Non-negative features (every entry of g_r one sign) decide it; mixed signs are ambiguous."""
    g = torch.Generator().manual_seed(1)
    x = torch.rand(8, generator=g, dtype=torch.float64) + 0.1
    if not nonneg:
        x[::2] *= -1
    i, j = 2, 7
    w = torch.zeros(C, 8, dtype=torch.float64)
    w[i], w[j] = 60 * x / x.dot(x), -60 * x / x.dot(x)  # z_i = 60, z_j = −60: p = e_i at λ=1, e_j at λ=−1
    delta = torch.softmax(w @ x, 0) - torch.nn.functional.one_hot(torch.tensor(j), C).double()
    r = labels.recover(_hand_capture(delta[:, None] * x[None], w), "soft-lambda")
    if nonneg:
        assert r.ok and int(r.counts.argmax()) == j
    else:
        assert not r.ok and "B.3" in r.info["reason"]


def test_multi_sample_capture_and_unsupported_loss_fail_cleanly():
    model = _linear(seed=8)
    x = torch.rand(2, 1, 6, 6, dtype=torch.float64)
    cap, _ = capture_gradients(model, x, torch.tensor([1, 2]), Protocol(batch_size=2))
    r = labels.recover(cap, "soft-lambda")
    assert not r.ok and "one sample" in r.info["reason"]
    cap, _ = _capture(model, _smooth(0, 0.1), loss="focal", focal_gamma=2.0)
    r = labels.recover(cap, "soft-lambda")
    assert not r.ok and "focal" in r.info["reason"]


def test_mismatched_or_broken_capture_raises():
    capture, _ = _capture(_linear(), _smooth(0, 0.1))
    bad = Capture(capture.model_spec, capture.model_state, capture.protocol,
                  gradients={"fc.weight": torch.zeros(C + 1, 36)}, meta=capture.meta)
    with pytest.raises(CaptureError, match="capture and model differ"):
        labels.recover(bad, "soft-lambda")
    nan = Capture(capture.model_spec, capture.model_state, capture.protocol,
                  gradients={"fc.weight": torch.full((C, 36), math.nan)}, meta=capture.meta)
    with pytest.raises(CaptureError, match="NaN"):
        labels.recover(nan, "soft-lambda")
    with pytest.raises(CaptureError, match="gi.Capture"):
        labels.recover_many([object()], "soft-lambda")


@pytest.mark.parametrize("options", [{"kind": "cutmix"}, {"route": "magic"}, {"stages": ["adam"]},
                                     {"accept": "any"}, {"pso": {"swarm": 3}}, {"bound": 0.5}, {"ratio": "mean"}])
def test_bad_options_raise_config_error(options):
    capture, _ = _capture(_linear(), _smooth(0, 0.1))
    with pytest.raises(ConfigError):
        labels.recover(capture, "soft-lambda", **options)


def test_accept_lowest_keeps_a_noisy_answer():
    """§5.2: with noisy gradients no λ reaches the threshold; ``accept='lowest'`` still answers."""
    model = _linear(seed=9)
    capture, truth = _capture(model, _smooth(3, 0.2))
    g = torch.Generator().manual_seed(0)
    capture.gradients["fc.weight"] += 1e-3 * torch.randn(capture.gradients["fc.weight"].shape, generator=g,
                                                         dtype=torch.float64)
    strict = labels.recover(capture, "soft-lambda")
    lowest = labels.recover(capture, "soft-lambda", accept="lowest")
    assert not strict.ok and lowest.ok and not lowest.info["converged"]
    assert int(lowest.counts.argmax()) == 3 and float((lowest.soft - truth.targets).abs().sum()) < 0.05


def test_fit_lambda_reproduces_the_feature_from_a_soft_label():
    model = _linear(seed=10)
    capture, truth = _capture(model, _smooth(8, 0.3125))
    r = labels.recover(capture, "soft-lambda")
    lam, loss = sl.fit_lambda(capture, truth.targets[0])
    assert loss < 1e-12 and lam == pytest.approx(r.info["lambda"], rel=1e-8)


def test_single_sample_scenario_end_to_end():
    """Real CIFAR-10 samples through the benchmark scenario: smoothing ε ~ U(0, 0.5) and mixup of two classes."""
    from gi.analysis.metrics import label_metrics
    from gi.world.scenarios import get_scenario

    scenario = get_scenario("single-sample")
    for aug in ("smoothing", "mixup"):
        setup = {"samples": 6, "shared": "last", "label_aug": aug,
                 "model": {"name": "lenet", "init": "uniform", "bias_last": False}}
        trials = scenario(setup, torch.Generator().manual_seed(0), 0)
        assert len(trials) == 6 and trials[0].group == f"lenet/untrained/{aug}"
        assert all(t.capture.model_state is trials[0].capture.model_state for t in trials)  # one shared state
        targets = torch.cat([t.truth.targets for t in trials])
        if aug == "mixup":
            assert bool(((targets > 0).sum(1) == 2).all())  # two different classes per sample
        else:
            eps = torch.tensor([t.truth.meta["eps"] for t in trials])
            assert bool((eps >= 0).all() and (eps <= 0.5).all())
        results = labels.recover_many([t.capture for t in trials], "soft-lambda")
        for r, t in zip(results, trials):
            m = label_metrics(r, t.truth)
            assert m["ok"] == 1.0 and m["top1"] == 1.0 and m["soft_l1"] < 1e-4


def test_single_sample_scenario_noise_and_errors():
    from gi.world.scenarios import get_scenario

    scenario = get_scenario("single-sample")
    base = {"samples": 3, "shared": "last", "model": {"name": "lenet", "bias_last": False, "seed": 1}}
    clean = scenario(base, torch.Generator().manual_seed(0), 0)
    for kind in ("gaussian", "laplace"):
        noisy = scenario({**base, "noise": {"kind": kind, "variance": 0.25}}, torch.Generator().manual_seed(0), 0)
        diff = torch.cat([(n.capture.gradients["fc.weight"] - c.capture.gradients["fc.weight"]).flatten()
                          for n, c in zip(noisy, clean)])
        assert float(diff.var()) == pytest.approx(0.25, rel=0.1)
        assert noisy[0].truth.meta["noise"] == {"kind": kind, "variance": 0.25}
    with pytest.raises(ConfigError, match="unknown key"):
        scenario({**base, "epsilon": [0, 1]}, torch.Generator(), 0)
    with pytest.raises(ConfigError, match="label_aug"):
        scenario({**base, "label_aug": "cutmix"}, torch.Generator(), 0)


def test_onehot_beyond_the_bound_returns_the_prediction():
    """Appendix B.2–B.3: a confident, correct one-hot sample has λ* = 1/(p_y − 1) far out; when it lies beyond the
    bound the loss keeps falling towards the bound on the non-negative-feature side and the label is the model's
    prediction."""
    model = build("linear", C, in_shape=(1, 6, 6), bias_last=False, norm="none", seed=12).double()
    x = torch.rand(1, 1, 6, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    with torch.no_grad():
        model.fc.weight.mul_(8.0)
        label = int(model(x).argmax())
    cap, _ = capture_gradients(model, x, torch.tensor([label]), Protocol(label_aug="onehot"))
    full = labels.recover(cap, "soft-lambda")
    assert full.ok and full.info["stage"] == "grid" and abs(full.info["lambda"]) > 3
    r = labels.recover(cap, "soft-lambda", bound=2.0)
    assert r.ok and r.info["stage"] == "prediction" and int(r.counts.argmax()) == label and r.features is None

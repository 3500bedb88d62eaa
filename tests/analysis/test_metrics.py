"""Tests of gi.analysis.metrics and gi.analysis.lpips_offline: closed-form cases, LPIPS reference values, matching,
label metrics."""

from __future__ import annotations

import math
import os
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torchvision.io import read_image

from gi.analysis import lpips_offline
from gi.analysis.metrics import (
    label_metrics,
    label_metrics_from_counts,
    lpips,
    match_images,
    pairwise_lpips,
    psnr,
    score,
    ssim,
    summarize,
)
from gi.capture import Truth
from gi.core.errors import ConfigError
from gi.world.assets import foolbox_samples_dir
from labels.base import LabelResult


def _png(name: str) -> torch.Tensor:
    return read_image(str(foolbox_samples_dir() / name)).float()[None] / 255


@pytest.fixture(scope="module")
def cifar() -> torch.Tensor:
    """Six real CIFAR-10 images (foolbox samples), (6, 3, 32, 32) in [0, 1]."""
    names = sorted(p.name for p in foolbox_samples_dir().glob("cifar10_0*.png"))[:6]
    return torch.cat([_png(n) for n in names])


# ------------------------------------------------ LPIPS reference values (docs/architecture.md, "Conventions")


@pytest.mark.parametrize("net, other, expected", [
    ("alex", "img01", 0.19433), ("alex", "hflip", 0.06900), ("alex", "same", 0.0),
    ("vgg", "img01", 0.60102), ("vgg", "hflip", 0.35280), ("vgg", "same", 0.0),
])
def test_lpips_reference_values(net: str, other: str, expected: float) -> None:
    img00 = _png("cifar10_00_3.png")
    second = {"img01": _png("cifar10_01_8.png"), "hflip": img00.flip(-1), "same": img00.clone()}[other]
    value = float(lpips(img00, second, net))
    assert value == pytest.approx(expected, abs=1e-4)


def test_lpips_never_touches_torch_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*args, **kwargs):
        raise AssertionError("torch hub download attempted")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", no_network)
    monkeypatch.setattr(torch.hub, "download_url_to_file", no_network)
    model = lpips_offline.build_lpips("alex")
    assert model.lins[0].model[-1].weight.abs().sum() > 0


def test_lpips_cache_per_net_and_device() -> None:
    assert lpips_offline.get_lpips("alex", "cpu") is lpips_offline.get_lpips("alex", torch.device("cpu"))
    assert lpips_offline.get_lpips("alex") is not lpips_offline.get_lpips("vgg")


def test_backbone_weights_are_transposed_to_torch_layout() -> None:
    state = lpips_offline.backbone_state("alex")
    assert sorted(state) == [0, 3, 6, 8, 10]
    assert state[0][0].shape == (64, 3, 11, 11) and state[3][0].shape == (192, 64, 5, 5)
    raw = lpips_offline.load_numpy_pickle(lpips_offline.lpips_backbone_file("alex"))["AlexNet_0"]["Conv_1"]["kernel"]
    assert float(state[3][0][7, 5, 1, 2]) == float(raw[1, 2, 5, 7])  # (out, in, h, w) <- (h, w, in, out)


def test_lpips_grey_and_small_images() -> None:
    gen = torch.Generator().manual_seed(0)
    a, b = torch.rand(2, 1, 28, 28, generator=gen), torch.rand(2, 1, 28, 28, generator=gen)
    same = lpips(a, a.clone())
    assert same.shape == (2,) and torch.all(same.abs() < 1e-6)
    grey = lpips(a, b)
    assert torch.allclose(grey, lpips(a.expand(-1, 3, -1, -1), b.expand(-1, 3, -1, -1)))
    assert torch.all(grey > 0.01)


def test_pairwise_lpips_diagonal_matches_lpips(cifar: torch.Tensor) -> None:
    rec = (cifar[:4] + 0.1 * torch.randn(cifar[:4].shape, generator=torch.Generator().manual_seed(1))).clamp(0, 1)
    matrix = pairwise_lpips(rec, cifar[:4], pairs_per_chunk=5)  # odd chunk size exercises the row blocks
    assert matrix.shape == (4, 4)
    assert torch.allclose(matrix.diagonal(), lpips(rec, cifar[:4]), atol=1e-5)


# ---------------------------------------------------------------- PSNR / SSIM


def test_psnr_identical_is_inf_and_known_mse_exact() -> None:
    truth = torch.zeros(3, 3, 8, 8)
    rec = torch.zeros(3, 3, 8, 8)
    rec[1] = 0.5  # MSE 0.25
    rec[2, :, :4] = 0.5  # half the pixels: MSE 0.125
    values = psnr(rec, truth)
    assert values.shape == (3,) and math.isinf(values[0]) and values[0] > 0
    assert float(values[1]) == pytest.approx(10 * math.log10(1 / 0.25), abs=1e-12)
    assert float(values[2]) == pytest.approx(10 * math.log10(1 / 0.125), abs=1e-12)


def test_metrics_clamp_to_unit_range() -> None:
    truth = torch.ones(1, 3, 16, 16)
    assert math.isinf(psnr(truth * 1.5, truth)[0])  # 1.5 clamps to 1
    assert float(ssim(truth * 1.5, truth)[0]) == pytest.approx(1.0, abs=1e-12)


def test_ssim_identical_is_one_and_decreases_with_noise(cifar: torch.Tensor) -> None:
    gen = torch.Generator().manual_seed(0)
    assert torch.allclose(ssim(cifar, cifar), torch.ones(len(cifar), dtype=torch.float64), atol=1e-10)
    noise = torch.randn(cifar.shape, generator=gen)
    values = [float(ssim((cifar + s * noise).clamp(0, 1), cifar).mean()) for s in (0.02, 0.1, 0.3)]
    assert 1 > values[0] > values[1] > values[2]


def test_ssim_of_constant_images_closed_form() -> None:
    # flat images: σ = 0, so SSIM = (2ab + c1) / (a² + b² + c1) with c1 = 0.01²
    a, b, c1 = 0.2, 0.7, 0.01**2
    value = float(ssim(torch.full((1, 1, 16, 16), a), torch.full((1, 1, 16, 16), b))[0])
    assert value == pytest.approx((2 * a * b + c1) / (a * a + b * b + c1), rel=1e-5)


def _ssim_reference(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Wang et al. 2004 eq. 13 written out: 11×11 Gaussian (σ 1.5) window, valid positions only, K1 0.01, K2 0.03."""
    channels = x.shape[1]
    g = torch.exp(-((torch.arange(11, dtype=torch.float64) - 5) ** 2) / (2 * 1.5**2))
    g = g / g.sum()
    window = (g[:, None] * g[None]).expand(channels, 1, 11, 11)
    blur = lambda t: torch.nn.functional.conv2d(t, window, groups=channels)
    x, y = x.double(), y.double()
    mx, my = blur(x), blur(y)
    vx, vy, cxy = blur(x * x) - mx**2, blur(y * y) - my**2, blur(x * y) - mx * my
    c1, c2 = 0.01**2, 0.03**2
    ssim_map = (2 * mx * my + c1) * (2 * cxy + c2) / ((mx**2 + my**2 + c1) * (vx + vy + c2))
    return ssim_map.mean(dim=(1, 2, 3))


def test_ssim_matches_written_out_formula(cifar: torch.Tensor) -> None:
    noisy = (cifar + 0.1 * torch.randn(cifar.shape, generator=torch.Generator().manual_seed(4))).clamp(0, 1)
    assert torch.allclose(ssim(noisy, cifar), _ssim_reference(noisy, cifar), atol=1e-10)
    grey = cifar.mean(1, keepdim=True)
    assert torch.allclose(ssim(grey.flip(-1), grey), _ssim_reference(grey.flip(-1), grey), atol=1e-10)


def test_summarize() -> None:
    stats = summarize(torch.tensor([4.0, 1.0, 3.0, 2.0]))
    assert stats == {"mean": 2.5, "median": 2.5, "max": 4.0, "min": 1.0, "values": [4.0, 1.0, 3.0, 2.0]}


@pytest.mark.parametrize("fn", [psnr, ssim, lpips, score])
def test_shape_mismatch_is_a_config_error(fn) -> None:
    with pytest.raises(ConfigError, match="shape"):
        fn(torch.rand(2, 3, 32, 32), torch.rand(3, 3, 32, 32))
    with pytest.raises(ConfigError, match="B, C, H, W"):
        fn(torch.rand(3, 32, 32), torch.rand(3, 32, 32))


def test_nan_and_bad_names_are_config_errors() -> None:
    bad = torch.rand(1, 3, 32, 32)
    bad[0, 0, 0, 0] = float("nan")
    with pytest.raises(ConfigError, match="NaN"):
        psnr(bad, torch.rand(1, 3, 32, 32))
    with pytest.raises(ConfigError, match="valid"):
        lpips(torch.rand(1, 3, 32, 32), torch.rand(1, 3, 32, 32), net="squeeze")
    with pytest.raises(ConfigError, match="valid"):
        match_images(torch.rand(2, 3, 32, 32), torch.rand(2, 3, 32, 32), cost="cosine")
    with pytest.raises(ConfigError, match="window"):
        ssim(torch.rand(1, 1, 8, 8), torch.rand(1, 1, 8, 8))


# ---------------------------------------------------------------- Hungarian matching and score


@pytest.mark.parametrize("cost", ["mse", "psnr", "lpips"])
def test_matching_recovers_a_shuffle(cifar: torch.Tensor, cost: str) -> None:
    order = [3, 0, 5, 1, 4, 2]  # rec[j] = truth[order[j]]
    rec = cifar[order] + 0.02 * torch.randn(cifar.shape, generator=torch.Generator().manual_seed(2))
    perm = match_images(rec.clamp(0, 1), cifar, cost=cost)
    assert [order[j] for j in perm] == list(range(6))  # perm[i] is the reconstruction of truth i


def test_matching_is_one_to_one_with_near_copies(cifar: torch.Tensor) -> None:
    truth = cifar[:3]
    gen = torch.Generator().manual_seed(3)
    rec = torch.stack([truth[0] + 1e-3 * torch.randn(truth[0].shape, generator=gen),
                       truth[0] + 1e-3 * torch.randn(truth[0].shape, generator=gen),  # a second copy of truth 0
                       truth[2]]).clamp(0, 1)
    result = score(rec, truth, labels_rec=torch.tensor([3, 3, 8]), labels_true=torch.tensor([3, 8, 8]))
    perm = result["perm"]
    assert sorted(perm) == [0, 1, 2] and perm[0] in (0, 1) and perm[2] == 2
    assert result["psnr"][2] == math.inf and result["psnr"][1] < 20  # truth 1 got the leftover copy
    assert result["label_acc"] == pytest.approx(2 / 3) and result["label_ins_acc"] == pytest.approx(2 / 3)


def test_score_report(cifar: torch.Tensor) -> None:
    rec = cifar.flip(0)
    unmatched = score(rec, cifar, match=False)
    matched = score(rec, cifar, vgg=True)
    assert unmatched["perm"] == list(range(6)) and unmatched["match_cost"] is None
    assert matched["perm"] == [5, 4, 3, 2, 1, 0]
    assert matched["psnr_mean"] == math.inf and matched["psnr_min"] == math.inf
    assert matched["ssim"] == pytest.approx([1.0] * 6) and matched["lpips_vgg_max"] == pytest.approx(0, abs=1e-6)
    assert unmatched["psnr_max"] < 40 and unmatched["lpips_alex_mean"] > 0.05
    assert len(unmatched["lpips_alex"]) == 6 and "lpips_vgg" not in unmatched
    for key in ("mse", "psnr", "ssim", "lpips_alex"):
        assert {f"{key}_{s}" for s in ("mean", "median", "max", "min")} <= set(unmatched)


def test_score_single_image_and_label_errors(cifar: torch.Tensor) -> None:
    one = score(cifar[:1], cifar[:1])
    assert one["perm"] == [0] and one["num_images"] == 1
    with pytest.raises(ConfigError, match="both"):
        score(cifar[:2], cifar[:2], labels_rec=torch.tensor([0, 1]))
    with pytest.raises(ConfigError, match="class ids"):
        score(cifar[:2], cifar[:2], labels_rec=torch.tensor([0, 1, 2]), labels_true=torch.tensor([0, 1]))


# ---------------------------------------------------------------- label metrics


def _truth(counts: list[int], targets: torch.Tensor | None = None) -> Truth:
    c = torch.tensor(counts)
    labels = torch.repeat_interleave(torch.arange(len(c)), c)
    if targets is None:
        targets = torch.nn.functional.one_hot(labels, len(c)).double()
    return Truth(images=torch.zeros(len(labels), 1, 2, 2), labels=labels, targets=targets, counts=c)


def test_label_metrics_hand_computed() -> None:
    # true [2, 1, 0, 1], predicted [1, 1, 2, 0]  (B = 4, C = 4)
    result = LabelResult.from_counts("x", torch.tensor([1, 1, 2, 0]))
    m = label_metrics(result, _truth([2, 1, 0, 1]))
    p, q = np.array([0.5, 0.25, 0, 0.25]), np.array([0.25, 0.25, 0.5, 0])
    assert m["ok"] == 1.0
    assert m["cls_acc"] == pytest.approx(2 / 4)  # classes 0, 1 agree; 2 and 3 do not
    assert m["ins_acc"] == pytest.approx((1 + 1 + 0 + 0) / 4)
    assert m["count_acc"] == 0.0
    assert m["prop_mse"] == pytest.approx(np.mean((q - p) ** 2))
    assert m["l1"] == pytest.approx(1.0) and m["linf"] == pytest.approx(0.5)
    assert m["l2"] == pytest.approx(math.sqrt(0.0625 + 0.25 + 0.0625))
    eps = 1e-6
    qe = (q + eps) / (1 + 4 * eps)
    expected_kl = sum(pi * math.log(pi / qi) for pi, qi in zip(p, qe) if pi > 0)
    assert m["prop_kl"] == pytest.approx(expected_kl, rel=1e-12)
    assert "soft_l1" not in m


def test_label_metrics_exact_and_failure() -> None:
    truth = _truth([0, 3, 1])
    exact = label_metrics(LabelResult.from_counts("x", torch.tensor([0, 3, 1])), truth)
    assert exact["cls_acc"] == exact["ins_acc"] == exact["count_acc"] == 1.0
    assert exact["prop_mse"] == exact["l1"] == exact["linf"] == 0.0
    assert exact["prop_kl"] == pytest.approx(0.0, abs=1e-5)
    over = label_metrics(LabelResult.from_counts("x", torch.tensor([0, 6, 0])), truth)  # predicts B = 6, truth 4
    assert over["ins_acc"] == pytest.approx(3 / 4) and over["cls_acc"] == pytest.approx(2 / 3)
    failed = label_metrics(LabelResult.failure("x", 3, "no decision"), truth)
    assert failed["ok"] == 0.0 and failed["ins_acc"] == 0.0 and failed["count_acc"] == 0.0
    assert failed["cls_acc"] == pytest.approx(1 / 3)  # only class 0 (absent) "agrees"
    assert failed["l1"] == pytest.approx(abs(1 / 3) + abs(1 / 3 - 0.75) + abs(1 / 3 - 0.25))


def test_soft_label_metrics_match_rows() -> None:
    targets = torch.tensor([[0.9, 0.05, 0.05], [0.1, 0.8, 0.1]], dtype=torch.float64)
    truth = _truth([1, 1, 0], targets=targets)
    soft = torch.tensor([[0.2, 0.7, 0.1], [0.9, 0.05, 0.05]], dtype=torch.float64)  # rows swapped
    result = LabelResult.from_counts("x", torch.tensor([1, 1, 0]), soft=soft)
    m = label_metrics(result, truth)
    assert m["soft_l1"] == pytest.approx((0.0 + 0.2) / 2) and m["top1"] == 1.0
    unmatched = label_metrics(result, truth, match_soft=False)
    assert unmatched["top1"] == 0.0 and unmatched["soft_l1"] > 1.0
    with pytest.raises(ConfigError, match="soft labels"):
        label_metrics(LabelResult.from_counts("x", torch.tensor([1, 1, 0]), soft=soft[:1]), truth)


def test_label_metrics_from_counts_batched_and_errors() -> None:
    pred = torch.tensor([[2, 1, 0], [0, 0, 3], [1, 1, 1]])
    true = torch.tensor([[2, 1, 0], [1, 1, 1], [1, 1, 1]])
    batched = label_metrics_from_counts(pred, true)
    assert batched["ins_acc"].shape == (3,)
    for i in range(3):
        single = label_metrics_from_counts(pred[i], true[i])
        assert {k: pytest.approx(float(v[i])) for k, v in batched.items()} == single
    with pytest.raises(ConfigError, match="shape"):
        label_metrics_from_counts(torch.tensor([1, 2]), torch.tensor([1, 2, 3]))
    with pytest.raises(ConfigError, match="sum to 0"):
        label_metrics_from_counts(torch.tensor([1, 2]), torch.tensor([0, 0]))
    with pytest.raises(ConfigError, match="negative"):
        label_metrics_from_counts(torch.tensor([-1, 2]), torch.tensor([1, 0]))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 8).flatmap(lambda c: st.tuples(st.lists(st.integers(0, 6), min_size=c, max_size=c),
                                                     st.lists(st.integers(0, 6), min_size=c, max_size=c))))
def test_ins_acc_property(pair: tuple[list[int], list[int]]) -> None:
    pred, true = pair
    if sum(true) == 0:
        true[0] = 1
    m = label_metrics_from_counts(torch.tensor(pred), torch.tensor(true))
    assert 0.0 <= m["ins_acc"] <= 1.0 and 0.0 <= m["cls_acc"] <= 1.0
    assert m["prop_kl"] >= -1e-12 and m["l1"] <= 2 + 1e-12
    if sum(pred) == sum(true):
        assert (m["ins_acc"] == 1.0) == (pred == true) == (m["count_acc"] == 1.0)



def test_absent_class_decisions_exact():
    """absent_hit / absent_called / absent_true count classes with p̂ = 0 and n = 0 / p̂ = 0 / n = 0."""
    m = label_metrics_from_counts(torch.tensor([0, 0, 3, 0, 1]), torch.tensor([0, 1, 2, 0, 0]))
    assert (m["absent_hit"], m["absent_called"], m["absent_true"]) == (2.0, 3.0, 3.0)
    assert m["cls_acc"] == pytest.approx(3 / 5)
    given = label_metrics_from_counts(torch.tensor([0, 0, 3, 0, 1]), torch.tensor([0, 1, 2, 0, 0]),
                                      pred_proportions=torch.tensor([0.1, 0.0, 0.6, 0.0, 0.3]))
    assert (given["absent_hit"], given["absent_called"]) == (1.0, 2.0)  # decided on the proportions when given

# ---------------------------------------------------------------- restricted unpickler


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_unpickler_refuses_code_and_object_arrays() -> None:
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        lpips_offline.load_numpy_pickle(pickle.dumps({"kernel": _Evil()}))
    with pytest.raises(pickle.UnpicklingError, match="object arrays"):
        lpips_offline.load_numpy_pickle(pickle.dumps({"w": np.array([1, "a"], dtype=object)}))
    tree = {"Conv_0": {"kernel": np.arange(6, dtype=np.float32).reshape(1, 1, 2, 3)}}
    for protocol in (2, 3, 5):
        loaded = lpips_offline.load_numpy_pickle(pickle.dumps(tree, protocol=protocol))
        np.testing.assert_array_equal(loaded["Conv_0"]["kernel"], tree["Conv_0"]["kernel"])

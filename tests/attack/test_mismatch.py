"""The relative mismatch of the shared tensors (gi/attack/recon/mismatch.py): 0 at the client's own images and
labels (the simulator is the victim's), for a gradient, with the captured output error and for an update; large
for a flat grey image."""

from __future__ import annotations

import math

import pytest
import torch

import gi
from gi.attack.recon.mismatch import relative_mismatch, shared_mismatch


def _model():
    return gi.world.models.build("mlp", 4, in_shape=(1, 6, 6), seed=0)


def _images(b: int) -> torch.Tensor:
    return torch.rand(b, 1, 6, 6, generator=torch.Generator().manual_seed(b))


def test_the_client_s_own_data_explains_its_gradient_and_a_grey_image_does_not():
    capture, truth = gi.capture_gradients(_model(), _images(2), torch.tensor([1, 3]), gi.Protocol(batch_size=2))
    assert shared_mismatch(capture, truth.images, truth.targets) < 1e-6
    assert shared_mismatch(capture, torch.full_like(truth.images, 0.5), truth.targets) > 0.1
    one, t1 = gi.capture_gradients(_model(), _images(1), torch.tensor([2]), gi.Protocol(batch_size=1))
    wrong = torch.nn.functional.one_hot(torch.tensor([0]), 4).float()  # the captured ∂L/∂z: labels play no part
    assert shared_mismatch(one, t1.images, wrong, output_error="captured") < 1e-6
    assert shared_mismatch(one, t1.images, wrong) > 0.1


def test_an_update_is_compared_as_the_update():
    protocol = gi.Protocol(scheme="fedavg", batch_size=2, local_epochs=1, lr=0.1)
    capture, truth = gi.simulate_client(_model(), (_images(4), torch.tensor([0, 1, 1, 3])), protocol,
                                        rng=torch.Generator().manual_seed(0))
    assert capture.is_update
    assert shared_mismatch(capture, truth.images, truth.targets) < 1e-5
    assert shared_mismatch(capture, torch.full_like(truth.images, 0.5), truth.targets) > 0.1


def test_relative_mismatch_edge_cases():
    target = {"w": torch.tensor([3.0, 4.0])}
    assert relative_mismatch({"w": torch.tensor([3.0, 4.0])}, target) == 0.0
    assert relative_mismatch({"w": torch.zeros(2)}, target) == 1.0
    assert relative_mismatch({"w": torch.zeros(2)}, {"w": torch.zeros(2)}) == 0.0
    assert math.isinf(relative_mismatch({"w": torch.ones(2)}, {"w": torch.zeros(2)}))


def test_the_blocked_sums_give_the_exact_ratio_across_block_edges(monkeypatch):
    from gi.attack.recon import mismatch

    monkeypatch.setattr(mismatch, "CHUNK", 3)  # blocks of 3 elements: both tensors straddle a block edge
    target = {"a": torch.tensor([[1.0, 2.0], [0.0, 4.0]]), "b": torch.tensor([2.0, 0.0, 1.0, 0.0])}
    sim = {"a": torch.tensor([[4.0, 2.0], [0.0, 4.0]]), "b": torch.tensor([2.0, 0.0, 1.0, 4.0])}
    # Σ t² = 21 + 5 = 26; Σ (s − t)² = 3² (first block of a) + 4² (second block of b) = 25
    assert relative_mismatch(sim, target) == pytest.approx(math.sqrt(25 / 26), rel=1e-12)
    monkeypatch.setattr(mismatch, "CHUNK", 1 << 20)
    assert relative_mismatch(sim, target) == pytest.approx(math.sqrt(25 / 26), rel=1e-12)


def test_a_simulated_tensor_of_another_shape_is_an_error():
    with pytest.raises(ValueError, match=r"simulated shape \(4,\) does not match the target's \(2, 2\)"):
        relative_mismatch({"w": torch.zeros(4)}, {"w": torch.ones(2, 2)})


def test_a_slot_s_swap_distance_is_its_own_gradient_change_over_the_capture_s_norm():
    """FedSGD's mean-loss gradient is (1/B) Σ_j g_j(x_j) on a net without batch coupling, so swapping slot i for its
    mean colour c_i moves it by exactly ‖g_i(x_i) − g_i(c_i)‖ / B; a slot that already holds a constant image moves
    it by 0."""
    from gi.attack.recon.mismatch import slot_swap_distances

    model, x, y = _model(), _images(3), torch.tensor([1, 3, 0])
    x[2] = 0.25  # a flat image is its own mean colour (0.25: its mean is exact in float32)
    capture, truth = gi.capture_gradients(model, x, y, gi.Protocol(batch_size=3))
    got = slot_swap_distances(capture, truth.images, truth.targets)
    names = list(capture.shared)
    norm = math.sqrt(sum(float(capture.shared[k].double().pow(2).sum()) for k in names))
    params = dict(model.named_parameters())

    def grad(image: torch.Tensor, label: int) -> list[torch.Tensor]:
        loss = torch.nn.functional.cross_entropy(model(image[None]), torch.tensor([label]))
        return torch.autograd.grad(loss, [params[k] for k in names])

    for i in range(2):
        colour = x[i].mean((1, 2), keepdim=True).expand_as(x[i])
        diff = [a - b for a, b in zip(grad(x[i], int(y[i])), grad(colour, int(y[i])))]
        want = math.sqrt(sum(float(d.double().pow(2).sum()) for d in diff)) / 3 / norm
        assert got[i] == pytest.approx(want, rel=1e-4)
        assert got[i] > 1e-3
    assert got[2] == 0.0


def test_the_final_reconstructions_carry_their_slots_swap_distances_and_a_round_does_not():
    """record_mismatch(slots=True) measures every slot of a capture that can be re-simulated; a round of
    reshuffled mini-batches (order unknown) is not swapped, since its share cannot judge the images."""
    from gi.attack.recon import Reconstruction
    from gi.attack.stages.reconstruct import record_mismatch

    capture, truth = gi.capture_gradients(_model(), _images(2), torch.tensor([1, 3]), gi.Protocol(batch_size=2))
    rnd, rtruth = gi.simulate_client(_model(), (_images(4), torch.tensor([0, 1, 1, 3])),
                                     gi.Protocol(scheme="fedavg", batch_size=2, num_samples=4, local_epochs=1,
                                                 lr=0.1), rng=torch.Generator().manual_seed(0))

    def rec(t) -> Reconstruction:
        return Reconstruction(images=t.images, all_images=t.images[None], labels=t.targets,
                              objective=torch.zeros(1), best_restart=0)

    recs = [rec(truth), rec(rtruth)]
    record_mismatch([capture, rnd], recs)
    assert all("slot_swap_distance" not in r.history for r in recs)  # only the final call measures the slots
    record_mismatch([capture, rnd], recs, slots=True)
    assert len(recs[0].history["slot_swap_distance"]) == 2 and min(recs[0].history["slot_swap_distance"]) > 1e-3
    assert "slot_swap_distance" not in recs[1].history


def test_a_slot_s_feature_swap_is_its_mean_colour_s_feature_mismatch_batched_or_alone():
    """feature_swap_mismatches: per slot ‖f(c_i) − f*_i‖ / ‖f*_i‖ for the slot's mean colour c_i; a slot whose
    image is flat is its own mean colour, so its swap equals its own mismatch; with BatchNorm in train mode each
    slot is swapped alone (the others keep their images in the batch statistics), so the values differ from one
    batch of mean colours."""
    from gi.attack.recon.mismatch import feature_mismatches, feature_swap_mismatches
    from gi.world.models import features_and_logits

    x = _images(3)
    x[1] = 0.25
    for options, mode in (({}, "eval"), ({"batch_norm": True}, "train")):
        model = gi.world.models.build("cnn", 4, in_shape=(1, 6, 6), seed=0, channels=(4,), hidden=8, **options)
        capture, truth = gi.capture_gradients(model, x, torch.tensor([1, 3, 0]),
                                              gi.Protocol(batch_size=3, model_mode=mode))
        m = capture.model().train(mode == "train")
        with torch.no_grad():
            target = features_and_logits(m, x, None)[0] * 1.1  # a target the images miss by 10 %
        got = feature_swap_mismatches(capture, x, target)
        assert got[1] == pytest.approx(feature_mismatches(capture, x, target)[1][1], rel=1e-9)
        for i in (0, 2):
            swapped = x.clone()
            swapped[i] = x[i].mean((1, 2), keepdim=True).expand_as(x[i])
            with torch.no_grad():
                f = features_and_logits(m, swapped, None)[0][i].double()
            want = float((f - target[i].double()).norm() / target[i].double().norm())
            assert got[i] == pytest.approx(want, rel=1e-6)


def test_each_final_reconstruction_records_the_kind_of_evidence_its_capture_gives():
    """The verdict's estimate per image rests on how the answer was reached (gi.analysis.verdict.evidence_kind):
    an FCN's analytic answer, the same capture optimised, a 2-step update optimised, and a fit that does not match
    the gradient (attack.match_weight 0, the last-layer features alone)."""
    from gi.analysis.verdict import UNDECIDED

    model = gi.world.models.build("mlp", 10, in_shape=(3, 8, 8), widths=(32, 16), bias=False, bias_last=False, seed=1)
    cap, _ = gi.capture_gradients(model, torch.rand(1, 3, 8, 8, generator=torch.Generator().manual_seed(2)),
                                  torch.tensor([3]), gi.Protocol())
    answered = gi.attack.run(cap, labels="soft-lambda", preset="default", progress=False)
    assert answered.reconstructions[0].history["evidence"] == "analytic"
    assert answered.verdict.estimates == [["recovered"]]  # exact (~1e-6) and pinned
    short = dict(labels="soft-lambda", preset="default", analytic=False, iterations=2, restarts=1, retries=0,
                 progress=False)
    assert gi.attack.run(cap, **short).reconstructions[0].history["evidence"] == "gradient-l2"  # the default preset
    assert gi.attack.run(cap, **short, objective="cosine").reconstructions[0].history["evidence"] == "gradient-cosine"
    unmatched = gi.attack.run(cap, **short, match_weight=0.0, feature_weight=1.0)
    assert unmatched.reconstructions[0].history["evidence"] == "unmatched"
    assert unmatched.verdict.estimates == [[UNDECIDED]]
    upd, _ = gi.simulate_client(_model(), (_images(2), torch.tensor([1, 3])),
                                gi.Protocol(scheme="fedavg", batch_size=1, num_samples=2, lr=0.1),
                                rng=torch.Generator().manual_seed(0))
    update = gi.attack.run(upd, labels="auto", preset="default", iterations=2, restarts=1, retries=0,
                           progress=False)
    assert update.reconstructions[0].history["evidence"] == "update"
    assert update.verdict.estimates == [[UNDECIDED, UNDECIDED]]

"""labels ``fc-inputs``: every sample's label of a FedSGD batch from the disaggregated first Linear layer."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import labels
from gi.world.data import load
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import capture_gradients, simulate_client
from gi.world.models import build
from tests.factories import first_of_classes


def _batch(n: int = 6):
    data = load("fashion-mnist")
    g = torch.Generator().manual_seed(4)
    idx = torch.randperm(len(data), generator=g)[:n]
    return data.images[idx], data.labels[idx]


def _cnn(**kw):
    return build("cnn", 10, activation="relu", in_shape=(1, 28, 28), seed=0, batch_norm=True, channels=[16, 32],
                 hidden=64, **kw)


@pytest.mark.parametrize("aug", [dict(), dict(label_aug="smoothing", label_eps=0.2), dict(temperature=3.0)],
                         ids=["one-hot", "smoothed", "temperature"])
def test_every_sample_label_is_recovered_exactly(aug):
    images, y = _batch()
    capture, truth = capture_gradients(_cnn(), images, y, Protocol(batch_size=6, model_mode="train", **aug))
    result = labels.recover(capture, "fc-inputs")
    assert result.ok and result.info["layer"] == "body.1"
    assert torch.equal(result.counts, truth.counts)
    # the rows come in the order the inputs were found: each is some sample's soft target, to 1e-3
    assert float(torch.cdist(result.soft.double(), truth.targets.double()).min(1).values.max()) < 1e-3


def test_where_it_does_not_apply_it_says_why():
    images, y = _batch(4)
    model = _cnn()
    one, _ = capture_gradients(model, images[:1], y[:1], Protocol())
    assert "one sample" in labels.recover(one, "fc-inputs").info["reason"]
    bce, _ = capture_gradients(model, images, y, Protocol(batch_size=4, loss="bce"))
    assert "cross-entropy" in labels.recover(bce, "fc-inputs").info["reason"]
    twice, _ = simulate_client(model, (images, y), Protocol(scheme="fedavg", batch_size=2, local_steps=4),
                               torch.Generator().manual_seed(0))
    assert "more than one local epoch" in labels.recover(twice, "fc-inputs").info["reason"]
    momentum, _ = simulate_client(model, (images, y), Protocol(scheme="fedavg", batch_size=2, momentum=0.9),
                                  torch.Generator().manual_seed(0))
    assert "not a plain sum" in labels.recover(momentum, "fc-inputs").info["reason"]
    fcn = build("fcn3", 10, in_shape=(1, 28, 28), seed=0)  # its first Linear sees the raw pixels: too dense
    dense, _ = capture_gradients(fcn, images, y, Protocol(batch_size=4))
    result = labels.recover(dense, "fc-inputs", draws=2_000)  # the sampling fallback's budget, kept small
    assert not result.ok and result.info["reason"]


def test_a_one_epoch_fedavg_round_gives_every_samples_label():
    """Two SGD steps of 2 over the client's 4 images: −ΔW/η of the first Linear layer is one batch gradient over
    the 4 inputs (each at its own step's parameters), and each label follows as for a FedSGD batch."""
    images, y = _batch(4)
    update, truth = simulate_client(_cnn(), (images, y), Protocol(scheme="fedavg", batch_size=2, lr=0.01),
                                    torch.Generator().manual_seed(0))
    result = labels.recover(update, "fc-inputs")
    assert result.ok and torch.equal(result.counts, truth.counts)
    assert sorted(result.soft.argmax(1).tolist()) == sorted(truth.labels.tolist())


def test_a_one_epoch_round_with_a_short_last_batch_is_one_epoch():
    """N = 5, B = 2 without drop_last: steps of 2, 2, 1 (three steps, more than N // B = 2) still see each sample
    once, so its labels follow; two epochs of it (ten visits of five samples) are refused."""
    images, y = _batch(5)
    protocol = Protocol(scheme="fedavg", batch_size=2, lr=0.01, drop_last=False)
    update, truth = simulate_client(_cnn(), (images, y), protocol, torch.Generator().manual_seed(0))
    assert update.meta["num_steps"] == 3
    result = labels.recover(update, "fc-inputs")
    assert result.ok and torch.equal(result.counts, truth.counts)
    twice, _ = simulate_client(_cnn(), (images, y), dataclasses.replace(protocol, local_epochs=2),
                               torch.Generator().manual_seed(0))
    assert "more than one local epoch" in labels.recover(twice, "fc-inputs").info["reason"]


def _replayed_round():
    """A FedAvg client's round: six Fashion-MNIST images of six classes, one epoch of three SGD steps of two on a
    ReLU cnn without normalisation, replayed with torch.optim.SGD in the client's order (the generator's first
    permutation): the capture, its truth, and each image's input x_i of ``body.1``, output error e_i of ``body.1``
    and head error g_i = softmax(z_i) − y_i, each at the parameters of the step that saw it."""
    images, y = first_of_classes()

    def net():
        return build("cnn", 10, activation="relu", in_shape=(1, 28, 28), seed=0, channels=[16, 32], hidden=64)

    model = net()
    protocol = Protocol(scheme="fedavg", num_samples=6, batch_size=2, lr=0.01)
    capture, truth = simulate_client(model, (images, y), protocol, rng=torch.Generator().manual_seed(0))
    replay = net()
    sgd = torch.optim.SGD(replay.parameters(), lr=0.01)
    x, e, g = torch.zeros(6, 32 * 7 * 7), torch.zeros(6, 64), torch.zeros(6, 10)
    for step in torch.randperm(6, generator=torch.Generator().manual_seed(0)).view(3, 2):
        feats = replay.body[0](replay.normalize(images[step]))
        z = replay.body[1](feats)
        z.retain_grad()
        logits = replay.fc(replay.body[2](z))
        sgd.zero_grad()
        torch.nn.functional.cross_entropy(logits, y[step], reduction="sum").backward()  # per-sample errors
        x[step], e[step] = feats.detach(), z.grad
        g[step] = (torch.softmax(logits, 1) - torch.nn.functional.one_hot(y[step], 10)).detach()
        sgd.zero_grad()
        torch.nn.functional.cross_entropy(replay(images[step]), y[step]).backward()  # the client's mean-loss step
        sgd.step()
    assert all(torch.allclose(replay.state_dict()[k] - v, capture.update[k], atol=1e-6)
               for k, v in model.state_dict().items() if k in capture.update)  # the replay is the client's round
    return capture, truth, x.double(), e.double(), g.double()


def test_a_replayed_round_reads_each_label_from_its_own_hidden_error():
    """Every count of the round exact, each label read from the sample's own output error of the hidden layer, the
    errors summing to the head's bias update (Σ_i g_i = B·(−Δb/η); measured 2.4e-3 off, the head's drift over the
    round: each g_i is read with W_L at θᵗ)."""
    capture, truth, _, _, _ = _replayed_round()
    result = labels.recover(capture, "fc-inputs")
    assert result.ok and torch.equal(result.counts, truth.counts)
    assert result.info["errors_from"] == "own hidden error" and result.info["doubtful"] == 0
    assert result.info["bias_residual"] < 1e-2
    assert sorted(result.soft.argmax(1).tolist()) == sorted(truth.labels.tolist())


def test_the_head_error_of_each_sample_follows_from_its_hidden_error():
    """g_i from e_i = relu'(z_i) ⊙ W_Lᵀ g_i (least squares on the active units, W_L at θᵗ): within the head's drift
    over the round's three steps (measured 1.4e-3 of ‖g_i‖, fit residual 2.0e-3), and its one negative entry is the
    label."""
    from labels.fc_inputs import hidden_errors

    capture, truth, x, e, g = _replayed_round()
    _, found, fit = hidden_errors(capture, "body.1", x, e)
    assert torch.equal(found.argmin(1), truth.labels)
    assert float(((found - g).norm(dim=1) / g.norm(dim=1)).max()) < 2e-2 and float(fit.max()) < 2e-2


def test_a_missed_input_is_found_again_by_programs_orthogonal_to_the_others():
    """One input replaced by a mixture of four (176 zeros, the intersection of theirs, against 464–521 of an input):
    the completion doubts it and finds the missed input, x_0, as the vertex that objectives vanishing on the other
    five reach."""
    from fcn_analytic.disaggregate import complete_inputs, summed_layer

    capture, _, x, _, _ = _replayed_round()
    summed = summed_layer(capture, "body.1")
    spoiled = torch.cat([x[:4].mean(0, keepdim=True), x[1:]])
    done, replaced, doubtful = complete_inputs(summed.weight, summed.bias, spoiled, **summed.tolerances)
    assert replaced == 1 and not bool(doubtful.any())
    rel = torch.cdist(done.inputs, x) / x.norm(dim=1)[None]
    assert float(rel.min(0).values.max()) < 1e-2  # every true input, x_0 included, is a row of the completion
    kept, replaced, doubtful = complete_inputs(summed.weight, summed.bias, spoiled, programs=0, **summed.tolerances)
    assert replaced == 0 and doubtful.tolist() == [False] * 5 + [True]  # without programs: kept, and doubted


def test_the_classes_of_missed_samples_follow_from_the_bias_identity():
    """Σ_i g_i = total with g = p − y: the missed samples' labels sum to m·p̄ − (total − Σ known g)."""
    from labels.fc_inputs import missed_labels

    p = torch.full((4, 3), 1 / 3, dtype=torch.float64)
    y = torch.nn.functional.one_hot(torch.tensor([0, 1, 2, 2]), 3).double()
    g = p - y
    assert missed_labels(g.sum(0), g[:3], p[:3], 1).tolist() == [2]
    assert sorted(missed_labels(g.sum(0), g[:2], p[:2], 2).tolist()) == [2, 2]
    assert sorted(missed_labels(g.sum(0), g[1:3], p[1:3], 2).tolist()) == [0, 2]


def test_auto_reads_a_one_epoch_round_of_a_conv_net_with_fc_inputs():
    """The picker's rule: a one-epoch plain-SGD round of a net whose first Linear layer follows a convolution →
    fc-inputs (counts exact here); two epochs, momentum, a first Linear on raw pixels or on a sigmoid map → the
    rules after it."""
    from labels.auto import pick

    capture, truth, _, _, _ = _replayed_round()
    aux = object()  # the picker only asks whether aux data is given
    assert pick(capture, aux).method == "fc-inputs" and pick(capture).method == "fc-inputs"
    result = labels.recover(capture, "auto")
    assert result.method == "fc-inputs" and result.info["picked_by"] == "auto"
    assert torch.equal(result.counts, truth.counts)
    images, y = first_of_classes()
    for protocol in (Protocol(scheme="fedavg", batch_size=2, lr=0.01, local_epochs=2),
                     Protocol(scheme="fedavg", batch_size=2, lr=0.01, momentum=0.9)):
        other, _ = simulate_client(_cnn(), (images, y), protocol, torch.Generator().manual_seed(0))
        assert pick(other, aux).method == "rlu"
    for net in (build("fcn3", 10, in_shape=(1, 28, 28), seed=0),  # its first Linear sees the pixels
                build("cnn", 10, activation="sigmoid", in_shape=(1, 28, 28), seed=0, channels=[16, 32], hidden=64)):
        dense, _ = simulate_client(net, (images, y), Protocol(scheme="fedavg", batch_size=2, lr=0.01),
                                   torch.Generator().manual_seed(0))
        assert pick(dense, aux).method == "rlu"  # dense inputs of the first Linear: not a ReLU map


@pytest.mark.parametrize("doubtful, readings", [(0, 1 + 2 * 2), (2, 1 + 2 * 2), (3, 1)])
def test_a_reading_is_doubted_further_only_when_it_doubts_few_rows(monkeypatch, doubtful, readings):
    """The bias identity missed (0.5 > BIAS_TOL): a first reading with at most DOUBTS doubtful rows is re-read with
    each suspect doubted (two suspects here, DOUBTS rounds, each better than the last); one with more is not, as
    each re-reading would repeat the completion's programs for every doubtful row."""
    import labels.fc_inputs as fc

    b = 6
    calls: list[list[int]] = []

    def reading(capture, name, summed, inputs, programs, doubt):
        calls.append(list(doubt))
        mask = torch.zeros(b, dtype=torch.bool)
        mask[:doubtful] = True
        mask[doubt] = True
        return fc._Reading(inputs, torch.full((b, 10), 0.1), torch.zeros(b, dtype=torch.long), None, mask,
                           0.5 / (1 + len(doubt)), 0, 0.0, torch.arange(b, dtype=torch.float64),
                           torch.arange(b))

    monkeypatch.setattr(fc, "_reading", reading)
    monkeypatch.setattr(fc, "_suspects", lambda read: [int(i) for i in torch.nonzero(~read.doubtful).flatten()[:2]])
    capture, _, _, _, _ = _replayed_round()
    fc.labels_from_inputs(capture, "body.1", None, torch.zeros(b, 4), programs=8)
    assert len(calls) == readings


def test_labels_of_errors_reads_a_confident_sample_from_its_prediction():
    """y = softmax(z/T) − T·g exactly: with g = (p − y)/T the soft label is y itself, at T = 1 and T = 2; where g is
    read with a noise larger than itself (a confidently, rightly predicted sample) the negative entry of g is
    wrong but the argmax of y is the label."""
    from labels.fc_inputs import labels_of_errors

    logits = torch.tensor([[9.0, 0.0, -1.0], [0.0, 2.0, 0.5]], dtype=torch.float64)
    y = torch.eye(3, dtype=torch.float64)[[0, 2]]
    for t in (1.0, 2.0):
        p = torch.softmax(logits / t, 1)
        probs, soft, hard = labels_of_errors(logits, (p - y) / t, t)
        assert torch.allclose(probs, p) and torch.allclose(soft, y, atol=1e-12) and hard.tolist() == [0, 2]
    p = torch.softmax(logits, 1)
    g = p - y
    noisy = g + torch.tensor([[1e-3, -2e-3, 1e-3], [0.0, 0.0, 0.0]], dtype=torch.float64)  # |g_0| ~ 1.7e-4
    assert noisy[0].argmin() != 0
    assert labels_of_errors(logits, noisy)[2].tolist() == [0, 2]


def test_rows_the_search_is_not_sure_of_are_doubted(monkeypatch):
    """The pursuit's rows after the ones it is sure of are guesses (fcn_analytic.disaggregate.search_inputs): a
    guess that copies another input keeps its zeros, so the completion's zero test passes it, and read as an input
    it spoils the labels. Doubted from the start, it is replaced by the vertex it stands for and every count is
    exact."""
    import fcn_analytic.disaggregate as disaggregate

    capture, truth, x, _, _ = _replayed_round()
    guessed = x.clone()
    guessed[5] = 2.0 * x[4]  # a guess with an input's zeros, in the last row

    monkeypatch.setattr(disaggregate, "search_inputs", lambda *a, **k: (guessed, 0, 5, 5))
    result = labels.recover(capture, "fc-inputs")
    assert result.ok and torch.equal(result.counts, truth.counts)
    assert result.info["search_sure"] == 5 and result.info["completed"] >= 1

import pytest
import torch

import gi
from gi.capture import Capture, Truth
from gi.core.errors import CaptureError
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import capture_gradients
from gi.world.models import build


def _capture(bias=True, protocol=None, b=2):
    model = build("lenet", 10, init="uniform", seed=0, bias_last=bias)
    x = torch.rand(b, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    return (model, *capture_gradients(model, x, torch.arange(b), protocol or Protocol(batch_size=b)))


def test_capture_gradients_are_mean_loss_gradients():
    model, cap, truth = _capture()
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(truth.images), truth.labels).backward()
    for name, p in model.named_parameters():
        assert torch.allclose(cap.gradients[name], p.grad, atol=1e-7)
    assert truth.counts.sum() == 2 and cap.meta["num_samples"] == 2


def test_save_load_round_trip_is_bit_exact(tmp_path):
    _, cap, truth = _capture()
    cap.history["control"] = torch.randn(3, dtype=torch.float64)
    cap.save(tmp_path / "c.safetensors")
    back = Capture.load(tmp_path / "c.safetensors")
    for a, b in ((cap.gradients, back.gradients), (cap.model_state, back.model_state), (cap.history, back.history)):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)
    assert back.protocol == cap.protocol and back.model_spec == cap.model_spec and back.update is None
    truth.save(tmp_path / "t.safetensors")
    t2 = Truth.load(tmp_path / "t.safetensors")
    assert torch.equal(t2.images, truth.images) and torch.equal(t2.counts, truth.counts)


def test_load_never_unpickles_and_rejects_foreign_files(tmp_path):
    bad = tmp_path / "x.safetensors"
    torch.save({"a": 1}, bad)  # a pickle
    with pytest.raises(CaptureError, match="not a valid safetensors"):
        Capture.load(bad)
    with pytest.raises(CaptureError, match="no capture file"):
        Capture.load(tmp_path / "missing.safetensors")


def test_validate_names_shape_mismatch():
    _, cap, _ = _capture()
    other = build("lenet5", 10)
    with pytest.raises(CaptureError, match="shape|not a parameter"):
        cap.validate(other)
    cap.gradients["fc.weight"] = cap.gradients["fc.weight"][:, :5]
    with pytest.raises(CaptureError, match="fc.weight.*shape"):
        cap.validate()


def test_validate_rejects_nan_naming_the_tensor():
    _, cap, _ = _capture()
    cap.gradients["body.0.weight"][0, 0, 0, 0] = float("nan")
    with pytest.raises(CaptureError, match="body.0.weight.*NaN"):
        cap.validate()


def test_validate_gradients_xor_update():
    _, cap, _ = _capture()
    cap.update = {k: -v for k, v in cap.gradients.items()}
    with pytest.raises(CaptureError, match="exactly one"):
        cap.validate()


def test_update_last_layer_is_minus_delta_over_lr():
    _, cap, _ = _capture()
    upd = Capture(cap.model_spec, cap.model_state, Protocol(scheme="fedavg", lr=0.1),
                  update={k: -0.1 * v for k, v in cap.gradients.items()})
    w, b = upd.last_layer()
    assert torch.allclose(w, cap.gradients["fc.weight"].double(), atol=1e-6)
    assert torch.allclose(b, cap.gradients["fc.bias"].double(), atol=1e-6)


def test_capture_rebuilds_model_and_rejects_bad_inputs():
    model, cap, _ = _capture()
    rebuilt = cap.model()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), rebuilt.state_dict().values()))
    with pytest.raises(CaptureError, match=r"\[0, 1\]"):
        capture_gradients(model, torch.randn(1, 3, 32, 32) * 5, torch.tensor([0]), Protocol())
    with pytest.raises(CaptureError, match="targets"):
        capture_gradients(model, torch.rand(2, 3, 32, 32), torch.tensor([0]), Protocol())
    with pytest.raises(CaptureError, match="simulate_client"):
        capture_gradients(model, torch.rand(1, 3, 32, 32), torch.tensor([0]), Protocol(scheme="fedavg"))


def test_dp_noise_and_clipping_change_the_shared_gradient():
    _, clean, _ = _capture()
    _, noisy, _ = _capture(protocol=Protocol(batch_size=2, dp_sigma=1e-2, dp_clip=0.5))
    norm = torch.sqrt(sum((g.double() ** 2).sum() for g in noisy.gradients.values()))
    assert not torch.allclose(noisy.gradients["fc.weight"], clean.gradients["fc.weight"])
    assert norm > 0


def test_public_names_exported():
    assert gi.Capture is Capture and callable(gi.reconstruct) and gi.Protocol is Protocol


def test_a_capture_and_a_truth_print_as_one_line_without_tensors():
    _, capture, truth = _capture()
    for obj in (capture, truth):
        text = repr(obj)
        assert "\n" not in text and len(text) < 300 and "tensor(" not in text
    assert "gradients: " in repr(capture) and "num_samples=2" in repr(capture)


def _counting(monkeypatch):
    """Count the NaN/Inf scans of gi.capture by tensor name."""
    import collections

    import gi.capture as capture_module

    seen = collections.Counter()
    scan = capture_module._check_finite

    def counted(group, name, t):
        seen[(group, name)] += 1
        scan(group, name, t)

    monkeypatch.setattr(capture_module, "_check_finite", counted)
    return seen


def test_the_finiteness_scan_runs_once_per_capture_across_the_stages(monkeypatch):
    model = build("mlp", 10, in_shape=(3, 8, 8), widths=(32, 16), bias=False, bias_last=False, seed=1)
    cap, _ = capture_gradients(model, torch.rand(1, 3, 8, 8, generator=torch.Generator().manual_seed(2)),
                               torch.tensor([3]), Protocol())
    seen = _counting(monkeypatch)
    analytic = gi.attack.run(cap, labels="soft-lambda", preset="default")  # labels, features, the inversion
    assert analytic.stages[2]["skipped"] and seen  # the inversion answered
    gi.attack.run(cap, labels="soft-lambda", preset="default", analytic=False, iterations=2, restarts=1, retries=0,
                  progress=False)  # labels, features, the reconstruction (its door validates)
    floats = {("shared", k) for k in cap.gradients} | {("model_state", k) for k, v in cap.model_state.items()
                                                       if v.is_floating_point()}
    assert set(seen) == floats and set(seen.values()) == {1}


def test_a_new_or_changed_capture_is_scanned_again(monkeypatch):
    import copy
    import dataclasses
    import pickle

    _, cap, _ = _capture()
    seen = _counting(monkeypatch)
    cap.check().check()
    once = sum(seen.values())
    assert once == len(cap.gradients) + len(cap.model_state)
    for other in (dataclasses.replace(cap), cap.to("cpu"), copy.deepcopy(cap), pickle.loads(pickle.dumps(cap))):
        before = sum(seen.values())
        other.check()
        assert sum(seen.values()) - before == once  # a new capture object starts unchecked
    before = sum(seen.values())
    cap.gradients["fc.bias"] = cap.gradients["fc.bias"].clone()  # a tensor replaced
    cap.check()
    assert sum(seen.values()) - before == 1 and seen[("shared", "fc.bias")] == 6
    cap.gradients["fc.bias"][0] = float("inf")  # changed in place: its version moves
    with pytest.raises(CaptureError, match="shared tensor 'fc.bias' contains NaN or Inf"):
        cap.check()
    assert "_checked" not in repr(cap) and dataclasses.replace(cap) == cap


def test_finite_entries_whose_sum_overflows_pass_the_scan():
    _, cap, _ = _capture()
    cap.history["big"] = torch.full((4,), 3e38)  # float32 sum: inf; every entry finite
    cap.history["half"] = torch.full((8,), 6e4, dtype=torch.float16)
    cap.check()
    cap.history["big"][1] = float("nan")
    with pytest.raises(CaptureError, match="history tensor 'big' contains NaN"):
        cap.check()

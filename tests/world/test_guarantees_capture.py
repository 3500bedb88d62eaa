"""Every malformed capture file, header or spec is a CaptureError naming the field or tensor."""

import json

import pytest
import torch
from safetensors.torch import save_file

from gi.capture import Capture, Truth
from gi.core.errors import CaptureError
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import capture_gradients
from gi.world.models import build


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    model = build("lenet", 10, seed=0)
    capture, truth = capture_gradients(model, torch.rand(1, 3, 32, 32), torch.tensor([3]), Protocol())
    folder = tmp_path_factory.mktemp("cap")
    capture.save(folder / "c.safetensors")
    truth.save(folder / "t.safetensors")
    return capture, folder


def _write(path, tensors, meta):
    header = {"gi": meta if isinstance(meta, str) else json.dumps(meta)}
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=header)


def _tensors(capture):
    out = {f"state/{k}": v for k, v in capture.model_state.items()}
    out.update({f"gradients/{k}": v for k, v in capture.gradients.items()})
    return out


def _meta(capture, **changes):
    meta = {"type": "capture", "model_spec": capture.model_spec, "protocol": capture.protocol.to_dict(),
            "has_gradients": True, "has_update": False, "meta": capture.meta}
    meta.update(changes)
    return {k: v for k, v in meta.items() if v is not _DROP}


_DROP = object()


def test_round_trip_and_legacy_extra(saved, tmp_path):
    capture, folder = saved
    back = Capture.load(folder / "c.safetensors")
    assert back.protocol == capture.protocol
    assert torch.equal(back.gradients["fc.weight"], capture.gradients["fc.weight"])
    proto = capture.protocol.to_dict()
    for key in ("local_steps", "dp_scale", "share_bn_stats"):
        proto.pop(key)
    proto["extra"] = {"local_steps": 3, "dp_scale": "step"}  # a capture written before the extras became fields
    _write(tmp_path / "old.safetensors", _tensors(capture), _meta(capture, protocol=proto))
    old = Capture.load(tmp_path / "old.safetensors")
    assert old.protocol.local_steps == 3 and old.protocol.dp_scale == "step"


@pytest.mark.parametrize("meta, match", [
    ("{not json", "not valid JSON"),
    ({"type": "capture"}, "'model_spec' is missing"),
    ("[1, 2]", "holds a 'list'"),
])
def test_malformed_headers(saved, tmp_path, meta, match):
    capture, _ = saved
    _write(tmp_path / "x.safetensors", _tensors(capture), meta)
    with pytest.raises(CaptureError, match=match):
        Capture.load(tmp_path / "x.safetensors")


@pytest.mark.parametrize("change, match", [
    ({"model_spec": "lenet"}, "'model_spec' is a str"),
    ({"model_spec": {"name": "lenet"}}, "needs a str 'name' and an int 'num_classes'"),
    ({"protocol": _DROP}, "'protocol' is missing"),
    ({"protocol": {"lr": "fast"}}, "protocol is invalid: protocol.lr=fast: expected float"),
    ({"protocol": {"nosuch": 1}}, "unknown config key"),
    ({"has_gradients": "yes"}, "'has_gradients' is a str, expected bool"),
    ({"meta": [1]}, "'meta' is a list"),
])
def test_malformed_fields(saved, tmp_path, change, match):
    capture, _ = saved
    _write(tmp_path / "x.safetensors", _tensors(capture), _meta(capture, **change))
    with pytest.raises(CaptureError, match=match):
        Capture.load(tmp_path / "x.safetensors")


def test_tensor_key_without_kind_and_truth_without_tensors(saved, tmp_path):
    capture, folder = saved
    _write(tmp_path / "x.safetensors", {**_tensors(capture), "weights": torch.zeros(2)}, _meta(capture))
    with pytest.raises(CaptureError, match="tensor 'weights' is not named '<kind>/<name>'"):
        Capture.load(tmp_path / "x.safetensors")
    _write(tmp_path / "t.safetensors", {"images": torch.zeros(1, 3, 2, 2)}, {"type": "truth"})
    with pytest.raises(CaptureError, match=r"truth tensor\(s\) \['counts', 'labels', 'targets'\] are missing"):
        Truth.load(tmp_path / "t.safetensors")


def test_state_or_spec_mismatch_is_a_capture_error(saved):
    capture, _ = saved
    import dataclasses

    wrong_state = dataclasses.replace(capture, model_state={**capture.model_state,
                                                            "fc.weight": torch.zeros(10, 7)})
    with pytest.raises(CaptureError, match="does not fit model 'lenet'.*fc.weight"):
        wrong_state.model()
    with pytest.raises(CaptureError, match="cannot be rebuilt"):
        dataclasses.replace(capture, model_spec={**capture.model_spec, "name": "nosuch"}).model()
    with pytest.raises(CaptureError, match=r"cannot be rebuilt: model 'lenet' takes no option\(s\) \['depth'\]"):
        dataclasses.replace(capture, model_spec={**capture.model_spec, "depth": 3}).model()


def test_check_at_the_door(saved):
    capture, _ = saved
    import dataclasses

    bad = dataclasses.replace(capture, gradients={**capture.gradients,
                                                  "body.0.weight": capture.gradients["body.0.weight"].int()})
    with pytest.raises(CaptureError, match="'body.0.weight' has dtype"):
        bad.check()
    nan_state = dataclasses.replace(capture, model_state={**capture.model_state,
                                                          "fc.bias": capture.model_state["fc.bias"] + float("inf")})
    with pytest.raises(CaptureError, match="model_state tensor 'fc.bias' contains NaN or Inf"):
        nan_state.check()


def test_bn_stats_are_a_typed_field_that_round_trips(saved, tmp_path):
    """The BatchNorm statistics a threat model grants: ``{module: (mean, var)}``, saved as their own kind; files that
    kept them as ``history/bn_stats/...`` keys still load; an unpaired entry is a CaptureError."""
    import dataclasses

    capture, _ = saved
    stats = {"body.1": (torch.arange(3.0), torch.ones(3))}
    dataclasses.replace(capture, bn_stats=stats).save(tmp_path / "bn.safetensors")
    back = Capture.load(tmp_path / "bn.safetensors")
    assert set(back.bn_stats) == {"body.1"} and not back.history
    assert torch.equal(back.bn_stats["body.1"][0], stats["body.1"][0])
    legacy = {**_tensors(capture), "history/bn_stats/body.1.mean": torch.zeros(3),
              "history/bn_stats/body.1.var": torch.ones(3)}
    _write(tmp_path / "old.safetensors", legacy, _meta(capture))
    old = Capture.load(tmp_path / "old.safetensors")
    assert set(old.bn_stats) == {"body.1"} and not old.history
    _write(tmp_path / "half.safetensors", {**_tensors(capture), "bn_stats/body.1.mean": torch.zeros(3)}, _meta(capture))
    with pytest.raises(CaptureError, match="bn_stats of 'body.1' need exactly a '.mean' and a '.var'"):
        Capture.load(tmp_path / "half.safetensors")
    nan = dataclasses.replace(capture, bn_stats={"body.1": (torch.zeros(3) + float("nan"), torch.ones(3))})
    with pytest.raises(CaptureError, match="bn_stats tensor 'body.1.mean' contains NaN"):
        nan.check()


@pytest.mark.parametrize("meta_change,match", [
    ({"meta": {"num_samples": 2.5}}, r"num_samples=2.5 must be an int"),
    ({"meta": {"num_samples": "one"}}, r"num_samples='one' must be an int"),
    ({"meta": {"num_samples": -3}}, r"num_samples=-3 must be an int"),
    ({"meta": {"num_samples": 10**30}}, r"must be an int in \[1, 1000000\]"),
])
def test_header_values_that_size_work_are_bounded_at_the_door(saved, tmp_path, meta_change, match):
    capture, _ = saved
    _write(tmp_path / "c.safetensors", _tensors(capture), _meta(capture, **meta_change))
    with pytest.raises(CaptureError, match=match):
        Capture.load(tmp_path / "c.safetensors")


@pytest.mark.parametrize("protocol_change,match", [({"local_steps": 10**9}, "local_steps must be an int in"),
                                                   ({"batch_size": 10**9}, "batch_size must be an int in"),
                                                   ({"local_epochs": 2.5}, "local_epochs=2.5: expected int"),
                                                   ({"lr": float("inf")}, r"protocol.lr must be a finite number"),
                                                   ({"lr": float("nan")}, r"protocol.lr must be a finite number"),
                                                   ({"lr": 1e-320}, r"protocol.lr must be in \[1e-12, 1e\+06\]"),
                                                   ({"lr": -0.1}, r"protocol.lr must be in"),
                                                   ({"momentum": float("nan")}, "protocol.momentum must be a finite"),
                                                   ({"dp_sigma": float("inf")}, "protocol.dp_sigma must be a finite")])
def test_protocol_sizes_in_a_header_are_bounded(saved, tmp_path, protocol_change, match):
    capture, _ = saved
    _write(tmp_path / "c.safetensors", _tensors(capture),
           _meta(capture, protocol={**capture.protocol.to_dict(), **protocol_change}))
    with pytest.raises(CaptureError, match=match):
        Capture.load(tmp_path / "c.safetensors")


def test_an_integer_past_the_digit_limit_is_a_capture_error(saved, tmp_path):
    capture, _ = saved
    meta = json.dumps(_meta(capture))[:-1] + ', "x": ' + "7" * 100_000 + "}"
    _write(tmp_path / "c.safetensors", _tensors(capture), meta)
    with pytest.raises(CaptureError, match="holds a value that cannot be read"):
        Capture.load(tmp_path / "c.safetensors")


def test_deeply_nested_header_json_is_refused_before_parsing(saved, tmp_path):
    capture, _ = saved
    meta = json.dumps(_meta(capture))[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    _write(tmp_path / "c.safetensors", _tensors(capture), meta)
    with pytest.raises(CaptureError, match="nests 100001 levels deep"):
        Capture.load(tmp_path / "c.safetensors")


def test_json_depth_counts_brackets_outside_strings_only():
    from gi.capture import json_depth

    assert json_depth('{"a": [1, {"b": "[[[{"}]}') == 3 and json_depth('"\\"[["') == 0 and json_depth("1") == 0


def _truth_with(saved, tmp_path, **changes):
    """The saved truth file with some tensors replaced, written and read back."""
    _, folder = saved
    truth = Truth.load(folder / "t.safetensors")
    tensors = {"images": truth.images, "labels": truth.labels, "targets": truth.targets, "counts": truth.counts}
    tensors.update(changes)
    _write(tmp_path / "t.safetensors", tensors, {"type": "truth", "meta": {}})
    return Truth.load(tmp_path / "t.safetensors")


@pytest.mark.parametrize("changes,match", [
    ({"images": (torch.rand(1, 3, 32, 32) * 255).to(torch.uint8)}, r"images are torch.uint8, not float pixels"),
    ({"images": torch.rand(1, 3, 32, 32) * 255}, r"pixels span \[.*\], not \[0, 1\]"),
    ({"images": torch.full((1, 3, 32, 32), float("nan"))}, "images contain NaN"),
    ({"labels": torch.tensor([-5]), "counts": torch.zeros(10, dtype=torch.long)}, r"labels span \[-5, -5\], outside"),
    ({"labels": torch.tensor([99])}, r"labels span \[99, 99\], outside the classes \[0, 10\)"),
    ({"counts": torch.ones(10, dtype=torch.long)}, "disagree with the labels' histogram"),
    ({"targets": torch.full((1, 10), float("nan"))}, "targets must be finite"),
    ({"labels": torch.tensor([3.0])}, "labels must be"),
])
def test_a_truth_that_would_make_a_score_meaningless_is_refused_at_load(saved, tmp_path, changes, match):
    with pytest.raises(CaptureError, match=match):
        _truth_with(saved, tmp_path, **changes)


def test_a_truth_is_checked_against_its_capture(saved, tmp_path):
    truth = _truth_with(saved, tmp_path)  # intact
    assert truth.check(10, [3, 32, 32]) is truth
    with pytest.raises(CaptureError, match=r"images are \(3, 32, 32\) but the capture's model takes \(1, 28, 28\)"):
        truth.check(10, [1, 28, 28])
    with pytest.raises(CaptureError, match="targets have 10 classes but the capture's model has 100"):
        truth.check(100)


def test_the_scorer_refuses_a_truth_it_would_have_clamped():
    from gi.analysis.metrics import psnr, score
    from gi.core.errors import ConfigError

    rec = torch.rand(2, 3, 16, 16)
    assert torch.isinf(psnr(rec, rec.clone())).all()
    with pytest.raises(ConfigError, match="truth images are torch.uint8"):
        score(rec, (rec * 255).to(torch.uint8))
    with pytest.raises(ConfigError, match=r"truth pixels span \[.*\], not \[0, 1\]"):
        psnr(rec, rec * 255)
    with pytest.raises(ConfigError, match="the truth images contain NaN"):
        psnr(rec, torch.full_like(rec, float("nan")))
    with pytest.raises(ConfigError, match="the reconstruction contains NaN"):
        psnr(torch.full_like(rec, float("nan")), rec)


def test_a_spec_whose_in_shape_disagrees_with_the_model_is_a_capture_error(saved, tmp_path):
    capture, _ = saved
    spec = {**capture.model_spec, "in_shape": [1, 28, 28]}  # a 3-channel LeNet (cifar10 normalisation) said grey
    _write(tmp_path / "c.safetensors", _tensors(capture), _meta(capture, model_spec=spec))
    loaded = Capture.load(tmp_path / "c.safetensors")
    with pytest.raises(CaptureError, match=r"cannot be rebuilt: The expanded size"):
        loaded.validate()

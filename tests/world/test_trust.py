"""No code runs from a capture file: a capture's header names its model's factory, and nothing it names is imported
or called unless the user trusts it (docs/architecture.md "Models and providers"; ``gi.world.models.trusted_factory``).

Exploit files are real captures whose JSON header (the safetensors metadata ``gi``) is rewritten to name
``os:system``, ``subprocess:check_call`` with ``shell: true``, ``runpy:run_path``, ``shutil:rmtree``, a module with
side effects at import, or a ``factory`` without a ``provider`` key; each goes through every entry point that
rebuilds a model. Then the trusted paths: ``trust_factory``, the user's factory, a registered factory, and
captures made in this process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import gi
import labels
from gi.capture import Capture
from gi.core.errors import CaptureError, ConfigError
from gi.world.bodies import BODIES, body_options
from gi.world.data import ImageDataset
from gi.world.models import FACTORIES, build, check_zoo_spec, from_factory, register_factory

SIZE, CLASSES = 8, 4


class Tiny(nn.Module):
    """A user CNN for 1×8×8 images: conv → ReLU → flatten → Linear ``head`` (4 classes)."""

    def __init__(self, classes: int = CLASSES) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(), nn.Flatten())
        self.head = nn.Linear(3 * SIZE * SIZE, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def make(classes: int = CLASSES, seed: int = 0) -> Tiny:
    torch.manual_seed(seed)
    return Tiny(classes)


FACTORY = f"{__name__}:make"


def _images(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, SIZE, SIZE, generator=g), torch.arange(n) % CLASSES


def _aux() -> ImageDataset:
    x, _ = _images(4 * CLASSES, seed=5)
    return ImageDataset(x, torch.arange(4 * CLASSES) % CLASSES, CLASSES)


@pytest.fixture()
def saved(tmp_path: Path) -> Path:
    """A real one-sample capture of a factory model, saved with Capture.save."""
    x, y = _images(1)
    capture, _ = gi.capture_gradients(from_factory(FACTORY, seed=1), x, y, gi.Protocol())
    capture.save(tmp_path / "good.safetensors")
    return tmp_path / "good.safetensors"


def forge(src: Path, dst: Path, spec: dict) -> Path:
    """``src`` with its header's model spec replaced by ``spec`` (what an attacker hands the server)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(src), framework="pt") as f:
        meta = json.loads(f.metadata()["gi"])
    meta["model_spec"] = spec
    save_file(load_file(str(src)), str(dst), metadata={"gi": json.dumps(meta)})
    return dst


# --------------------------------------------------------------------------- the routes
def _factory_spec(factory: str, **kwargs) -> dict:
    return {"provider": "factory", "name": factory, "factory": factory, "kwargs": kwargs, "num_classes": CLASSES,
            "in_shape": [1, SIZE, SIZE]}


def route_os_system(tmp: Path) -> tuple[dict, callable]:
    marker = tmp / "os_system_ran"
    return _factory_spec("os:system", command=f"touch {marker}"), lambda: not marker.exists()


def route_subprocess_shell(tmp: Path) -> tuple[dict, callable]:
    marker = tmp / "subprocess_ran"
    return (_factory_spec("subprocess:check_call", args=f"touch {marker}", shell=True),
            lambda: not marker.exists())


def route_runpy(tmp: Path) -> tuple[dict, callable]:
    marker = tmp / "runpy_ran"
    script = tmp / "payload.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('pwned')\n")
    return _factory_spec("runpy:run_path", path_name=str(script)), lambda: not marker.exists()


def route_rmtree(tmp: Path) -> tuple[dict, callable]:
    keep = tmp / "precious"
    keep.mkdir()
    (keep / "data.txt").write_text("keep me")
    return _factory_spec("shutil:rmtree", path=str(keep)), lambda: (keep / "data.txt").is_file()


def route_import_side_effect(tmp: Path) -> tuple[dict, callable]:
    marker = tmp / "imported"
    name = f"gi_trust_evil_{abs(hash(str(tmp))) % 10**8}"
    pkg = tmp / "evil_path"
    pkg.mkdir()
    (pkg / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').write('pwned')\n\ndef make(**kw):\n    return None\n")
    sys.path.insert(0, str(pkg))
    return _factory_spec(f"{name}:make"), lambda: not marker.exists() and name not in sys.modules


def route_no_provider(tmp: Path) -> tuple[dict, callable]:
    marker = tmp / "no_provider_ran"
    spec = _factory_spec("os:system", command=f"touch {marker}")
    del spec["provider"]
    return spec, lambda: not marker.exists()


ROUTES = {"os-system": route_os_system, "subprocess-shell": route_subprocess_shell, "runpy": route_runpy,
          "rmtree": route_rmtree, "import-side-effect": route_import_side_effect, "no-provider": route_no_provider}


# --------------------------------------------------------------------------- the entry points
def via_cli(path: Path, tmp: Path, capsys) -> str:
    from gi.cli import main

    code = main(["attack", str(path), f"out={tmp / 'attack-out'}", "attack.iterations=1", "attack.progress=false"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and not (tmp / "attack-out").exists()
    assert err.startswith("gi attack: error: ")
    return err


def via_validate(path: Path, tmp: Path, capsys) -> None:
    Capture.load(path).validate()


def via_model(path: Path, tmp: Path, capsys) -> None:
    Capture.load(path).model()


def via_invert(path: Path, tmp: Path, capsys) -> None:
    import fcn_analytic

    capture = Capture.load(path)
    fcn_analytic.invert(capture, labels.recover(capture, "idlg"))


def via_reconstruct(path: Path, tmp: Path, capsys) -> None:
    from gi.attack.recon import ReconConfig

    capture = Capture.load(path)
    gi.reconstruct(capture, labels.recover(capture, "idlg"), config=ReconConfig(iterations=1, progress=False))


def via_labels_aux(path: Path, tmp: Path, capsys) -> None:
    capture = Capture.load(path)
    labels.recover(capture, "posterior", aux=_aux())


def via_labels_auto_aux(path: Path, tmp: Path, capsys) -> None:
    """``auto`` on a batch with aux data dispatches to ``posterior``, which runs the model on the aux set."""
    import dataclasses

    capture = Capture.load(path)
    batch = dataclasses.replace(capture, meta={**capture.meta, "num_samples": 2})
    labels.recover(batch, "auto", aux=_aux())


ENTRIES = {"gi-attack": via_cli, "load-validate": via_validate, "model": via_model, "invert": via_invert,
           "reconstruct": via_reconstruct, "labels-posterior-aux": via_labels_aux,
           "labels-auto-aux": via_labels_auto_aux}


@pytest.fixture()
def clean_path():
    before = list(sys.path)
    yield
    sys.path[:] = before


@pytest.mark.parametrize("entry", list(ENTRIES))
@pytest.mark.parametrize("route", list(ROUTES))
def test_an_exploit_capture_runs_nothing_and_says_how_to_trust_it(route, entry, saved, tmp_path, capsys,
                                                                   clean_path):
    spec, harmless = ROUTES[route](tmp_path)
    path = forge(saved, tmp_path / "evil.safetensors", spec)
    if entry == "gi-attack":
        message = via_cli(path, tmp_path, capsys)
    else:
        with pytest.raises(CaptureError) as info:
            ENTRIES[entry](path, tmp_path, capsys)
        message = str(info.value)
    assert harmless(), f"{route} via {entry} ran the file's code"
    assert "\n" not in message
    if route == "no-provider":
        assert "no 'provider'" in message and "never a factory" in message
    else:
        assert repr(spec["factory"]) in message
        for way in ("model=pkg.mod:fn", "factory=fn", "register_factory", "trust_factory=true",
                    "trust_factory=True"):
            assert way in message, (way, message)


def test_a_trusted_path_is_never_taken_without_the_flag(saved, tmp_path, clean_path):
    """trust_factory must be True itself: a truthy string from a config or a JSON file does not count."""
    spec, harmless = route_os_system(tmp_path)
    path = forge(saved, tmp_path / "evil.safetensors", spec)
    with pytest.raises(CaptureError, match="trust_factory"):
        Capture.load(path, trust_factory="yes").model()  # type: ignore[arg-type]
    assert harmless()


# --------------------------------------------------------------------------- the zoo's schema
@pytest.mark.parametrize("change, message", [
    ({"name": "nosuch"}, "names model 'nosuch'"),
    ({"num_classes": 10**9}, r"num_classes=1000000000: expected an int in \[2, 100000\]"),
    ({"num_classes": True}, "num_classes=True"),
    ({"in_shape": [3, 10**6, 32]}, r"in_shape\[1\]=1000000"),
    ({"in_shape": [3, 32]}, r"in_shape=\[3, 32\]: expected \[C, H, W\]"),
    ({"activation": "os.system"}, "activation='os.system'"),
    ({"norm": 3}, "norm=3"),
    ({"init": "pickle"}, "init='pickle'"),
    ({"bias_last": "yes"}, "bias_last='yes'"),
    ({"seed": 1.5}, "seed=1.5"),
    ({"widths": [10**9]}, r"widths\[0\]=1000000000"),
    ({"widths": 7}, "widths=7: expected a list"),
    ({"bias": 1}, "bias=1: expected true or false"),
    ({"factory": "os:system"}, "no 'provider'"),
    ({"depth": 3}, r"takes no option\(s\) \['depth'\]"),
])
def test_zoo_specs_are_checked_against_the_zoo_schema_at_load(change, message, tmp_path):
    x = torch.rand(1, 1, SIZE, SIZE)
    capture, _ = gi.capture_gradients(build("mlp", CLASSES, in_shape=(1, SIZE, SIZE), seed=0), x, torch.tensor([1]),
                                      gi.Protocol())
    capture.save(tmp_path / "zoo.safetensors")
    spec = {**capture.model_spec, **change}
    if "provider" in change or "factory" in change:
        spec.pop("provider", None)
    path = forge(tmp_path / "zoo.safetensors", tmp_path / "bad.safetensors", spec)
    with pytest.raises(CaptureError, match=message):
        Capture.load(path)


def test_a_huge_zoo_spec_within_bounds_is_refused_before_anything_is_allocated(tmp_path):
    """Bounded ints still multiply: an mlp of 8 layers of 65536 units over 3×4096×4096 pixels would take terabytes.
    The model is first built on the meta device and its shapes checked against the (small) captured state."""
    x = torch.rand(1, 1, SIZE, SIZE)
    capture, _ = gi.capture_gradients(build("mlp", CLASSES, in_shape=(1, SIZE, SIZE), seed=0), x, torch.tensor([1]),
                                      gi.Protocol())
    capture.save(tmp_path / "zoo.safetensors")
    spec = {**capture.model_spec, "in_shape": [3, 4096, 4096], "widths": [65536] * 8}
    path = forge(tmp_path / "zoo.safetensors", tmp_path / "huge.safetensors", spec)
    with pytest.raises(CaptureError, match="does not fit model 'mlp'"):
        Capture.load(path).model()


def test_every_zoo_model_and_option_has_a_schema():
    """Each body's options (with their defaults) pass the schema: a new body or option needs no schema edit unless
    its type is new (then the schema raises KeyError here)."""
    import inspect

    for name in BODIES:
        check_zoo_spec({"name": name, "num_classes": 10})
        for option in body_options(name):
            default = inspect.signature(BODIES[name][0]).parameters[option].default
            if default is not None:
                check_zoo_spec({"name": name, "num_classes": 10,
                                option: list(default) if isinstance(default, tuple) else default})


# --------------------------------------------------------------------------- the trusted paths
def _same_outputs(a: nn.Module, b: nn.Module) -> None:
    x, _ = _images(2, seed=3)
    torch.testing.assert_close(a.eval()(x), b.eval()(x))


def test_trust_factory_rebuilds_and_every_later_stage_sees_the_trust(saved):
    capture = Capture.load(saved, trust_factory=True)
    assert capture.trust_factory and capture.to("cpu").trust_factory
    model = capture.model()
    assert isinstance(model, Tiny) and model.gi_last_layer == "head"
    _same_outputs(model, from_factory(FACTORY, seed=1))
    result = labels.recover(capture, "posterior", aux=_aux())  # reads the rebuilt model on the aux set
    assert result.counts.sum() == 1
    again, _ = gi.capture_gradients(model, *_images(1), gi.Protocol())  # a capture of it keeps the provenance
    assert again.model_spec["factory"] == FACTORY and isinstance(again.model(), Tiny)


def test_the_users_factory_rebuilds_an_untrusted_file(saved):
    _same_outputs(Capture.load(saved, factory=make).model(), from_factory(FACTORY, seed=1))
    _same_outputs(Capture.load(saved, factory=FACTORY).model(), from_factory(FACTORY, seed=1))
    import dataclasses

    zoo, _ = gi.capture_gradients(build("mlp", CLASSES, in_shape=(1, SIZE, SIZE)), *_images(1), gi.Protocol())
    with pytest.raises(CaptureError, match="a factory was given, but the model spec's provider is 'zoo'"):
        dataclasses.replace(zoo, factory=make).model()


def test_a_registered_factory_rebuilds_without_trust(saved):
    assert FACTORY not in FACTORIES
    try:
        register_factory(FACTORY, make)
        register_factory(FACTORY, make)  # the same callable again is fine
        _same_outputs(Capture.load(saved).model(), from_factory(FACTORY, seed=1))
        with pytest.raises(ValueError, match="registered twice"):
            register_factory(FACTORY, Tiny)
    finally:
        FACTORIES.pop(FACTORY, None)
    try:
        @register_factory("somepkg.nets:tiny")
        def tiny(classes: int = CLASSES, seed: int = 0) -> Tiny:
            return make(classes, seed)

        spec = dict(Capture.load(saved).model_spec, factory="somepkg.nets:tiny", name="somepkg.nets:tiny")
        assert isinstance(gi.world.models.from_spec(spec), Tiny)  # nothing named somepkg is imported
        assert "somepkg" not in sys.modules
    finally:
        FACTORIES.pop("somepkg.nets:tiny", None)
    with pytest.raises(ConfigError, match="import string"):
        register_factory("no_colon", make)
    with pytest.raises(CaptureError, match="trust_factory"):
        Capture.load(saved).model()  # unregistered again


def test_captures_made_in_this_process_need_no_trust_and_saved_ones_do(tmp_path):
    x, y = _images(1)
    from_own_class, _ = gi.capture_gradients(make(), x, y, gi.Protocol())  # spec: the class's import string
    from_a_factory, _ = gi.capture_gradients(from_factory(FACTORY), x, y, gi.Protocol())
    model = make()
    grads = dict(zip([n for n, _ in model.named_parameters()],
                     torch.autograd.grad(nn.functional.cross_entropy(model(x), y), list(model.parameters()))))
    from_gradients = Capture.from_gradients(model, grads, gi.Protocol(), 1, in_shape=(1, SIZE, SIZE))
    update, _ = gi.simulate_client(from_factory(FACTORY), (torch.cat([x, x]), torch.cat([y, y])),
                                   gi.Protocol(scheme="fedavg", batch_size=2), torch.Generator().manual_seed(0))
    for capture in (from_own_class, from_a_factory, from_gradients, update):
        assert isinstance(capture.model(), Tiny) and not capture.trust_factory
        capture.save(tmp_path / "c.safetensors")
        with pytest.raises(CaptureError, match="named in the file"):
            Capture.load(tmp_path / "c.safetensors").model()
    result = labels.recover(update, "rlu", aux=_aux())  # RLU's gradient view keeps the in-process builder
    assert result.ok


@pytest.mark.slow  # one short gi attack: Lightning's start-up
def test_gi_attack_with_trust_factory_true_runs(saved, tmp_path, capsys):
    from gi.cli import main

    out = tmp_path / "out"
    code = main(["attack", str(saved), f"out={out}", "attack.iterations=2", "attack.progress=false",
                 "trust_factory=true"])
    assert code == 0, capsys.readouterr().err
    assert (out / "metrics.json").is_file()


def test_gi_attack_help_states_the_risk_and_checks_model():
    from gi.cli import COMMANDS
    from gi.experiments.config.attack import load_attack_config

    text = COMMANDS["attack"][1]
    assert "model=pkg.mod:fn" in text and "trust_factory=true" in text and "trusted source" in text
    with pytest.raises(ConfigError, match="model='nocolon'"):
        load_attack_config("x.safetensors", ["model=nocolon"])
    assert load_attack_config("x.safetensors", ["trust_factory=true"]).trust_factory is True

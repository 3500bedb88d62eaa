import pytest
import torch

from gi.core.errors import ConfigError
from gi.world.bodies import ACTIVATIONS, BODIES
from gi.world.models import build, from_spec


@pytest.mark.parametrize("name", ["lenet", "lenet5", "fcn3", "linear", "cnn", "resnet32", "mlp", "convnet"])
def test_models_build_forward_and_rebuild_from_spec(name):
    m = build(name, 10, seed=3).eval()  # eval: BN running stats stay as built
    x = torch.rand(2, 3, 32, 32)
    out = m(x)
    assert out.shape == (2, 10)
    assert m.features(x).shape == (2, m.feature_dim)
    m2 = from_spec(m.spec)
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), m2.state_dict().values()))


def test_dlg_lenet_is_sigmoid_with_768_features():
    m = build("lenet", 10)
    assert m.spec["activation"] == "sigmoid" and m.feature_dim == 768


def test_fcn4_is_bias_free_with_paper_widths():
    m = build("fcn4", 10, in_shape=(3, 64, 64), widths=(64, 32, 16))
    linears = [mod for mod in m.modules() if isinstance(mod, torch.nn.Linear)]
    assert [lin.in_features for lin in linears] == [12288, 64, 32, 16]
    assert all(lin.bias is None for lin in linears[:-1])


def test_convnet_is_inverting_gradients_layout():
    m = build("convnet", 10, width=4)
    convs = [mod for mod in m.modules() if isinstance(mod, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [4, 8, 8, 16, 16, 16, 16, 16]
    assert sum(isinstance(mod, torch.nn.BatchNorm2d) for mod in m.modules()) == 8
    assert sum(isinstance(mod, torch.nn.MaxPool2d) for mod in m.modules()) == 2
    assert m.feature_dim == 36 * 4  # 32 -> 10 -> 3 after the two 3x3 pools


def test_activation_switch_and_inits():
    m = build("lenet5", 10, activation="tanh", init="uniform", seed=0)
    assert any(isinstance(mod, torch.nn.Tanh) for mod in m.modules())
    assert all(p.abs().max() <= 0.5 for p in m.parameters())
    z = build("lenet5", 10, init="zero-last")
    assert torch.count_nonzero(z.fc.weight) == 0
    nb = build("lenet", 10, bias_last=False)
    assert nb.fc.bias is None and "fc.bias" not in dict(nb.named_parameters())


def test_normalisation_is_first_layer():
    m = build("linear", 2, norm="half")
    x = torch.full((1, 3, 32, 32), 0.5)
    assert torch.allclose(m.normalize(x), torch.zeros_like(x))


def test_resnet18_activation_swapped():
    m = build("resnet18", 10, activation="elu")
    assert not any(isinstance(mod, torch.nn.ReLU) for mod in m.modules())
    assert sum(isinstance(mod, torch.nn.ELU) for mod in m.modules()) > 5


@pytest.mark.parametrize("kwargs, match", [({"name": "alexnet9"}, "unknown model"),
                                           ({"name": "lenet", "activation": "gelu2"}, "unknown activation"),
                                           ({"name": "lenet", "init": "xavier9"}, "unknown init")])
def test_build_errors_list_valid_values(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        build(num_classes=10, **kwargs)


def test_registries_cover_design_names():
    assert {"lenet", "lenet5", "fcn4", "resnet18", "resnet32", "resnet50", "vgg16"} <= set(BODIES)
    assert {"relu", "tanh", "sigmoid", "elu", "selu", "silu", "leaky_relu"} <= set(ACTIVATIONS)


def test_unknown_model_options_are_config_errors_listing_the_valid_ones():
    from gi.core.errors import ConfigError
    from gi.world.bodies import body_options

    msg = r"model 'fcn4' takes no option\(s\) \['width'\]; valid: \['bias', 'widths'\]"
    with pytest.raises(ConfigError, match=msg):
        build("fcn4", 10, width=3)
    assert body_options("resnet18") == ["stem"] and body_options("lenet") == []
    assert build("resnet18", 10, stem="cifar").spec["stem"] == "cifar"


def test_resnet32_with_group_norm_normalises_each_sample_alone():
    """``norm_layer: group``: the same ResNet-32 with GroupNorm in place of every BatchNorm (same module names), so a
    sample's output in train mode does not depend on the rest of its batch; the option is checked at build and in a
    capture's spec."""
    from gi.core.errors import CaptureError
    from gi.world.models import check_zoo_spec

    batch, group = build("resnet32", 10, seed=0), build("resnet32", 10, seed=0, norm_layer="group")
    norms = {n for n, m in group.named_modules() if isinstance(m, torch.nn.GroupNorm)}
    assert norms == {n for n, m in batch.named_modules() if isinstance(m, torch.nn.BatchNorm2d)} and len(norms) == 33
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in group.modules())
    assert {m.num_groups for m in group.modules() if isinstance(m, torch.nn.GroupNorm)} == {8}
    x = torch.rand(3, 3, 32, 32)
    torch.testing.assert_close(group.train()(x)[:1], group(x[:1]))
    assert from_spec(group.spec).spec["norm_layer"] == "group"
    with pytest.raises(ConfigError, match="unknown norm_layer 'layer'; valid: \\['batch', 'group'\\]"):
        build("resnet32", 10, norm_layer="layer")
    with pytest.raises(CaptureError, match="norm_layer='layer'"):
        check_zoo_spec({**group.spec, "norm_layer": "layer"})

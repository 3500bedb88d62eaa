import pytest

from gi.core.errors import ConfigError
from gi.world.fl.protocol import Protocol


def test_protocol_round_trip_and_update_flag():
    p = Protocol(scheme="fedprox", prox_mu=0.5, local_epochs=3, label_aug="smoothing")
    assert Protocol.from_dict(p.to_dict()) == p
    assert p.is_update and not Protocol().is_update


@pytest.mark.parametrize("kwargs, key", [({"scheme": "fedsgdd"}, "scheme"), ({"loss": "mse"}, "loss"),
                                         ({"label_aug": "cutmix"}, "label_aug"), ({"batch_size": 0}, "batch_size"),
                                         ({"label_eps": 1.5}, "label_eps"), ({"lr": float("inf")}, "lr"),
                                         ({"lr": float("nan")}, "lr"), ({"lr": 0.0}, "lr"), ({"lr": 1e-320}, "lr"),
                                         ({"temperature": float("inf")}, "temperature"),
                                         ({"weight_decay": float("nan")}, "weight_decay")])
def test_protocol_rejects_bad_values_naming_the_key(kwargs, key):
    with pytest.raises(ConfigError, match=key):
        Protocol(**kwargs)


def test_protocol_from_dict_unknown_key():
    with pytest.raises(ConfigError, match="valid"):
        Protocol.from_dict({"learning_rate": 0.1})

"""Models built by name: parameter counts of the papers' tables, logits, seeding, errors."""
from __future__ import annotations

import pytest
import torch

from fairfl.base.errors import ConfigError
from fairfl.federated.models import MODELS, build_model, has_randomness, num_parameters

SHAPES = {"cnn_cifar10": (3, 32, 32), "cnn_fmnist": (1, 28, 28), "cnn_femnist": (1, 28, 28),
          "mlp2": (1, 28, 28), "logreg": (99,)}


@pytest.mark.parametrize("name, num_classes, expected", [
    ("cnn_cifar10", 10, 797_962),    # FedMGDA+ Table 2
    ("cnn_fmnist", 10, 21_840),      # FedMGDA+ Table 3
    ("cnn_femnist", 62, 1_206_590),  # FedMGDA+ Table 4
])
def test_parameter_counts_of_the_papers(name, num_classes, expected):
    assert num_parameters(build_model(name, SHAPES[name], num_classes, seed=0)) == expected


def test_parameter_counts_dropout_free_and_small_models():
    assert num_parameters(build_model("cnn_fmnist", (1, 28, 28), 10, dropout=False)) == 21_840
    assert num_parameters(build_model("cnn_femnist", (1, 28, 28), 62, dropout=False)) == 1_206_590
    # 784*200+200 + 200*200+200 + 200*10+10
    assert num_parameters(build_model("mlp2", (1, 28, 28), 10)) == 199_210
    assert num_parameters(build_model("logreg", (99,), 2)) == 200


def test_every_registered_model_is_covered():
    # the character LSTM reads int64 token windows, not float inputs: tests/test_shakespeare.py;
    # the multi-task LeNet has one head per task: tests/test_fmgda.py
    assert set(MODELS) == set(SHAPES) | {"lstm_shakespeare", "multi_lenet"}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_outputs_are_logits(name):
    nc = 62 if name == "cnn_femnist" else 10
    model = build_model(name, SHAPES[name], nc, seed=1).eval()
    x = torch.randn(8, *SHAPES[name], generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(x)
    assert out.shape == (8, nc)
    assert torch.isfinite(out).all()
    # not a softmax (rows would sum to 1, all >= 0) and not a log-softmax (exp sums to 1)
    assert not torch.allclose(out.sum(1), torch.ones(8), atol=1e-3)
    assert (out < 0).any()
    assert not torch.allclose(out.exp().sum(1), torch.ones(8), atol=1e-3)


def test_same_seed_same_weights_other_seed_other_weights():
    a = build_model("cnn_fmnist", (1, 28, 28), 10, seed=7)
    torch.manual_seed(123)  # the global generator must not matter
    torch.rand(10)
    b = build_model("cnn_fmnist", (1, 28, 28), 10, seed=7)
    c = build_model("cnn_fmnist", (1, 28, 28), 10, seed=8)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    assert any(not torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters()))


def test_seeded_build_leaves_global_generator_alone():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    build_model("mlp2", (1, 28, 28), 10, seed=5)
    assert torch.equal(torch.rand(3), expected)


def test_unknown_model_name():
    with pytest.raises(ConfigError, match="unknown model 'resnet9000'"):
        build_model("resnet9000", (1, 28, 28), 10)


@pytest.mark.parametrize("name, shape", [
    ("cnn_fmnist", (3, 32, 32)),
    ("cnn_fmnist", (99,)),
    ("cnn_cifar10", (1, 28, 28)),
    ("cnn_femnist", (3, 28, 28)),
])
def test_wrong_input_shape_for_a_cnn(name, shape):
    with pytest.raises(ConfigError, match=r"takes inputs of shape"):
        build_model(name, shape, 10)


def test_has_randomness():
    assert has_randomness(build_model("cnn_fmnist", (1, 28, 28), 10))
    assert not has_randomness(build_model("cnn_fmnist", (1, 28, 28), 10, dropout=False))
    assert not has_randomness(build_model("mlp2", (1, 28, 28), 10))


def test_dropout_free_model_is_deterministic_in_train_mode():
    model = build_model("cnn_fmnist", (1, 28, 28), 10, seed=0, dropout=False).train()
    x = torch.randn(4, 1, 28, 28)
    assert torch.equal(model(x), model(x))
    noisy = build_model("cnn_fmnist", (1, 28, 28), 10, seed=0).train()
    assert not torch.equal(noisy(x), noisy(x))

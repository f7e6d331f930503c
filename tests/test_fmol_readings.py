"""The reference codes' readings of FMOL's MultiMNIST setting, as off-by-default options:
Sener & Koltun's two-task min-norm closed form (``solver="sener_koltun"``), their pixel
scaling (``normalize="mnist"``) and construction (``construction="sener_koltun"``), and the
``init`` probes of the MultiLeNet. Hand-computed vectors for the solver, real MultiMNIST
(mnist_5k) for the data, real models for the initialisation; every default keeps the cache key
that configs had before the options existed."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fairfl import ConfigError, ExperimentConfig, LocalTraining, PartitionSpec
from fairfl.federated.algorithms import Context
from fairfl.federated.algorithms.fmgda import FMGDA
from fairfl.federated.messages import ClientUpdates
from fairfl.federated.minnorm import min_norm_direction, min_norm_weights, sener_koltun_weights
from fairfl.federated.models import build_model
from fairfl.studies.paper import fmol_config


# ----------------------------------------------------------------------------- the S&K solver

def gram(g1, g2):
    v = np.array([g1, g2], dtype=np.float64)
    return v @ v.T


# (g1, g2, γ = the weight of g1), each γ worked out by hand from v11 = |g1|², v12 = g1·g2, v22 = |g2|²
HAND = [
    # orthogonal: interior, γ = v22 / (v11 + v22) = 16 / 25
    ([3.0, 0.0], [0.0, 4.0], 0.64),
    # opposite: v12 = −3 < both; γ = (9 + 3) / (1 + 9 + 6) = 0.75, and d = 0.75·1 − 0.25·3 = 0
    ([1.0, 0.0], [-3.0, 0.0], 0.75),
    # parallel, g2 = 2·g1: v12 = 10 ≥ v11 = 5 → the g1 end, 0.999 (the exact QP: 1)
    ([1.0, 2.0], [2.0, 4.0], 0.999),
    # parallel, g2 = g1 / 2: v12 = 10 < v11 = 20, v12 ≥ v22 = 5 → the g2 end, 0.001
    ([2.0, 4.0], [1.0, 2.0], 0.001),
    # identical: v12 = v11 is tested first → 0.999
    ([1.0, 1.0], [1.0, 1.0], 0.999),
    # both zero: 0 ≥ 0 on the first test → 0.999
    ([0.0, 0.0], [0.0, 0.0], 0.999),
    # g1 zero: v12 = 0 ≥ v11 = 0 → 0.999 (nearly all weight on the zero vector)
    ([0.0, 0.0], [1.0, 2.0], 0.999),
    # g2 zero: v12 = 0 < v11 = 1, v12 ≥ v22 = 0 → 0.001
    ([1.0, 0.0], [0.0, 0.0], 0.001),
    # interior next to the g1 end: γ = (1.99900025 − 0.9995) / (1 + 0.0005²) = 0.99950025 / 1.00000025,
    # not clipped to 0.999 (the code clips only in its two end-point branches)
    ([0.0, 1.0], [1.0, 0.9995], 0.99950025 / 1.00000025),
]


@pytest.mark.parametrize("g1, g2, gamma", HAND)
def test_sener_koltun_closed_form_on_hand_made_vectors(g1, g2, gamma):
    lam = min_norm_weights(gram(g1, g2), solver="sener_koltun")
    np.testing.assert_allclose(lam, [gamma, 1 - gamma], rtol=0, atol=1e-12)
    np.testing.assert_array_equal(lam, sener_koltun_weights(gram(g1, g2)))
    d, lam_t = min_norm_direction(torch.tensor([g1, g2], dtype=torch.float64), solver="sener_koltun")
    torch.testing.assert_close(d, gamma * torch.tensor(g1, dtype=torch.float64)
                               + (1 - gamma) * torch.tensor(g2, dtype=torch.float64), rtol=0, atol=1e-12)


def test_sener_koltun_equals_the_exact_qp_inside_and_differs_only_at_a_vertex():
    for g1, g2, gamma in HAND:
        exact = min_norm_weights(gram(g1, g2))
        sk = sener_koltun_weights(gram(g1, g2))
        if gamma in (0.001, 0.999):
            # a vertex: the exact QP gives the other vector nothing (or, when the objective is
            # flat, some optimal λ); the closed form always keeps 0.001 on it
            assert min(sk) == pytest.approx(0.001, abs=1e-15)
        else:
            np.testing.assert_allclose(sk, exact, atol=1e-8)
    np.testing.assert_allclose(min_norm_weights(gram([1.0, 2.0], [2.0, 4.0])), [1.0, 0.0], atol=1e-8)


@pytest.mark.parametrize("kwargs, match", [
    (dict(gram=np.eye(3)), "closed form for two vectors; got 3"),
    (dict(gram=np.eye(2), eps=0.5), "needs eps >= 1, got eps=0.5"),
    (dict(gram=np.eye(2), lam0=[0.5, 0.5]), "takes no lam0"),
    (dict(gram=np.eye(2), solver="sener-koltun"), "unknown min-norm solver 'sener-koltun'"),
])
def test_sener_koltun_refuses_what_it_does_not_define(kwargs, match):
    kwargs = {"solver": "sener_koltun", **kwargs}
    with pytest.raises(ConfigError, match=match):
        min_norm_weights(**kwargs)


def message(updates, shared=None):
    u = torch.as_tensor(updates, dtype=torch.float64)
    return ClientUpdates(np.arange(u.shape[0]), u, torch.full((u.shape[0],), 10), shared=shared)


def test_fmgda_with_the_sener_koltun_solver_on_shared_parameters():
    """Their MGDA: the closed form on the trunk's coordinates; every coordinate moves by λ."""
    # one client, two objectives, d = 4: trunk = coordinates 0–1, head L = 2, head R = 3
    updates = torch.tensor([[[2.0, 4.0, 5.0, 0.0], [1.0, 2.0, 0.0, 7.0]]], dtype=torch.float64)
    shared = torch.tensor([True, True, False, False])
    agg = FMGDA(solver="sener_koltun", qp_params="shared").aggregate(message(updates, shared), None, Context())
    # trunk parts [2, 4] and [1, 2]: the hand case "g2 = g1 / 2" → γ = 0.001
    np.testing.assert_allclose(agg.info["lambda"], [0.001, 0.999], atol=1e-15)
    torch.testing.assert_close(agg.direction, 0.001 * updates[0, 0] + 0.999 * updates[0, 1])
    exact = FMGDA(qp_params="shared").aggregate(message(updates, shared), None, Context())
    np.testing.assert_allclose(exact.info["lambda"], [0.0, 1.0], atol=1e-8)    # head L would not move at all
    with pytest.raises(ConfigError, match="closed form for two objectives; the model has 3"):
        FMGDA(solver="sener_koltun").aggregate(message(torch.ones(1, 3, 4)), None, Context())
    with pytest.raises(ConfigError, match="solver='sener-koltun' is not allowed"):
        FMGDA(solver="sener-koltun")


# ----------------------------------------------------------------------------- initialisation

def linear_layers(model):
    return [m for m in model.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]


@pytest.mark.parametrize("init", ["xavier", "kaiming"])
def test_init_probes_draw_their_bounds_and_zero_biases(init):
    a = build_model("multi_lenet", (1, 28, 28), 10, seed=3, tasks=2, init=init)
    b = build_model("multi_lenet", (1, 28, 28), 10, seed=3, tasks=2, init=init)
    c = build_model("multi_lenet", (1, 28, 28), 10, seed=4, tasks=2, init=init)
    default = build_model("multi_lenet", (1, 28, 28), 10, seed=3, tasks=2)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)                                  # one seed, one model
    assert not torch.equal(next(a.parameters()), next(c.parameters()))
    for layer in linear_layers(a):
        w = layer.weight.detach().double()
        fan_in = w[0].numel()
        fan_out = w.shape[0] * (w[0, 0].numel() if w.ndim == 4 else 1)
        bound = math.sqrt(6 / (fan_in + fan_out)) if init == "xavier" else math.sqrt(6 / fan_in)
        assert float(w.abs().max()) <= bound
        if w.numel() >= 10_000:          # Linear 320→50: the variance of U(−a, a) is a²/3, to ~1 %
            assert float(w.var()) == pytest.approx(bound ** 2 / 3, rel=0.05)
        assert torch.count_nonzero(layer.bias) == 0
    # the default is PyTorch's: biases drawn too, and weights on ±1/√fan_in (not the probes' scale)
    fc = linear_layers(default)[2]
    assert torch.count_nonzero(fc.bias) == 50 and float(fc.weight.detach().abs().max()) <= 1 / math.sqrt(320)


def test_init_option_is_validated_and_enters_the_key_only_when_set():
    with pytest.raises(ConfigError, match="init='he' is not allowed; it must be one of 'default', 'xavier', 'kaiming'"):
        ExperimentConfig(dataset="multimnist", model="multi_lenet", model_options={"init": "he"})
    with pytest.raises(ConfigError, match="unknown option"):
        ExperimentConfig(model="cnn_fmnist", model_options={"init": "xavier"})
    base = fmol_config(K=1, iid=True)
    explicit = base.replace(model_options={"init": "default"})
    assert explicit.key() == base.key() and "init" not in explicit.to_dict()["model_options"]
    assert base.replace(model_options={"init": "xavier"}).key() != base.key()


# ----------------------------------------------------------------------------- pixels and construction

@pytest.fixture(scope="module")
def base5k(fairfl_env):
    from fairfl.federated.data import load_dataset
    return load_dataset("mnist_5k", normalize="none")


def test_normalize_mnist_is_sener_koltuns_fixed_standardisation(fairfl_env):
    from fairfl.federated.data import load_dataset
    raw = load_dataset("multimnist", source="mnist_5k", seed=0, normalize="none")
    sk = load_dataset("multimnist", source="mnist_5k", seed=0, normalize="mnist")
    ours = load_dataset("multimnist", source="mnist_5k", seed=0)
    assert float(raw.x_train.min()) == 0.0 and float(raw.x_train.max()) == 1.0
    torch.testing.assert_close(sk.x_train, (raw.x_train - 0.1307) / 0.3081)
    torch.testing.assert_close(sk.x_test, (raw.x_test - 0.1307) / 0.3081)
    # the composite set is darker than MNIST (a 36-pixel canvas shrunk to 28), so MNIST's
    # statistics leave it off-centre: mean (0.152 − 0.1307)/0.3081 ≈ 0.07, std 0.299/0.3081 ≈ 0.97
    assert float(sk.x_train.mean()) == pytest.approx((float(raw.x_train.mean()) - 0.1307) / 0.3081, abs=1e-5)
    assert 0.05 < float(sk.x_train.mean()) < 0.1 and 0.9 < float(sk.x_train.std()) < 1.0
    assert abs(float(ours.x_train.mean())) < 1e-4 and abs(float(ours.x_train.std()) - 1) < 1e-4
    with pytest.raises(ConfigError, match="normalize='sk' is not allowed"):
        ExperimentConfig(dataset="multimnist", model="multi_lenet", dataset_options={"normalize": "sk"})
    with pytest.raises(ConfigError, match="construction='s&k' is not allowed"):
        ExperimentConfig(dataset="multimnist", model="multi_lenet", dataset_options={"construction": "s&k"})


def test_sener_koltun_construction_places_scales_and_resizes_as_their_loader():
    from fairfl.federated.data.multimnist import compose
    left, right = torch.zeros(1, 1, 28, 28), torch.zeros(1, 1, 28, 28)
    left[..., :6, :6] = 0.5                # the canvas's maximum is 0.5: byte-scaling lifts it to 1
    right[..., -6:, -6:] = 0.25            # → 0.5 after scaling, stored in 8 bits: floor(127.5 + 0.5) / 255
    big = compose(left, right, canvas=36, size=36, construction="sener_koltun")
    assert big[0, 0, :6, :6].min() == 1.0
    assert torch.all(big[0, 0, 28:34, 28:34] == 128 / 255)   # right image at rows/columns 6–33
    assert big[0, 0, 34:, :].max() == 0.0 and big[0, 0, :, 34:].max() == 0.0
    ours = compose(left, right, canvas=36, size=36)
    assert torch.all(ours[0, 0, 30:, 30:] == 0.25) and ours[0, 0, :6, :6].max() == 0.5
    # 8-bit rounding of the byte-scaled canvas
    odd = torch.zeros(1, 1, 28, 28)
    odd[..., 0, 0], odd[..., 0, 1] = 1.0, 0.3
    out = compose(odd, torch.zeros_like(odd), canvas=36, size=36, construction="sener_koltun")
    assert float(out[0, 0, 0, 1]) == pytest.approx(77 / 255)       # floor(0.3·255 + 0.5) = 77
    # 36 → 28 by pixel-centre nearest neighbour: output i reads source floor((i + 0.5)·36/28)
    ramp = torch.arange(36, dtype=torch.float32).div(35).expand(1, 1, 28, 36).clone()
    canvas = compose(ramp[..., :28], torch.zeros(1, 1, 28, 28), canvas=36, size=36, construction="sener_koltun")
    small = compose(ramp[..., :28], torch.zeros(1, 1, 28, 28), construction="sener_koltun")
    idx = [0, 1, 3, 4, 5, 7, 8, 9, 10, 12, 13, 14, 16, 17, 18, 19, 21, 22, 23, 25, 26, 27, 28, 30, 31, 32, 34, 35]
    assert idx == [math.floor((i + 0.5) * 36 / 28) for i in range(28)]
    torch.testing.assert_close(small[0, 0], canvas[0, 0][idx][:, idx], rtol=0, atol=0)
    with pytest.raises(ConfigError, match="construction='s&k' is not one of"):
        compose(left, right, construction="s&k")


def test_sener_koltun_pairs_are_independent_draws(fairfl_env, base5k):
    from fairfl.federated.data import load_dataset
    sk = load_dataset("multimnist", source="mnist_5k", seed=0, construction="sener_koltun")
    rng = np.random.default_rng(0)
    partner = rng.integers(0, 4000, size=4000)                 # train split first, from the loader's seed
    assert torch.equal(sk.y_train[:, 0], base5k.y_train)
    assert torch.equal(sk.y_train[:, 1], base5k.y_train[torch.from_numpy(partner)])
    assert len(np.unique(partner)) < 4000                        # some images are drawn twice, some never


def test_dataset_readings_enter_the_key_only_when_set(monkeypatch):
    import fairfl.runs.config
    base = fmol_config(K=1, iid=True)
    # keys of the paper configs computed before these options existed (commit 662ae14, cache version 5): unchanged
    with monkeypatch.context() as m:
        m.setattr(fairfl.runs.config, "CACHE_VERSION", 5)
        assert base.key() == "11aa224199f56b27" and fmol_config(K=20, iid=False).key() == "b685e4403bca3306"
    explicit = base.replace(dataset_options={**base.dataset_options, "normalize": "global", "construction": "fairfl"},
                            algorithm=FMGDA(server_lr=0.1, solver="quadprog"))
    assert explicit.key() == base.key()
    keys = {base.replace(dataset_options={**base.dataset_options, "normalize": "mnist"}).key(),
            base.replace(dataset_options={**base.dataset_options, "construction": "sener_koltun"}).key(),
            base.replace(algorithm=FMGDA(server_lr=0.1, solver="sener_koltun")).key(), base.key()}
    assert len(keys) == 4


# ----------------------------------------------------------------------------- a real run

def test_every_reading_together_runs_on_real_multimnist(fairfl_env):
    from fairfl.runs.loop import simulate
    cfg = ExperimentConfig(
        dataset="multimnist", dataset_options={"source": "mnist_5k", "normalize": "mnist", "construction": "sener_koltun"},
        model="multi_lenet", model_options={"init": "xavier"},
        partition=PartitionSpec("iid", num_clients=3, samples_per_client=20),
        local=LocalTraining(steps=2, batch_size=None, lr=0.1),
        algorithm=FMGDA(server_lr=0.1, solver="sener_koltun", qp_params="shared"), rounds=2,
        participation=1.0, eval_every=1, track_improved=False)
    h = simulate(cfg, progress=False)
    lam = h.info_array("lambda")
    assert lam.shape == (2, 2) and np.isfinite(h.train_losses()).all()
    assert (lam >= 0.001 - 1e-15).all() and (lam <= 0.999 + 1e-15).all()
    np.testing.assert_allclose(lam.sum(axis=1), 1.0, atol=1e-12)


def test_fmol_config_readings_are_declared_distinct_and_validated():
    from fairfl.studies.paper import FMOL_READINGS
    keys = {r: fmol_config(K=1, iid=True, reading=r).validate().key() for r in FMOL_READINGS}
    assert keys["ours"] == fmol_config(K=1, iid=True).key() and len(set(keys.values())) == len(FMOL_READINGS)
    sk = fmol_config(K=5, iid=False, reading="sk-all")
    assert dict(sk.dataset_options) == {"normalize": "mnist", "construction": "sener_koltun"}
    assert (sk.algorithm.solver, sk.algorithm.qp_params) == ("sener_koltun", "shared") and not sk.model_options
    with pytest.raises(ConfigError, match="reading='s&k' is not one of ours, sk-pixels"):
        fmol_config(K=1, reading="s&k")

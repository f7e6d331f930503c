"""DQN-Fed (Mohajer Hamidi, TMLR): Theorem 4.1, the closed-form weights against the min-norm
solver, the L-BFGS product against a dense BFGS matrix, the guards, and the client side on real
Fashion-MNIST (gradients, rates, resume with the previous global model in the checkpoint)."""
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from fairfl import ConfigError, ExperimentConfig, LocalTraining, PartitionSpec
from fairfl.federated.algorithms import Context, RoundPlan, make_algorithm
from fairfl.federated.algorithms import dqnfed
from fairfl.federated.algorithms.dqnfed import (ROUNDING, ROUNDING_MARGIN, DQNFed, client_updates, curvature_pair, dqnfed_step,
                                                inverse_hessian_product, rounding_bound, theorem_4_2_scale, usable_pair)
from fairfl.training.client import ClientRuntime
from fairfl.training.client import gradients as full_batch_gradients
from fairfl.runs.history import load_checkpoint
from fairfl.runs.loop import simulate
from fairfl.federated.messages import ClientUpdates
from fairfl.federated.minnorm import min_norm_weights
from fairfl.federated.models import build_model
from fairfl.federated.partition import federate


def dqnfed_client_updates(model, w, previous, data, clients, local, seed, round_, batched=True, loss_before=False):
    """DQN-Fed's client half as the loop runs it, for the given global and previous models."""
    runtime = ClientRuntime(model, data, seed, batched)
    runtime.round = round_
    plan = RoundPlan(np.asarray(clients), local, loss_before=loss_before, extras={"previous": previous})
    return client_updates(runtime, plan, Context(round=round_, seed=seed, params=w, local=local))


def gen(seed):
    return torch.Generator().manual_seed(seed)


def explicit_orthogonal_set(g, d):
    """Eqs. (7)–(8) exactly as printed (classical Gram–Schmidt, divide by the denominators)."""
    tilde = []
    for k in range(len(g)):
        num, den = g[k].clone(), d[k].clone()
        for t in tilde:
            num -= (g[k] @ t) / (t @ t) * t
            den -= (g[k] @ t) / (t @ t)
        tilde.append(num / den)
    return torch.stack(tilde)


# ----------------------------------------------------------------------------- the server

@pytest.mark.parametrize("seed", range(4))
def test_theorem_4_1_every_participant_descends_at_its_newton_rate(seed):
    m, n = 6, 40
    g = torch.randn(m, n, generator=gen(seed), dtype=torch.float64)
    d = torch.rand(m, generator=gen(seed + 100), dtype=torch.float64) + 0.1
    step, lam, eta, kept = dqnfed_step(g, d)
    assert kept.all()
    torch.testing.assert_close(g @ step, d, rtol=1e-9, atol=1e-12)          # gₖ·(ηₜ𝔡) = dₖ
    torch.testing.assert_close(g @ (step / eta), d / eta, rtol=1e-9, atol=1e-12)   # gₖ·𝔡 = dₖ / Σ 1/‖g̃‖²


@pytest.mark.parametrize("seed", range(3))
def test_closed_form_lambda_is_the_min_norm_point_of_the_orthogonal_set(seed):
    g = torch.randn(5, 12, generator=gen(seed), dtype=torch.float64)
    d = torch.rand(5, generator=gen(seed + 7), dtype=torch.float64) + 0.5
    tilde = explicit_orthogonal_set(g, d)
    gram = (tilde @ tilde.T).numpy()
    assert np.abs(gram - np.diag(np.diag(gram))).max() < 1e-9 * np.abs(gram).max()   # orthogonal
    lam_qp = min_norm_weights(gram, np.full(5, 0.2), eps=1.0, solver="cvxpy")
    step, lam, eta, _ = dqnfed_step(g, d)
    np.testing.assert_allclose(lam.numpy(), lam_qp, atol=1e-6)
    inv = 1 / (tilde * tilde).sum(1)
    assert eta == pytest.approx(float(inv.sum()), rel=1e-10)                 # eq. (17)
    torch.testing.assert_close(step, eta * (lam @ tilde), rtol=1e-9, atol=1e-12)


def test_dependent_and_zero_gradients_are_left_out_and_nothing_is_nan():
    a, b = torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0.0, 1.0, 0.0])
    g = torch.stack([a, b, 2 * a - b, torch.zeros(3), a + 1e-12 * torch.tensor([0.0, 0.0, 1.0])]).double()
    d = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], dtype=torch.float64)
    step, lam, eta, kept = dqnfed_step(g, d)
    assert kept.tolist() == [True, True, False, False, False]
    assert torch.isfinite(step).all() and np.isfinite(eta)
    torch.testing.assert_close(g[:2] @ step, d[:2])
    assert lam[2:].eq(0).all() and lam.sum().item() == pytest.approx(1.0)


def test_a_vanishing_denominator_just_drops_that_term():
    # orthogonal gradients: cₖ = dₖ; dₖ = 0 would make g̃ₖ = rₖ/0 in eq. (8) as printed
    g = torch.eye(3, dtype=torch.float64)
    step, lam, eta, _ = dqnfed_step(g, torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64))
    torch.testing.assert_close(step, torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64))
    assert lam[1] == 0 and np.isfinite(eta)


def test_all_zero_gradients_give_a_zero_step():
    step, lam, eta, kept = dqnfed_step(torch.zeros(3, 4), torch.ones(3))
    assert torch.equal(step, torch.zeros(4, dtype=torch.float64)) and eta == 0 and not kept.any()


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 6), n=st.integers(1, 8), seed=st.integers(0, 10_000),
       scale=st.sampled_from([1e-12, 1.0, 1e12]))
def test_step_is_finite_for_any_gradients(m, n, seed, scale):
    g = torch.randn(m, n, generator=gen(seed), dtype=torch.float64) * scale
    d = torch.rand(m, generator=gen(seed + 1), dtype=torch.float64) * scale ** 2
    step, lam, eta, kept = dqnfed_step(g, d)
    assert torch.isfinite(step).all() and torch.isfinite(lam).all() and np.isfinite(eta)
    if kept.any():
        torch.testing.assert_close(g[kept] @ step, d[kept], rtol=1e-6, atol=1e-9 * float(d.abs().max()))


def test_aggregator_needs_the_rates_and_validates_its_option():
    with pytest.raises(ValueError, match="dqn_d"):
        DQNFed().aggregate(ClientUpdates(np.arange(2), torch.ones(2, 3), torch.ones(2)), None, Context())
    with pytest.raises(ConfigError, match="dependence_tol=0.0 is not allowed"):
        make_algorithm({"name": "dqnfed", "dependence_tol": 0.0})
    with pytest.raises(ConfigError, match="step='newton' is not allowed; it must be one of 'eq17', 'algorithm1', 'eq17_safeguarded'"):
        make_algorithm({"name": "dqnfed", "step": "newton"})
    # eq. (17) fixes the rate: a global rate is an option of the Algorithm 1 reading only
    with pytest.raises(ConfigError, match="server_lr and decay set the global rate of step='algorithm1'"):
        DQNFed(server_lr=0.1)
    assert DQNFed(step="algorithm1", server_lr=0.1).server_optimizer().update(torch.ones(2), None, 0, 10)[2]["lr"] == 0.1


def _reports(g, d):
    return ClientUpdates(np.arange(len(g)), g, torch.ones(len(g)), extras={"dqn_d": d})


@pytest.mark.parametrize("seed", range(3))
def test_algorithm1_reading_steps_along_d_and_eq17_along_eta_times_d(seed):
    g = torch.randn(4, 30, generator=gen(seed), dtype=torch.float64)
    d = torch.rand(4, generator=gen(seed + 50), dtype=torch.float64) + 0.1
    eq17 = DQNFed(step="eq17").aggregate(_reports(g, d), None, Context(round=0))
    alg1 = DQNFed(step="algorithm1").aggregate(_reports(g, d), None, Context(round=0))
    eta = eq17.info["eta"]
    torch.testing.assert_close(eq17.direction, eta * alg1.direction, rtol=1e-9, atol=1e-12)
    # Theorem 4.1 for 𝔡 itself, and ‖𝔡‖ = 1/‖ηₜ𝔡‖ (since ‖ηₜ𝔡‖² = ηₜ for orthogonal g̃)
    torch.testing.assert_close(g @ alg1.direction, d / eta, rtol=1e-9, atol=1e-12)
    assert abs(float(alg1.direction.norm() * eq17.direction.norm()) - 1) < 1e-9


def test_eq17_step_grows_without_bound_near_pareto_stationarity():
    # two gradients that nearly cancel: their hull nearly contains 0 while the rates stay put
    d = torch.tensor([1.0, 1.0], dtype=torch.float64)
    lengths = []
    for gap in (1e-1, 1e-2, 1e-3):
        g = torch.tensor([[1.0, gap], [-1.0, gap]], dtype=torch.float64)
        eq17 = DQNFed(step="eq17").aggregate(_reports(g, d), None, Context(round=0)).direction.norm()
        alg1 = DQNFed(step="algorithm1").aggregate(_reports(g, d), None, Context(round=0)).direction.norm()
        lengths.append((float(eq17), float(alg1)))
        assert eq17 >= 1 / gap * 0.99        # ≥ (λ·d)/‖Σλg‖ with λ = (½, ½): 1/gap
    assert lengths[0][0] < lengths[1][0] < lengths[2][0]
    assert lengths[0][1] > lengths[1][1] > lengths[2][1]


def _quadratic_clients(gap):
    """Two quadratic clients fₖ(θ) = ½ Lₖ‖θ − cₖ‖² at θ = 0 whose gradients nearly cancel (Pareto
    stationarity as gap → 0): what each would send after one full-batch local step of rate ηₗ —
    gₖ = ηₗ∇fₖ, d̃ₖ = gₖᵀH⁻¹gₖ with the exact inverse Hessian, σₖ = ηₗ, L̂ₖ = Lₖ."""
    L = torch.tensor([2.0, 5.0], dtype=torch.float64)
    c = torch.tensor([[1.0, gap], [-1.0, gap]], dtype=torch.float64)
    lr = 0.1
    grad = L[:, None] * (0 - c)
    g = lr * grad
    d = (g * g).sum(1) / L
    f = lambda k, theta: 0.5 * L[k] * float(((theta - c[k]) ** 2).sum())
    reports = ClientUpdates(np.arange(2), g, torch.ones(2), None, None,
                            {"dqn_d": d, "dqn_curvature": L.clone(), "dqn_scale": torch.full((2,), lr, dtype=torch.float64)})
    return reports, f


@pytest.mark.parametrize("gap", [1e-1, 1e-2, 1e-3])
def test_safeguard_keeps_theorem_4_2s_descent_where_eq17_overshoots(gap):
    reports, f = _quadratic_clients(gap)
    theta = torch.zeros(2, dtype=torch.float64)
    eq17 = DQNFed(step="eq17").aggregate(reports, None, Context(round=0))
    safe = DQNFed(step="eq17_safeguarded").aggregate(reports, None, Context(round=0))
    # eq. (17) near stationarity: the step is so long that some client's loss rises
    assert max(f(k, theta - eq17.direction) - f(k, theta) for k in range(2)) > 0
    # the safeguarded step: the same direction, shorter, and every client descends (Theorem 4.2)
    factor = safe.info["safeguard"]
    assert 0 < factor < 1
    torch.testing.assert_close(safe.direction, factor * eq17.direction)
    assert all(f(k, theta - safe.direction) < f(k, theta) for k in range(2))
    # by hand: the largest factor with ∇fₖ·Δ ≥ (L/2)‖Δ‖² for both, ‖Δ‖² = ηₜ, ∇fₖ·Δ = d̃ₖ/σₖ
    d, eta = reports.extras["dqn_d"], eq17.info["eta"]
    assert factor == pytest.approx(2 * float((d / 0.1).min()) / (5.0 * eta), rel=1e-12)


def test_safeguard_is_eq17_when_the_condition_holds_or_no_curvature_is_known():
    reports, _ = _quadratic_clients(1.0)          # far from stationarity: a short eq. (17) step
    eq17 = DQNFed(step="eq17").aggregate(reports, None, Context(round=0))
    safe = DQNFed(step="eq17_safeguarded").aggregate(reports, None, Context(round=0))
    assert safe.info["safeguard"] == 1.0
    assert torch.equal(safe.direction, eq17.direction)
    d, s0 = torch.ones(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64)
    assert theorem_4_2_scale(3.0, d, s0, torch.zeros(2)) == 1.0        # round 0: no BFGS pair, no L̂
    assert theorem_4_2_scale(0.0, d, s0, torch.ones(2)) == 1.0         # no step at all
    assert theorem_4_2_scale(3.0, d, torch.tensor([1.0, -0.5]), torch.ones(2)) == 0.0   # cannot descend by scaling
    with pytest.raises(ValueError, match="dqn_curvature"):
        DQNFed(step="eq17_safeguarded").aggregate(_reports(torch.eye(2), torch.ones(2)), None, Context(round=0))


def test_safeguard_keeps_the_last_curvature_through_a_round_without_a_pair():
    # near stationarity the steps shrink until no client resolves a pair above rounding (L̂ₖ = 0 for all): the
    # step of that round must still be held to Theorem 4.2 with the last round's L̂, not left unguarded — on
    # Fashion-MNIST such a round took eq. (17)'s whole step and the training loss went from 0.33 to 399
    reports, f = _quadratic_clients(1e-3)
    safe = DQNFed(step="eq17_safeguarded")
    first = safe.aggregate(reports, None, Context(round=1))
    assert first.state.curvature == 5.0 and 0 < first.info["safeguard"] < 1
    blind = replace(reports, extras={**reports.extras, "dqn_curvature": torch.zeros(2, dtype=torch.float64)})
    second = safe.aggregate(blind, first.state, Context(round=2))
    assert second.info["curvature"] == 5.0 and second.state.curvature == 5.0
    assert second.info["safeguard"] == first.info["safeguard"]
    theta = torch.zeros(2, dtype=torch.float64)
    assert all(f(k, theta - second.direction) < f(k, theta) for k in range(2))
    # a new estimate replaces the old one (L is estimated along the trajectory, not its running maximum)
    lower = replace(reports, extras={**reports.extras, "dqn_curvature": torch.tensor([1.0, 3.0], dtype=torch.float64)})
    assert safe.aggregate(lower, second.state, Context(round=3)).state.curvature == 3.0
    # without any estimate yet (round 0) the step is eq. (17)'s
    assert safe.aggregate(blind, None, Context(round=0)).info["safeguard"] == 1.0
    # the fix reaches the safeguarded step's cache keys (2); the rounding rule of the pairs, every step's (1)
    assert safe.revision() == 2 and DQNFed().revision() == 1 and DQNFed(step="algorithm1").revision() == 1


# ----------------------------------------------------------------------------- BFGS

def dense_bfgs_eq19(pairs, n):
    """Eq. (19) as printed, a Hessian estimate, from B₀ = (1/γ) I; our B is its inverse."""
    s, y = pairs[-1]
    B = torch.eye(n, dtype=torch.float64) * (y @ y) / (s @ y)
    for s, y in pairs:
        Bs = B @ s
        B = B - torch.outer(Bs, Bs) / (s @ Bs) + torch.outer(y, y) / (s @ y)
    return B


def test_two_loop_product_equals_the_inverse_of_the_dense_eq19_matrix():
    n = 8
    A = torch.randn(n, n, generator=gen(0), dtype=torch.float64)
    A = A @ A.T + 0.5 * torch.eye(n, dtype=torch.float64)                   # an SPD Hessian
    pairs = []
    for i in range(4):
        s = torch.randn(n, generator=gen(10 + i), dtype=torch.float64)
        pairs.append((s, A @ s))
    v = torch.randn(n, generator=gen(99), dtype=torch.float64)
    H = torch.linalg.inv(dense_bfgs_eq19(pairs, n))
    torch.testing.assert_close(inverse_hessian_product(v, pairs), H @ v, rtol=1e-8, atol=1e-10)
    # the secant condition of the inverse estimate: B y = s for the newest pair
    torch.testing.assert_close(inverse_hessian_product(pairs[-1][1], pairs), pairs[-1][0], rtol=1e-8, atol=1e-10)
    # with n pairs on a quadratic, BFGS recovers the inverse Hessian on the last direction at least
    assert float(v @ inverse_hessian_product(v, pairs)) > 0


def test_no_pairs_means_identity_and_bad_curvature_is_detected():
    v = torch.tensor([1.0, -2.0])
    assert torch.equal(inverse_hessian_product(v, []), v)
    s = torch.tensor([1.0, 0.0])
    assert usable_pair(s, 2 * s) and not usable_pair(s, -s) and not usable_pair(s, torch.tensor([0.0, 1.0]))


def _ulps(x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """float32 ``x`` moved by ``k`` units in the last place, element by element (k of either sign)."""
    x = x.float()
    up = torch.nextafter(x, torch.full_like(x, torch.inf)) - x
    return x + k.float() * up


def test_a_pair_that_measures_rounding_is_skipped_and_the_same_pair_above_rounding_is_kept():
    g = torch.Generator().manual_seed(0)
    theta = 3 * torch.randn(1000, generator=g)                      # ‖θ‖ ≈ 95, float32
    grad = torch.randn(1000, generator=g)
    direction = torch.randn(1000, generator=g)
    # a converged client's step: the new point a few ulps from the old, gradients a few ulps apart
    near = _ulps(theta, torch.randint(-3, 4, (1000,), generator=g))
    near_grad = _ulps(grad, torch.randint(-3, 4, (1000,), generator=g))
    s, y, usable, resolved = curvature_pair(theta, near, grad, near_grad)
    assert s.norm() > 0 and y.norm() > 0 and not resolved and not usable
    # whatever sign its sᵀy happens to have: it stays below the rounding bound by far
    assert abs(float(s @ y)) < rounding_bound(s, y, float(theta.norm()), float(grad.norm()))
    # the same geometry at a real step (y = H s with H = 2 I, so sᵀy > 0 by construction): kept
    s2, y2, usable2, resolved2 = curvature_pair(theta, theta + 0.01 * direction, grad, grad + 0.02 * direction)
    assert usable2 and resolved2
    assert float(s2 @ y2) > ROUNDING_MARGIN * rounding_bound(s2, y2, float(theta.norm()), float(grad.norm()))
    # negative curvature at a real step: skipped, but resolved (its ‖y‖/‖s‖ still says how curved)
    _, _, usable3, resolved3 = curvature_pair(theta, theta + 0.01 * direction, grad, grad - 0.02 * direction)
    assert not usable3 and resolved3
    assert ROUNDING == torch.finfo(torch.float32).eps


def test_no_curvature_decision_of_the_golden_dqnfed_cases_flips_in_the_last_bits(monkeypatch):
    """The cross-kernel contract of tests/test_golden.py for DQN-Fed's discrete decision: every
    curvature pair its golden cases make (real data, real training) is moved in the last bits of its
    four float32 inputs, 40 times each, by up to 4 ulps per element (more than the spread between an
    AMD and an Intel machine's kernels for one step), and must keep its decision. The bare
    condition sᵀy > 1e-10‖s‖‖y‖ does flip on one of them (a converged client's pair): the test has teeth."""
    import test_golden
    seen = []
    real = dqnfed.curvature_pair

    def recording(a, b, ga, gb):
        seen.append(tuple(x.detach().clone() for x in (a, b, ga, gb)))
        return real(a, b, ga, gb)
    monkeypatch.setattr(dqnfed, "curvature_pair", recording)
    for name in ("dqnfed_mlp", "dqnfed_alg1_mlp", "dqnfed_two_epochs_mlp"):
        simulate(test_golden.CASES[name], progress=False)
    assert len(seen) >= 30
    g = torch.Generator().manual_seed(1)
    bare_flips = 0
    for a, b, ga, gb in seen:
        _, _, usable, _ = real(a, b, ga, gb)
        bare = None
        for _ in range(40):
            moved = [_ulps(x, torch.randint(-4, 5, x.shape, generator=g)) for x in (a, b, ga, gb)]
            s, y, usable_moved, _ = real(*moved)
            assert usable_moved == usable, "a curvature decision flipped in the last bits of its inputs"
            bare_now = bool(s @ y > 1e-10 * s.norm() * y.norm())
            bare_flips += bare is not None and bare_now != bare
            bare = bare_now
    assert bare_flips > 0


# ----------------------------------------------------------------------------- the client side, real data

@pytest.fixture(scope="module")
def three_class(fmnist):
    from fairfl.federated.data import load_dataset
    ds = load_dataset("fashion_mnist", classes=(6, 2, 0))
    return ds, federate(ds, PartitionSpec("one_class", num_clients=3, classes=(0, 1, 2), split=None))


def test_clients_send_their_update_and_positive_rates(three_class):
    ds, fed = three_class
    model = build_model("mlp2", ds.input_shape, 3, seed=0)
    w0 = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    w1 = w0 - 0.01 * torch.randn(w0.shape, generator=gen(1))
    local = LocalTraining(epochs=1, batch_size=None, lr=0.1)
    out = dqnfed_client_updates(model, w1, w0, fed.clients, [0, 1, 2], local, 0, 1, batched=True, loss_before=True)
    # E = 1, full batch: the update is η_l times the full-batch gradient at the global model
    torch.nn.utils.vector_to_parameters(w1.clone(), model.parameters())
    c = fed.clients[1]
    loss = F.cross_entropy(model(c.x_train), c.y_train)
    grad = torch.cat([p.reshape(-1) for p in torch.autograd.grad(loss, list(model.parameters()))])
    torch.testing.assert_close(out.updates[1], 0.1 * grad, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(full_batch_gradients(model, w1, fed.clients, [1], True)[0], grad, rtol=1e-4, atol=1e-6)
    assert (out.extras["dqn_d"] > 0).all() and out.loss_before.shape == (3,)
    # the rate is uᵀBu with B from the one pair (θ¹ − θ⁰, ∇f(θ¹) − ∇f(θ⁰)); a random step on a
    # non-convex loss can have sᵀy ≤ 0, and then the pair is skipped and B = I
    u = out.updates.double()
    g1 = full_batch_gradients(model, w1, fed.clients, [0, 1, 2], True).double()
    g0 = full_batch_gradients(model, w0, fed.clients, [0, 1, 2], True).double()
    s = (w1 - w0).double()
    for r in range(3):
        pair = [(s, g1[r] - g0[r])] if curvature_pair(w0, w1, g0[r], g1[r])[2] else []
        assert out.extras["bfgs_skipped"][r] == float(not pair)
        torch.testing.assert_close(out.extras["dqn_d"][r], u[r] @ inverse_hessian_product(u[r], pair))
        # the safeguard's inputs: L̂ₖ = ‖y‖/‖s‖ of the pair, σₖ = ηₗ (one full-batch step)
        torch.testing.assert_close(out.extras["dqn_curvature"][r], (g1[r] - g0[r]).norm() / s.norm())
    torch.testing.assert_close(out.extras["dqn_scale"], torch.full((3,), 0.1, dtype=torch.float64), rtol=1e-4, atol=0)
    # round 0 (no previous model): B = I, so d̃ₖ = ‖uₖ‖²
    first = dqnfed_client_updates(model, w1, None, fed.clients, [0, 1, 2], local, 0, 0)
    torch.testing.assert_close(first.extras["dqn_d"], (first.updates.double() ** 2).sum(1), rtol=1e-6, atol=0)


DQN = ExperimentConfig(dataset="fashion_mnist", dataset_options={"classes": (6, 2, 0)}, model="mlp2",
                       partition=PartitionSpec("one_class", num_clients=3, classes=(0, 1, 2), split=None),
                       local=LocalTraining(epochs=2, batch_size=None, lr=0.1), algorithm=DQNFed(),
                       rounds=4, participation=1.0, eval_every=2, checkpoint_every=2, track_improved=True)


def test_dqnfed_run_resumes_exactly_with_the_previous_model(three_class, tmp_path):
    full = simulate(DQN, checkpoint_dir=tmp_path / "a", progress=False)
    simulate(DQN, checkpoint_dir=tmp_path / "b", progress=False, stop_after=2)
    assert load_checkpoint(tmp_path / "b", DQN).state.previous is not None
    resumed = simulate(DQN, checkpoint_dir=tmp_path / "b", progress=False)
    assert resumed.train_loss == full.train_loss and resumed.info == full.info
    assert resumed.round_improved == full.round_improved
    assert full.train_loss[-1] < full.train_loss[0]

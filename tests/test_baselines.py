"""DQN-Fed's baselines FedLF, FedHEAL, FedNL and FedNew: what each paper (or, for FedHEAL, its
official code) states, on hand-made vectors and quadratics; degenerate inputs; and short runs of
each on real data (Adult's logistic regression, and a small MLP for the large-d readings).

Each paper-property test names, in its docstring, the broken variant of the code that makes it
fail (each was checked by breaking the code)."""
from __future__ import annotations

import inspect
import math
import re

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

from fairfl import ExperimentConfig, LocalTraining, PartitionSpec
from fairfl.federated.algorithms import Context, ParamLayout, init_state, make_algorithm
from fairfl.federated.algorithms.fedheal import FedHEAL, consistency_mask, fael_weights, layer_distance, masked_average
from fairfl.federated.algorithms.fedlf import FedLF, fair_coefficients, fedlf_direction, history_clients
from fairfl.federated.algorithms.fednew import FedNew, conjugate_gradient
from fairfl.federated.algorithms.fednl import FedNL, compress, project
from fairfl.federated.messages import ClientUpdates


# ----------------------------------------------------------------------------- a ClientRuntime of quadratics

class Quadratics:
    """fᵢ(x) = ½xᵀAᵢx − bᵢᵀx with exact derivatives: what a second-order client half asks of the
    ClientRuntime (gradients, hvp, hessian, states), without a model."""

    def __init__(self, A: torch.Tensor, b: torch.Tensor):
        self.A, self.b = A.double(), b.double()
        self.states: dict = {}
        self.cache: dict = {}
        self.round = 0

    @property
    def num_clients(self) -> int:
        return len(self.A)

    def num_samples(self, ids):
        return torch.ones(len(ids), dtype=torch.long)

    def losses(self, params, ids):
        x = params.double()
        return torch.stack([0.5 * x @ self.A[k] @ x - self.b[k] @ x for k in ids])

    def gradients(self, point, ids):
        return torch.stack([self.A[k] @ point.double() - self.b[k] for k in ids])

    def hessian(self, point, ids, dtype=torch.float64):
        return self.A[list(ids)].clone()

    def hvp(self, point, ids, v, dtype=None, rows=None):
        if v.ndim == 3:
            return torch.stack([v[r].double() @ self.A[k].T for r, k in enumerate(ids)])
        rows = v.double().expand(len(ids), -1) if v.ndim == 1 else v.double()
        return torch.stack([self.A[k] @ rows[r] for r, k in enumerate(ids)])

    def minimiser(self) -> torch.Tensor:
        return torch.linalg.solve(self.A.mean(0), self.b.mean(0))


def quadratics(n=3, d=5, seed=0, diagonal=False) -> Quadratics:
    g = torch.Generator().manual_seed(seed)
    if diagonal:
        A = torch.diag_embed(1 + 2 * torch.rand(n, d, generator=g, dtype=torch.float64))
    else:
        Q = torch.randn(n, d, d, generator=g, dtype=torch.float64)
        A = Q.transpose(1, 2) @ Q / d + torch.eye(d, dtype=torch.float64)
    return Quadratics(A, torch.randn(n, d, generator=g, dtype=torch.float64))


def _server_step(algo, direction, t):
    return algo.server_lr * direction


# the loop's server step for these algorithms is server_lr (decay 1): w ← w − η·d
def run(algo, clients, x0, T, fixed_x=False, layout=None):
    n = clients.num_clients
    state = init_state(algo, x0, n, layout)
    x, xs, aggs = x0.clone(), [x0.clone()], []
    for t in range(T):
        ctx = Context(round=t, rounds=T, params=x, num_clients=n, num_sampled=n, layout=layout)
        clients.round = t
        reports = algo.client_update(ctx, algo.configure(ctx, state), clients)
        agg = algo.aggregate(reports, state, ctx)
        state = agg.state
        if not fixed_x:
            x = x - _server_step(algo, agg.direction, t)
        xs.append(x.clone()), aggs.append(agg)
    return xs, state, aggs


X0 = torch.linspace(-1.0, 2.0, 5, dtype=torch.float64)


# ----------------------------------------------------------------------------- FedNL

def test_fednl_with_exact_hessians_is_newton_in_one_round():
    """Identity compressor, Hᵢ⁰ = Aᵢ, Option 1, μ below λ_min(Ā): x¹ = x* (FedNL Algorithm 1 with
    exact Hessians). Broken variant caught: the server's H as the *sum* of the clients' Hᵢ instead
    of their mean (x¹ = x⁰ − Ā⁻¹ḡ/n)."""
    q = quadratics()
    xs, _, _ = run(FedNL(compressor="identity", mu=1e-3, hessian_mode="full"), q, X0, 1)
    torch.testing.assert_close(xs[1], q.minimiser(), rtol=0, atol=1e-10)


def test_fednl_learns_the_hessian_from_zero_and_steps_with_the_old_one():
    """Hᵢ⁰ = 0, identity compressor, α = 1: round 0 steps by ḡ/μ ([0]_μ = μI), H¹ = Ā, and x² = x*.
    Broken variant caught: stepping with Hᵏ⁺¹ (after this round's learning) instead of Hᵏ, which
    makes x¹ = x* already (FedNL Algorithm 1 and its code step with Hᵏ)."""
    q = quadratics()
    algo = FedNL(compressor="identity", alpha=1.0, mu=0.5, h_init="zero", hessian_mode="full")
    xs, state, _ = run(algo, q, X0, 2)
    g0 = q.gradients(X0, range(3)).mean(0)
    torch.testing.assert_close(xs[1], X0 - g0 / 0.5, rtol=0, atol=1e-12)
    assert (xs[1] - q.minimiser()).norm() > 1e-3
    torch.testing.assert_close(xs[2], q.minimiser(), rtol=0, atol=1e-10)
    torch.testing.assert_close(state.H_sum / 3, q.A.mean(0), rtol=0, atol=1e-12)


@pytest.mark.parametrize("compressor, param", [("topk", {"topk": 3}), ("rank", {"rank": 1})])
def test_fednl_compressed_learning_finishes(compressor, param):
    """Hᵢ⁰ = 0, Top-3 (15 upper-triangle entries of a 5×5 matrix) or Rank-1, α = 1: ‖Hᵢᵏ − Aᵢ‖_F never
    grows and is 0 after 5 rounds; then x⁶ = x*. Broken variant caught: a Top-K that writes only the
    upper triangle (not symmetrised) never learns the lower one."""
    q = quadratics()
    algo = FedNL(compressor=compressor, alpha=1.0, mu=0.1, h_init="zero", hessian_mode="full", **param)
    errors = []
    n = q.num_clients
    state, x = init_state(algo, X0, n, None), X0.clone()
    for t in range(6):
        ctx = Context(round=t, rounds=6, params=x, num_clients=n, num_sampled=n)
        agg = algo.aggregate(algo.client_update(ctx, algo.configure(ctx, state), q), state, ctx)
        state, x = agg.state, x - agg.direction
        errors.append(max(float((q.states[k].H - q.A[k]).norm()) for k in range(n)))
    assert all(b <= a + 1e-9 for a, b in zip(errors, errors[1:]))
    assert errors[4] < 1e-9
    torch.testing.assert_close(x, q.minimiser(), rtol=0, atol=1e-8)


def test_projection_clips_eigenvalues_at_mu():
    """[diag(−1, 0.5, 3)]₁ = diag(1, 1, 3); a matrix ⪰ μI is left alone (code utils.py:321-331). Broken
    variant caught: clipping |λ| instead of λ (a negative curvature flipped, not lifted to μ)."""
    torch.testing.assert_close(project(torch.diag(torch.tensor([-1.0, 0.5, 3.0], dtype=torch.float64)), 1.0),
                               torch.diag(torch.tensor([1.0, 1.0, 3.0], dtype=torch.float64)))
    A = quadratics().A[0]
    torch.testing.assert_close(project(A, 0.5), A)
    torch.testing.assert_close(project(torch.tensor([-1.0, 0.5, 3.0]), 1.0), torch.tensor([1.0, 1.0, 3.0]))


def test_fednl_option_2_with_exact_hessians_is_newton():
    """Option 2: d = (H + lI)⁻¹ḡ with l = mean ‖Hᵢ − ∇²fᵢ‖_F = 0 when Hᵢ = ∇²fᵢ: Newton's step, whatever
    μ (Option 1's level; 10 here, above every eigenvalue). Broken variant caught: Option 2 solving
    with Option 1's [H]_μ."""
    q = quadratics()
    xs, _, aggs = run(FedNL(compressor="identity", opt=2, mu=10.0, hessian_mode="full"), q, X0, 1)
    torch.testing.assert_close(xs[1], q.minimiser(), rtol=0, atol=1e-10)
    assert aggs[0].info["hessian_error"] == 0.0


def test_fednl_diagonal_reading_equals_the_full_one_on_diagonal_hessians():
    """The large-d reading (Hutchinson diagonals, learned as vectors) and the exact one take the same
    steps where the Hessians are diagonal (zᵣ ⊙ Azᵣ = diag A for Rademacher z): the two readings
    agree on a small d. Broken variant caught: a Hutchinson estimate without the z ⊙ (not diag A)."""
    q = quadratics(diagonal=True)
    common = dict(compressor="identity", alpha=1.0, mu=1e-3, h_init="zero")
    full, _, _ = run(FedNL(hessian_mode="full", **common), q, X0, 4)
    diag, _, _ = run(FedNL(hessian_mode="diag", **common), quadratics(diagonal=True), X0, 4)
    for a, b in zip(full, diag):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    torch.testing.assert_close(full[2], q.minimiser(), rtol=0, atol=1e-10)


def test_hutchinson_estimate_with_many_probes_is_close_to_the_diagonal():
    from fairfl.federated.algorithms.fednl import hutchinson_diagonal
    q = quadratics()
    est = hutchinson_diagonal(q, X0, [0], 2000, Context(seed=1))[0]
    assert ((est - torch.diagonal(q.A[0])).abs() / torch.diagonal(q.A[0])).max() < 0.05


def test_fednl_on_a_singular_hessian_takes_a_finite_step():
    """A client with a zero Hessian (a softmax's null space, in the extreme) and a rank-deficient
    one: Option 1's projection at μ > 0 keeps the step finite."""
    A = torch.zeros(2, 5, 5, dtype=torch.float64)
    A[1, 0, 0] = 1.0
    q = Quadratics(A, torch.ones(2, 5, dtype=torch.float64))
    xs, _, _ = run(FedNL(mu=1e-3, hessian_mode="full"), q, X0, 2)
    assert all(torch.isfinite(x).all() for x in xs)


def test_the_mode_follows_the_threshold_on_d():
    assert FedNL().mode(198) == "full" and FedNL().mode(2001) == "diag" and FedNL(max_full_d=100).mode(198) == "diag"
    assert FedNew().mode(198) == "full" and FedNew().mode(20000) == "cg"
    assert FedNL().rates(198) == (1.0, 1e-3) and FedNL().rates(10 ** 5) == (0.1, 1e-2)


# ----------------------------------------------------------------------------- FedNew

def test_fednew_inner_admm_solves_the_damped_newton_system():
    """x held fixed, 500 ADMM passes: yᴷ → (Ā + αI)⁻¹ḡ and Σᵢλᵢ = 0 after every pass (ρ = 1,
    α = 1e-3). Broken variant caught: no λ update, which converges to a different fixed point
    y = mean (Hᵢ + (α + ρ)I)⁻¹(gᵢ + ρy)."""
    q = quadratics()
    algo = FedNew(rho=1.0, alpha=1e-3, hessian_mode="full")
    _, state, aggs = run(algo, q, X0, 500, fixed_x=True)
    g = q.gradients(X0, range(3)).mean(0)
    target = torch.linalg.solve(q.A.mean(0) + 1e-3 * torch.eye(5, dtype=torch.float64), g)
    torch.testing.assert_close(state.y, target, rtol=0, atol=1e-10)
    assert max(a.info["lambda_sum_norm"] for a in aggs) < 1e-10


def test_fednew_one_client_without_penalty_is_newton():
    """One client, ρ = 0, α = 0: y¹ = A⁻¹g, so x¹ = x*. Broken variant caught: stepping x + y."""
    q = quadratics(n=1)
    xs, _, _ = run(FedNew(rho=0.0, alpha=0.0, hessian_mode="full"), q, X0, 1)
    torch.testing.assert_close(xs[1], q.minimiser(), rtol=0, atol=1e-10)


def test_fednew_converges_to_the_minimiser():
    """r = 1, ρ = 1, three heterogeneous quadratics, 300 rounds: ‖x − x*‖ < 1e-8, y → 0 and
    λᵢ → ∇fᵢ(x*) (which sum to 0). Broken variant caught: clients solving without their λᵢ
    (yᵢ = (Hᵢ + (α + ρ)I)⁻¹(gᵢ + ρy)), whose fixed point solves Σᵢ(Hᵢ + (α + ρ)I)⁻¹gᵢ = 0 instead of
    Σᵢgᵢ = 0."""
    q = quadratics()
    xs, state, _ = run(FedNew(rho=1.0, alpha=1e-3, hessian_mode="full"), q, X0, 300)
    x_star = q.minimiser()
    assert (xs[-1] - x_star).norm() < 1e-8
    torch.testing.assert_close(state.lam, q.gradients(x_star, range(3)), rtol=0, atol=1e-7)


def test_fednew_with_a_frozen_hessian_still_converges():
    """r = 0 (Hᵢ taken once, newton_ADMM.m): quadratics with a Hessian frozen at the first round are
    exact, so use ones whose Hessians differ from the frozen ones — a fixed point still needs
    Σᵢgᵢ = 0 whatever the Hᵢ. Broken variant caught: clients solving without their λᵢ."""
    q = quadratics()
    frozen = FedNew(rho=1.0, alpha=1e-3, hessian_every=0, hessian_mode="full")
    n = q.num_clients
    state, x = init_state(frozen, X0, n, None), X0.clone()
    for t in range(400):
        if t == 1:                       # the clients' true Hessians change after the first round
            q.A = q.A * 1.5
        ctx = Context(round=t, rounds=400, params=x, num_clients=n, num_sampled=n)
        agg = frozen.aggregate(frozen.client_update(ctx, frozen.configure(ctx, state), q), state, ctx)
        state, x = agg.state, x - agg.direction
    assert q.gradients(x, range(n)).mean(0).norm() < 1e-8


def test_fednew_conjugate_gradients_equal_the_direct_solve():
    """The large-d reading (CG with Hessian-vector products) gives the direct reading's yᵢ on a
    positive-definite system (d = 20, 50 iterations). Broken variant caught: CG without its warm
    start's residual (r₀ = b instead of b − Ax₀) on the second round."""
    q = quadratics(d=20)
    x0 = torch.linspace(-1.0, 1.0, 20, dtype=torch.float64)
    direct, _, _ = run(FedNew(hessian_mode="full"), q, x0, 3)
    cg, _, aggs = run(FedNew(hessian_mode="cg", cg_iters=50, cg_tol=0.0), quadratics(d=20), x0, 3)
    for a, b in zip(direct, cg):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-8)


def test_fednew_refreshes_its_hessian_on_the_codes_rounds():
    """r = 3, 9 rounds: a client takes its Hessian at rounds 0, 2, 5 and 8 (0-based), at that round's
    global model — the code's iterations i = 1 and rem(i, r) = 0 with i = round + 1
    (newton_ADMM_periodic_Hk.m:52) — and solves with the one from its last refresh in between.
    Broken variant caught: refreshing where round % r == 0 (rounds 0, 3, 6), one round late."""
    q = quadratics()
    algo = FedNew(rho=1.0, alpha=1e-3, hessian_every=3, hessian_mode="full")
    refreshed, state, x = [], init_state(algo, X0, 3, None), X0.clone()
    for t in range(9):
        ctx = Context(round=t, rounds=9, params=x, num_clients=3, num_sampled=3)
        before = q.states.get(0)
        agg = algo.aggregate(algo.client_update(ctx, algo.configure(ctx, state), q), state, ctx)
        if before is None or not torch.equal(q.states[0].reference, before.reference):
            refreshed.append(t)
            torch.testing.assert_close(q.states[0].reference, x, rtol=0, atol=0)
        state, x = agg.state, x - agg.direction
    assert refreshed == [0, 2, 5, 8]


def test_the_cache_key_changes_exactly_where_the_computation_did():
    """Keys of the configs whose results are unchanged stay what they were before FedLF's message and
    decay, FedHEAL's defaults and FedNew's refresh rounds (pinned: computed by the code before these
    changes), so their cached results are still read; the others change, so no old result is read for
    them: FedLF (its default now decays), FedHEAL() (now τ = 0.3, β = 0.4; τ = β = 0.5 is the old
    default's key), FedNew with r > 1 (Algorithm.revision), and, since the solve leaves out the
    directions below float32's precision (base.newton_solve), FedNew's dense reading and FedNL's
    Option 2, while FedNew's CG reading and FedNL's Option 1 keep their keys. Broken variants caught: a
    new FedLF option left out of the key at its default (the old key, an undecayed result), FedNew's
    fixes without a key change, a CACHE_VERSION bump (every pinned key changes)."""
    keys = lambda algorithm: ADULT.replace(algorithm=algorithm).key()       # noqa: E731
    assert keys({"name": "fedheal", "tau": 0.5, "beta": 0.5}) == "1a9de887baa4a555"
    assert keys({"name": "fednew", "hessian_mode": "cg"}) == "5d80425844901128"        # unchanged computation
    assert keys("fednl") == "3ae10317bebf64cc"                                         # Option 1: unchanged
    assert keys({"name": "fednew", "hessian_every": 0}) not in ("323c6a989506d2ee", keys("fednew"))
    assert keys("fednew") != "b785e957f0ac088e"
    assert keys({"name": "fednl", "opt": 2}) != "7270f5058b706a24"
    assert keys({"name": "fednew", "hessian_every": 3}) != "0e90bacbff73b3bf"
    assert keys("fedheal") != "1a9de887baa4a555"
    assert "f4e1745ff91e3561" not in {keys("fedlf"), keys({"name": "fedlf", "lr_decay": 1.0}),
                                      keys({"name": "fedlf", "message": "gradient"})}
    for algorithm in ({"name": "fednew", "hessian_every": 3}, {"name": "fedlf", "lr_decay": 1.0}):
        cfg = ADULT.replace(algorithm=algorithm)
        back = ExperimentConfig.from_dict(cfg.to_dict())               # how a sweep sends a config to a worker
        assert back == cfg and back.key() == cfg.key()


def test_conjugate_gradients_stop_at_negative_curvature():
    A = torch.diag(torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)).unsqueeze(0)
    b = torch.ones(1, 3, dtype=torch.float64)
    x, steps, negative = conjugate_gradient(lambda v: v @ A[0].T + 0.01 * v, b, torch.zeros_like(b), 10, 1e-10)
    assert bool(negative[0]) and torch.isfinite(x).all()


def test_fednew_sends_one_vector_per_client():
    """Only yᵢ leaves a client (FedNew's privacy claim): its report is one d-vector per client (beside
    it, the simulation logs how many directions the clients' solves left out, a count no server needs)."""
    q = quadratics()
    algo = FedNew(hessian_mode="full")
    ctx = Context(params=X0, num_clients=3, num_sampled=3)
    reports = algo.client_update(ctx, algo.configure(ctx, algo.init(X0, 3)), q)
    assert reports.updates.shape == (3, 5) and set(reports.extras) == {"fednew_y", "newton_dropped"}
    assert reports.extras["newton_dropped"].numel() == 1
    torch.testing.assert_close(reports.extras["fednew_y"], reports.updates)


# ----------------------------------------------------------------------------- FedHEAL

def _heal_reports(g, masks, distance, ids=None):
    m = len(g)
    return ClientUpdates(np.arange(m) if ids is None else np.asarray(ids), g, torch.ones(m, dtype=torch.long),
                         extras={"heal_mask": masks, "heal_distance": distance})


def test_fedheal_without_mask_and_momentum_is_fedavg():
    """β = 0 and τ = −1 (every coordinate kept): the weights stay uniform and d = mean gᵢ, every
    round. Broken variant caught: the distance share without its factor β (Δ ← (1 − β)Δ + D/ΣD)."""
    algo = FedHEAL(tau=-1.0, beta=0.0)
    g = torch.randn(3, 3, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    state = algo.init(torch.zeros(4), 3)
    for t in range(3):
        masks = torch.ones(3, 4, dtype=torch.float64)
        agg = algo.aggregate(_heal_reports(g[t], masks, torch.tensor([1.0, 2.0, 5.0])), state, Context(round=t))
        state = agg.state
        torch.testing.assert_close(agg.weights, torch.full((3,), 1 / 3, dtype=torch.float64))
        torch.testing.assert_close(agg.direction, g[t].mean(0))


def test_fedheal_weights_are_uniform_when_clients_agree():
    """Equal distances Dₖ in every round give pₖ = 1/m under full participation, however the
    updates differ in direction and size. Broken variant caught: the server recomputing the
    distances from the updates (one global norm) instead of the clients' Dₖ."""
    algo = FedHEAL(tau=-1.0, beta=0.5)
    state = algo.init(torch.zeros(4), 4)
    gen = torch.Generator().manual_seed(2)
    for t in range(5):
        g = torch.randn(4, 4, generator=gen, dtype=torch.float64) * torch.tensor([[1.0], [10.0], [0.1], [3.0]])
        agg = algo.aggregate(_heal_reports(g, torch.ones(4, 4, dtype=torch.float64), torch.full((4,), 3.0)), state,
                             Context(round=t))
        state = agg.state
        torch.testing.assert_close(agg.weights, torch.full((4,), 0.25, dtype=torch.float64))


def test_fedheal_weights_by_hand():
    """m = 2, β = 0.5: D = (1, 3) gives p = (0.41667, 0.58333), then D = (3, 1) gives
    (0.47222, 0.52778) (federated_model.py:70-87). Broken variants caught: storing P normalised
    (round 2: 0.48810, 0.51190) and dropping the (1 − β)Δ momentum (round 2: 0.5, 0.5)."""
    P, delta = torch.full((2,), 0.5, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)
    p, P, delta = fael_weights(torch.tensor([1.0, 3.0], dtype=torch.float64), P, delta, 0.5)
    torch.testing.assert_close(delta, torch.tensor([0.125, 0.375], dtype=torch.float64))
    torch.testing.assert_close(p, torch.tensor([0.625, 0.875], dtype=torch.float64) / 1.5)
    p, P, delta = fael_weights(torch.tensor([3.0, 1.0], dtype=torch.float64), P, delta, 0.5)
    torch.testing.assert_close(P, torch.tensor([1.0625, 1.1875], dtype=torch.float64))
    torch.testing.assert_close(p, torch.tensor([0.47222, 0.52778], dtype=torch.float64), rtol=0, atol=1e-5)


def test_fedheal_mask_by_hand():
    """One client, τ = 0.3: g = (+1, −1, +2) gives M = 1, h = (1, 0, 1); then g = (+1, +1, −1) gives
    c = (1, 0, 0), M = (1, 0, 0), h = (1, 0.5, 0.5); at τ = 0 the strict > still drops c = 0.
    Broken variants caught: ≥ instead of >, and the history moved before the mask is taken."""
    mask, h = consistency_mask(torch.tensor([1.0, -1.0, 2.0]), None, 0, 0.3)
    assert mask.tolist() == [1, 1, 1] and h.tolist() == [1, 0, 1]
    g1 = torch.tensor([1.0, 1.0, -1.0])
    mask, h1 = consistency_mask(g1, h, 1, 0.3)
    assert mask.tolist() == [1, 0, 0] and h1.tolist() == [1, 0.5, 0.5]
    assert consistency_mask(g1, h, 1, 0.0)[0].tolist() == [1, 0, 0]


def test_fedheal_renormalises_each_coordinate_over_the_clients_that_kept_it():
    """Client A keeps coordinate 1, client B masks it: d[1] = ĝ_A[1] in full, not p_A·ĝ_A[1]; a
    coordinate nobody kept gets 0 (no NaN). Broken variant caught: dividing by Σpₖ instead of
    Zⱼ = Σₖ pₖMₖ[j]."""
    g = torch.tensor([[1.0, 4.0, 0.0], [3.0, 0.0, 0.0]], dtype=torch.float64)
    masks = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    d = masked_average(g, masks, torch.tensor([0.25, 0.75], dtype=torch.float64))
    torch.testing.assert_close(d, torch.tensor([2.5, 4.0, 0.0], dtype=torch.float64))


def test_fedheal_distance_sums_per_tensor_norms():
    """D = Σ_l ‖ĝ_l‖₂ over the layout's tensors (federated_model.py:89-95): slices (3, 4), (0,) give 5;
    slices (3,), (4,) give 7 where one global norm gives 5. Broken variant caught: one global norm."""
    assert float(layer_distance(torch.tensor([[3.0, 4.0, 0.0]]), ParamLayout(("w", "b"), ((2,), (1,))))[0]) == 5.0
    assert float(layer_distance(torch.tensor([[3.0, 4.0]]), ParamLayout(("w", "b"), ((1,), (1,))))[0]) == 7.0


def test_fedheal_defaults_are_its_codes_threshold_and_momentum():
    """FedHEAL() takes the authors' τ = 0.3 and β = 0.4 (FedHEAL's main.py:52-53), not τ = β = 0.5 (a
    reading of DQN-Fed App. H's line, which is FedFV's Table 1 entry for FedFa). A coordinate whose
    sign agreed with 1 of its 3 past rounds (c = 1/3) is kept (masked at τ = 0.5); D = (1, 3) from
    P = (½, ½) weighs the clients (3/7, 4/7) ((0.41667, 0.58333) at β = 0.5). Broken variant caught:
    the old defaults."""
    algo = FedHEAL()
    signs = [1.0, -1.0, -1.0, 1.0]

    class Fixed(Quadratics):
        def train(self, ids, params, local, **kw):
            return ClientUpdates(np.asarray(ids), torch.tensor([[signs[self.round]]]), torch.ones(1))
    clients = Fixed(torch.ones(1, 1, 1), torch.zeros(1, 1))
    state = algo.init(torch.zeros(1), 1)
    for t in range(4):
        clients.round = t
        ctx = Context(round=t, params=torch.zeros(1), num_clients=1, num_sampled=1)
        reports = algo.client_update(ctx, algo.configure(ctx, state), clients)
        state = algo.aggregate(reports, state, ctx).state
    assert abs(float(clients.states[0].history[0]) - 0.5) < 1e-12 and reports.extras["heal_mask"].tolist() == [[1.0]]
    two = algo.aggregate(_heal_reports(torch.ones(2, 1, dtype=torch.float64), torch.ones(2, 1, dtype=torch.float64),
                                       torch.tensor([1.0, 3.0], dtype=torch.float64)), algo.init(torch.zeros(1), 2),
                         Context())
    torch.testing.assert_close(two.weights, torch.tensor([3 / 7, 4 / 7], dtype=torch.float64))
    assert make_algorithm("fedheal") == FedHEAL(tau=0.3, beta=0.4)


def test_fedheal_keeps_each_clients_history_on_the_client():
    """A client's mask history follows its own rounds (nᵢ), kept in clients.states."""
    q = quadratics(n=2, d=3)
    algo = FedHEAL(tau=0.3)
    g = [torch.tensor([[1.0, -1.0, 2.0], [1.0, 1.0, 1.0]]), torch.tensor([[1.0, 1.0, -1.0], [1.0, 1.0, 1.0]])]

    class Fixed(Quadratics):
        def train(self, ids, params, local, **kw):
            return ClientUpdates(np.asarray(ids), g[self.round][list(ids)].clone(), torch.ones(len(ids)))
    clients = Fixed(q.A, q.b)
    state = algo.init(torch.zeros(3), 2)
    for t in range(2):
        clients.round = t
        ctx = Context(round=t, params=torch.zeros(3), num_clients=2, num_sampled=2)
        reports = algo.client_update(ctx, algo.configure(ctx, state), clients)
        state = algo.aggregate(reports, state, ctx).state
    assert reports.extras["heal_mask"][0].tolist() == [1, 0, 0] and clients.states[0].count == 2
    assert clients.states[0].history.tolist() == [1, 0.5, 0.5]


# ----------------------------------------------------------------------------- FedLF

def test_fedlf_fair_gradient_is_the_chain_rule_gradient_of_minus_cosine():
    """g_P = hᵀG equals autograd's ∇(−cos(1, F(w))) for three toy losses; Lᵀh = 0 and pᵀh ≤ 0 (FedLF
    eq. 5). Broken variant caught: h with its sign flipped."""
    w = torch.tensor([0.3, -0.2, 0.5, 1.0], dtype=torch.float64, requires_grad=True)
    losses = torch.stack([(w ** 2).sum() + 1, ((w - 1) ** 2).sum(), (w[:2] * w[2:]).sum() + 3])
    P = -torch.nn.functional.cosine_similarity(torch.ones(3, dtype=torch.float64), losses, dim=0)
    (expected,) = torch.autograd.grad(P, w, retain_graph=True)
    G = torch.stack([torch.autograd.grad(f, w, retain_graph=True)[0] for f in losses])
    h = fair_coefficients(losses.detach())
    torch.testing.assert_close(h @ G, expected, rtol=0, atol=1e-10)
    assert abs(float(losses.detach() @ h)) < 1e-12 and float(h.sum()) / math.sqrt(3) <= 0


G_CONFLICT = torch.tensor([[3.0, 0.0, 1.0, 0.1], [0.0, 1.0, -1.0, 0.1]], dtype=torch.float64)
TWO_LAYERS = [slice(0, 2), slice(2, 4)]


def test_fedlf_descends_on_every_clients_layer_objective():
    """Two clients, two layers, no fair objective: the model-level MGDA point conflicts with client
    1 on layer B (d_B·g₁,B < 0); FedLF's per-layer min-norm point satisfies q·dₗ ≥ ‖dₗ‖² for every row q
    of every layer (its KKT conditions: −dₗ descends on every client's layer loss). Broken variant
    caught: one QP on the whole vector (the paper's ablation M2)."""
    for normalize in (False, True):
        d, _ = fedlf_direction(G_CONFLICT, None, TWO_LAYERS, normalize=normalize, fair=False)
        for sl in TWO_LAYERS:
            assert (G_CONFLICT[:, sl] @ d[sl]).min() > 0
        assert (G_CONFLICT @ d).min() > 0
    raw, _ = fedlf_direction(G_CONFLICT, None, TWO_LAYERS, normalize=False, fair=False)
    assert abs(float(raw[2])) < 1e-9 and float(raw[3]) > 0        # d_B ∝ (0, 0.1)
    whole, _ = fedlf_direction(G_CONFLICT, None, [slice(0, 4)], normalize=False, fair=False)
    assert float(G_CONFLICT[0, 2:] @ whole[2:]) < 0          # what the per-layer rule removes


def test_fedlf_rescales_to_the_mean_update_norm():
    """‖d‖ = ‖(1/m)Σgᵢ‖ (Algorithm 1 line 15). Broken variant caught: no rescaling."""
    d, _ = fedlf_direction(G_CONFLICT, torch.tensor([1.0, 2.0]), TWO_LAYERS)
    assert abs(float(d.norm() - G_CONFLICT.mean(0).norm())) < 1e-9


def test_fedlf_row_normalisation_is_scale_invariant():
    """Scaling one client's update by 100 changes the normalised direction only in scale per layer,
    and the descent conditions still hold (code FedLF.py:82-93)."""
    a, _ = fedlf_direction(G_CONFLICT, None, TWO_LAYERS, fair=False)
    scaled = G_CONFLICT * torch.tensor([[100.0], [1.0]], dtype=torch.float64)
    b, _ = fedlf_direction(scaled, None, TWO_LAYERS, fair=False)
    for sl in TWO_LAYERS:
        cos = float(a[sl] @ b[sl] / (a[sl].norm() * b[sl].norm()))
        assert cos > 1 - 1e-9
        assert (scaled[:, sl] @ b[sl]).min() > 0


def test_fedlf_merges_a_layer_whose_direction_vanishes():
    """Layer A = (1,) vs (−1,) has min-norm point 0; Algorithm 1 lines 9–12 merge it with layer B and
    the merged layer's direction moves A's entry. Broken variant caught: no merge (the code's
    behaviour), which leaves d_A = 0."""
    g = torch.tensor([[1.0, 2.0, 0.5], [-1.0, 1.0, 0.3]], dtype=torch.float64)
    d, info = fedlf_direction(g, None, [slice(0, 1), slice(1, 3)], normalize=False, fair=False)
    assert info["merges"] == 1 and abs(float(d[0])) > 1e-3 and (g @ d).min() > 0


def test_fedlf_equal_losses_drop_the_fair_objective():
    """L = (2, 2, 2): h = 0 up to rounding (4e-17 here, so g_P is a tiny multiple of Σgᵢ); the direction
    is the one without the fair objective (no NaN, not 0), whatever the updates' scale. Broken
    variant caught: no relative guard on ‖g_P‖ (the code divides by it, FedLF.py:87), which rescales
    the rounding error to a full row."""
    g = 1e6 * torch.randn(3, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    slices = [slice(0, 3), slice(3, 6)]
    d, info = fedlf_direction(g, torch.full((3,), 2.0), slices)
    torch.testing.assert_close(d, fedlf_direction(g, None, slices, fair=False)[0])
    assert info["fair_active"] == 0 and d.norm() > 0


def test_fedlf_history_window():
    """10 clients, m = 2; rounds 1–4 took {0,1}, {2,3}, {4,5}, {6,7}; at round 6 with S = {8, 9}:
    M = 8 seen before, τ = 4, history clients {2, …, 7} (FedLF §3.3, code FedLF.py:169-175). Broken
    variants caught: counting the current clients in M (adds 0 and 1), the last round only
    ({6, 7}), all history (adds 0 and 1)."""
    last = torch.full((10,), -1, dtype=torch.long)
    for r, pair in zip(range(1, 5), ((0, 1), (2, 3), (4, 5), (6, 7))):
        last[list(pair)] = r
    assert history_clients(last, torch.tensor([8, 9]), 6).tolist() == [2, 3, 4, 5, 6, 7]


def test_fedlf_with_one_client_is_its_update():
    """m = 1, no history: d = g₁ (the rescaling restores its norm)."""
    g = torch.tensor([[0.5, -1.0, 2.0, 0.0]], dtype=torch.float64)
    d, _ = fedlf_direction(g, torch.tensor([0.7]), TWO_LAYERS)
    torch.testing.assert_close(d, g[0])


def test_fedlf_gradient_message_is_the_full_batch_gradient_at_the_global_model():
    """message='gradient' (the released code: Client.cal_gradient_loss, no local training): each client
    sends ∇Fᵢ(w) and Fᵢ(w) at the global model w (the quadratics' runtime has no ``train``: a client
    that trained would fail), and the server steps η·γᵗ·d with the code's per-round decay of its one
    learning rate (Algorithm.py:130-133), from γ⁰ at round 0. Broken variants caught: the local update
    sent, the decay one round early (γᵗ⁺¹) or left out."""
    q = quadratics(n=3, d=4)
    algo = FedLF(message="gradient", server_lr=0.1, lr_decay=0.5)
    w = torch.tensor([0.3, -1.0, 2.0, 0.5], dtype=torch.float64)
    ctx = Context(round=0, rounds=3, params=w, num_clients=3, num_sampled=3)
    plan = algo.configure(ctx, algo.init(w, 3))
    reports = algo.client_update(ctx, plan, q)
    torch.testing.assert_close(reports.updates, q.gradients(w, range(3)))
    torch.testing.assert_close(reports.loss_before, q.losses(w, range(3)))
    opt = algo.server_optimizer()
    lrs = [opt.update(torch.ones(4), opt.init(w), t, 3)[2]["lr"] for t in range(3)]
    assert lrs == [0.1, 0.05, 0.025]


def test_fedlf_update_message_decays_the_clients_learning_rate():
    """message='update' (the paper's Algorithm 1): the paper's one learning rate η trains the clients
    and steps the server on (w − wᵢ)/η, so the server's η cancels and what its per-round decay
    (0.999, §4) changes is the clients' rate: local.lr·γᵗ in round t, the server step left at
    server_lr. Broken variants caught: the decay on the server step, or one round early."""
    local = LocalTraining(epochs=1, batch_size=None, lr=0.1)
    algo = FedLF()
    assert algo.lr_decay == 0.999 and algo.message == "update"
    for t in (0, 1, 7):
        plan = algo.configure(Context(round=t, local=local, num_clients=2, num_sampled=2), None)
        assert plan.local.lr == 0.1 * 0.999 ** t and plan.local.batch_size is None
    opt = algo.server_optimizer()
    assert [opt.update(torch.ones(2), None, t, 10)[2]["lr"] for t in (0, 5)] == [1.0, 1.0]
    assert FedLF(lr_decay=1.0).configure(Context(round=7, local=local), None).local == local


def test_fedlf_decay_reaches_the_clients_from_the_second_round_on_adult():
    """On Adult, FedLF() and FedLF(lr_decay=1) train the same first round (γ⁰ = 1) and differ from the
    second on (γ = 0.5 to make it visible); message='gradient' runs without local training, its
    training loss falling. Broken variant caught: the decayed plan not reaching the clients' training."""
    from fairfl.runs.loop import simulate
    plain = simulate(ADULT.replace(algorithm={"name": "fedlf", "lr_decay": 1.0}), progress=False)
    decayed = simulate(ADULT.replace(algorithm={"name": "fedlf", "lr_decay": 0.5}), progress=False)
    assert plain.train_loss[:2] == decayed.train_loss[:2] and plain.train_loss[2] != decayed.train_loss[2]
    gradient = simulate(ADULT.replace(algorithm={"name": "fedlf", "message": "gradient", "server_lr": 0.5}),
                        progress=False)
    assert gradient.train_loss[-1] < gradient.train_loss[0] and gradient.round_lr[:2] == [0.5, 0.5 * 0.999]


def test_fedlf_rule_keeps_the_absent_clients_updates():
    algo = FedLF()
    state = algo.init(torch.zeros(4, dtype=torch.float64), 4)
    layout = ParamLayout(("a", "b"), ((2,), (2,)))
    r = ClientUpdates(np.array([0, 1]), G_CONFLICT, torch.ones(2), loss_before=torch.tensor([1.0, 2.0]))
    agg = algo.aggregate(r, state, Context(round=0, layout=layout))
    assert agg.state.last_round.tolist() == [0, 0, -1, -1] and torch.equal(agg.state.last_update[:2], G_CONFLICT)
    assert agg.info["layers"] == 2


# ----------------------------------------------------------------------------- citations of the authors' code

# The files each module cites, in the commit its docstring names, with their lengths in lines (counted
# on those commits; the files themselves are not copied here). FedHEAL's module also cites the FedLF
# code's FedFa defaults.
FEDLF_CODE = {"gfedplat/algorithm/FedLF/FedLF.py": 232, "gfedplat/Algorithm.py": 343, "gfedplat/Client.py": 314,
              "gfedplat/main.py": 195, "gfedplat/Module.py": 191}
AUTHORS_CODE = {
    "fedlf": (("zibinpan/FedLF", "7b6e0b7"), FEDLF_CODE),
    "fedheal": (("yuhangchen0/FedHEAL", "770e094"),
                {"main.py": 103, "models/utils/federated_model.py": 219, "models/fedavgheal.py": 79,
                 "utils/args.py": 38, "utils/best_args.py": 28, "gfedplat/main.py": FEDLF_CODE["gfedplat/main.py"]}),
    "fednl": (("Rustem-Islamov/FedNL-Public", "ac72ee9"), {"methods.py": 1947, "utils.py": 580}),
    "fednew": (("aelgabli/FedNew", "459c0b2"),
               {"newton_ADMM.m": 125, "newton_ADMM_Hk.m": 125, "newton_ADMM_periodic_Hk.m": 125}),
}
CITATION = re.compile(r"(?:([\w./]+\.(?:py|m))|(?<=``)):(\d+(?:[-–]\d+)?(?:, \d+(?:[-–]\d+)?)*)")


def citations(source: str):
    """(file, first line, last line) of every ``file:lines`` in ``source``; a bare ``:lines`` in
    double backticks continues the file cited before it."""
    current = None
    for match in CITATION.finditer(source):
        current = match.group(1) or current
        for part in match.group(2).split(", "):
            first, _, last = part.replace("–", "-").partition("-")
            yield current, int(first), int(last or first)


@pytest.mark.parametrize("module", list(AUTHORS_CODE))
def test_citations_of_the_authors_code_point_at_lines_that_exist(module):
    """Every file:line the module cites (docstrings and comments) names a file of the authors' code
    at the commit the module names, and lines within it. Broken variant caught: FedHEAL citing
    ``utils/args.py:52-53`` for --threshold and --beta (a file of 38 lines; they are main.py:52-53)."""
    import importlib
    source = inspect.getsource(importlib.import_module(f"fairfl.federated.algorithms.{module}"))
    (repo, commit), files = AUTHORS_CODE[module]
    assert f"``{repo}``" in source and commit in source
    found = list(citations(source))
    assert len(found) >= 8
    for name, first, last in found:
        matches = [f for f in files if f == name] or [f for f in files if f.endswith("/" + name)]
        assert len(matches) == 1, f"{module} cites {name}: not one file of {repo}@{commit}"
        assert 1 <= first <= last <= files[matches[0]], f"{module} cites {name}:{first}-{last}, past its end"


# ----------------------------------------------------------------------------- degenerate inputs

rows = st.lists(st.lists(st.sampled_from([0.0, 1.0, -1.0, 1e-30, 1e30, 3.5, -2.25]), min_size=4, max_size=4),
                min_size=1, max_size=4)


@given(rows)
def test_fedlf_and_fedheal_stay_finite_on_degenerate_updates(values):
    """Zeros, duplicates, huge and tiny entries, m = 1: finite directions, never NaN."""
    g = torch.tensor(values, dtype=torch.float64)
    losses = torch.linspace(0.5, 1.5, len(g), dtype=torch.float64)
    d, _ = fedlf_direction(g, losses, TWO_LAYERS)
    assert torch.isfinite(d).all()
    if g.abs().max() < 1e20:
        assert d.norm() <= g.mean(0).norm() * (1 + 1e-9) + 1e-300
    masks = (g != 0).double()
    p = torch.full((len(g),), 1 / len(g), dtype=torch.float64)
    assert torch.isfinite(masked_average(g, masks, p)).all()
    distance = layer_distance(g, ParamLayout.single(4))
    assert torch.isfinite(fael_weights(distance, p.clone(), torch.zeros_like(p), 0.5)[0]).all()


@given(st.sampled_from(["identity", "rank", "topk"]), st.integers(1, 5))
def test_compressed_difference_is_symmetric(kind, k):
    M = quadratics().A[0] - quadratics(seed=1).A[1]
    C = compress(M, kind, rank=k, k=k)
    torch.testing.assert_close(C, C.T)


def test_fednl_and_fednew_take_no_step_from_zero_gradients():
    """Clients at their minimisers (gᵢ = 0 for all i, with b chosen so): both methods stay put."""
    q = quadratics()
    x = torch.ones(5, dtype=torch.float64)
    q.b = torch.stack([q.A[k] @ x for k in range(3)])
    for algo in (FedNL(hessian_mode="full"), FedNew(hessian_mode="full"), FedNew(hessian_mode="cg")):
        xs, _, _ = run(algo, Quadratics(q.A, q.b), x, 2)
        torch.testing.assert_close(xs[-1], x, rtol=0, atol=1e-12)


def test_fednew_on_an_ill_conditioned_hessian_stays_finite():
    A = torch.diag(torch.tensor([1e-8, 1.0, 1e6, 1.0, 1.0], dtype=torch.float64)).expand(2, 5, 5).clone()
    q = Quadratics(A, torch.ones(2, 5, dtype=torch.float64))
    for mode in ("full", "cg"):
        xs, _, _ = run(FedNew(hessian_mode=mode, rho=1e-2, alpha=1e-3), q, X0, 3)
        assert all(torch.isfinite(x).all() for x in xs)


# ----------------------------------------------------------------------------- real data, end to end

ADULT = ExperimentConfig(dataset="adult", model="logreg",
                         partition=PartitionSpec("attribute", num_clients=2, attribute_values=(0, 1), split=None),
                         local=LocalTraining(epochs=1, batch_size=500, lr=0.1), rounds=3, clients_per_round=2,
                         eval_every=1)
MLP = ExperimentConfig(dataset="fashion_mnist", dataset_options={"classes": (6, 2, 0), "normalize": "per_feature"},
                       model="mlp2", model_options={"hidden": (16,)},
                       partition=PartitionSpec("one_class", num_clients=3, classes=(0, 1, 2), split=None),
                       local=LocalTraining(epochs=1, batch_size=None, lr=0.1), rounds=2, participation=1.0,
                       eval_every=1)


@pytest.mark.parametrize("name", ["fedlf", "fedheal", "fednl", "fednew"])
def test_each_baseline_trains_adults_logistic_regression(name, tmp_path):
    """A few rounds on real data through fairfl.runs.sweeps.run, d = 200 (the exact Newton readings)."""
    from fairfl.runs.sweeps import run as run_cached
    h = run_cached(ADULT.replace(algorithm=name), root=tmp_path, progress=False)
    assert h.rounds_done == 3 and all(np.isfinite(h.train_loss))
    assert h.train_loss[-1] < h.train_loss[0]


@pytest.mark.parametrize("name", ["fedlf", "fedheal", "fednl", "fednew"])
def test_each_baseline_runs_a_small_mlp(name, tmp_path, fmnist):
    """Two rounds of a one-hidden-layer MLP (d ≈ 12 600 > 2000: FedNL's diagonal reading, FedNew's
    conjugate gradients, FedLF's per-layer QPs over four tensors)."""
    from fairfl.runs.sweeps import run as run_cached
    h = run_cached(MLP.replace(algorithm=name), root=tmp_path, progress=False)
    assert h.rounds_done == 2 and all(np.isfinite(h.train_loss))
    if name == "fednew":
        assert h.info["cg_steps"][-1] >= 1
    if name == "fedlf":
        assert h.info["layers"][-1] >= 1
    assert make_algorithm(name).name == name


@pytest.mark.parametrize("name", ["fedlf", "fedheal", "fednl", "fednew"])
def test_a_resumed_run_equals_the_uninterrupted_one(name, tmp_path):
    """Server and client states (FedLF's history, FedHEAL's weights and masks' histories, FedNL's
    learned Hessians, FedNew's duals and frozen Hessians) survive a checkpoint."""
    from fairfl.runs.loop import simulate
    algorithm = {"name": "fednew", "hessian_every": 0} if name == "fednew" else name
    cfg = ADULT.replace(algorithm=algorithm, rounds=3, checkpoint_every=1)
    whole = simulate(cfg, progress=False)
    simulate(cfg, checkpoint_dir=tmp_path, stop_after=2, progress=False)
    resumed = simulate(cfg, checkpoint_dir=tmp_path, progress=False)
    assert resumed.train_loss == whole.train_loss


def test_fednews_two_readings_agree_on_adult():
    """On Adult's logistic regression (d = 200) the large-d reading (conjugate gradients with the
    runtime's Hessian-vector products) follows the exact one (dense Hessians, direct solves) when CG
    runs to convergence: the same losses to 1e-6, round by round."""
    from fairfl.runs.loop import simulate
    full = simulate(ADULT.replace(algorithm={"name": "fednew", "hessian_mode": "full"}), progress=False)
    cg = simulate(ADULT.replace(algorithm={"name": "fednew", "hessian_mode": "cg", "cg_iters": 100, "cg_tol": 1e-10,
                                                  "products": "float64"}),
                  progress=False)
    np.testing.assert_allclose(cg.train_loss, full.train_loss, rtol=1e-6)
    assert full.train_loss[-1] < full.train_loss[0]


@pytest.mark.parametrize("algorithm", [{"name": "fednl", "hessian_mode": "diag", "mu": 0.5},
                                       {"name": "fednew", "hessian_mode": "cg", "cg_iters": 20, "cg_tol": 1e-6}])
def test_float32_products_follow_float64_ones(algorithm):
    """The large-d readings take their Hessian-vector products in the model's float32 by default (2.6×
    faster than float64 on a CPU): on Adult the losses follow those of float64 products to 1e-4, and
    they are not the same computation (the option reaches the products). Broken variant caught: the
    products' dtype ignored (bit-identical runs)."""
    from fairfl.runs.loop import simulate
    f32 = simulate(ADULT.replace(algorithm=algorithm), progress=False)
    f64 = simulate(ADULT.replace(algorithm={**algorithm, "products": "float64"}), progress=False)
    np.testing.assert_allclose(f32.train_loss, f64.train_loss, rtol=1e-4)
    assert f32.info != f64.info                # the losses are stored in float32; the round's records differ


def test_a_subsampled_hessian_is_the_hessian_of_the_mean_loss_over_those_rows():
    """``clients.hvp(..., rows=r)`` is ∇²(mean loss over rows r)·v: the same as the products of a client
    that holds only those rows; the rows are fixed for a run (the same in every round, drawn from the
    seed, different between clients), and b ≥ n means all rows. Broken variants caught: rows ignored,
    rows drawn per round."""
    from fairfl.federated.algorithms.base import hessian_rows
    from fairfl.training.client import hessian_vector_products
    from fairfl.federated.models import build_model
    from fairfl.federated.partition import Client
    torch.manual_seed(0)
    model = build_model("mlp2", (12,), 3, hidden=(8,))
    x, y = torch.randn(50, 12), torch.randint(0, 3, (50,))
    empty = x[:0], y[:0], x[:0], y[:0]
    whole = [Client(x, y, *empty), Client(x[:30], y[:30], *empty)]
    w = torch.cat([p.detach().flatten() for p in model.parameters()])
    v = torch.randn(2, w.numel())

    class Runtime:
        def num_samples(self, ids):
            return torch.tensor([len(whole[k].y_train) for k in ids])

    rows = hessian_rows(Runtime(), [0, 1], Context(seed=3, round=7), 0x4E3, 20)
    assert rows[0] is not None and len(rows[0]) == 20 and bool((rows[0].diff() > 0).all())
    assert torch.equal(rows[0], hessian_rows(Runtime(), [0, 1], Context(seed=3, round=0), 0x4E3, 20)[0])
    assert not torch.equal(rows[0], hessian_rows(Runtime(), [0, 1], Context(seed=4, round=7), 0x4E3, 20)[0])
    assert not torch.equal(rows[0], rows[1])
    sub = hessian_vector_products(model, w, whole, [0, 1], v, dtype=torch.float64, rows=rows)
    alone = hessian_vector_products(model, w, [Client(x[rows[0]], y[rows[0]], *empty),
                                               Client(x[:30][rows[1]], y[:30][rows[1]], *empty)], [0, 1], v,
                                    dtype=torch.float64)
    torch.testing.assert_close(sub, alone)
    assert not torch.allclose(sub, hessian_vector_products(model, w, whole, [0, 1], v, dtype=torch.float64))
    assert hessian_rows(Runtime(), [0, 1], Context(seed=3), 0x4E3, 50) == [None, None]
    assert hessian_rows(Runtime(), [0, 1], Context(seed=3), 0x4E3, None) is None


@pytest.mark.parametrize("name", ["fednl", "fednew"])
def test_hessian_batch_reaches_the_products_and_all_rows_is_the_default(name):
    """A subsample smaller than the clients' data changes the run; one at least as large as every
    client's data is the default run, bit for bit. Broken variant caught: the option not passed on."""
    from fairfl.runs.loop import simulate
    mode = {"fednl": {"hessian_mode": "diag", "mu": 0.5}, "fednew": {"hessian_mode": "cg"}}[name]
    plain = simulate(ADULT.replace(algorithm={"name": name, **mode}), progress=False)
    small = simulate(ADULT.replace(algorithm={"name": name, **mode, "hessian_batch": 64}), progress=False)
    every = simulate(ADULT.replace(algorithm={"name": name, **mode, "hessian_batch": 10 ** 7}), progress=False)
    assert small.info != plain.info and every.info == plain.info and every.train_loss == plain.train_loss


def test_a_non_finite_gradient_names_its_round_and_the_servers_step():
    """A second-order method's gradient at a global model that left the finite region is reported as
    that, in the round it happened (it read "round 0: local training ... lower the learning rate"
    whatever the round)."""
    from fairfl.training.client import gradients
    from fairfl.base.errors import TrainingDivergedError
    from fairfl.federated.models import build_model
    from fairfl.federated.partition import Client
    model = build_model("mlp2", (4,), 2, hidden=(3,))
    x, y = torch.randn(6, 4), torch.randint(0, 2, (6,))
    point = torch.full((sum(p.numel() for p in model.parameters()),), float("inf"))
    with pytest.raises(TrainingDivergedError, match=r"round 7: the gradient of client\(s\) \[0\] at the global model"):
        gradients(model, point, [Client(x, y, x[:0], y[:0], x[:0], y[:0])], [0], round_=7)


@pytest.fixture
def two_torch_threads():
    """A process that may use two cores: a lockstep group then computes two runs at once (its slots)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("name", ["fednl", "fednew"])
def test_second_order_runs_side_by_side_in_threads_give_their_lone_results(name, two_torch_threads):
    """Two seeds of FedNL / FedNew with dense Hessians (Adult, d = 200) as one lockstep group, each run
    in its own thread and both computing at once: both finish, each bit for bit the run alone. Broken
    variant caught: torch.func.hessian (forward over reverse mode) in two threads at once — torch's
    forward-AD levels are process-wide — lost one or both runs with "Trying to access a forward AD level
    with an invalid index", which notebook 06 then reported as divergence."""
    from fairfl.runs.loop import simulate, simulate_group
    configs = [ADULT.replace(algorithm=name, seed=s, rounds=2) for s in (0, 1)]
    together = simulate_group(configs, progress=False)
    assert not any(isinstance(h, BaseException) for h in together), together
    for config, history in zip(configs, together):
        alone = simulate(config, progress=False)
        assert history.train_loss == alone.train_loss and history.test_acc == alone.test_acc


def test_newton_solve_is_the_solve_where_it_can_be_and_the_minimum_norm_solution_where_not():
    """Hand-made systems: a well-conditioned A gives torch.linalg.solve's bits; a singular one (a
    diagonal with a zero, the same rotated, its vector form) gives A⁺b, the minimum-norm least-squares
    solution, which ignores b's part in the null space and has none there itself."""
    from fairfl.federated.algorithms.base import newton_solve
    A = torch.tensor([[2.0, 0.5], [0.5, 1.0]], dtype=torch.float64)
    b = torch.tensor([1.0, -3.0], dtype=torch.float64)
    assert torch.equal(newton_solve(A, b), torch.linalg.solve(A, b))
    D = torch.diag(torch.tensor([2.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(newton_solve(D, torch.tensor([1.0, 1.0], dtype=torch.float64)),
                               torch.tensor([0.5, 0.0], dtype=torch.float64))
    c, s = np.cos(0.3), np.sin(0.3)
    R = torch.tensor([[c, -s], [s, c]], dtype=torch.float64)
    x = newton_solve(R @ D @ R.T, R @ torch.tensor([1.0, 1.0], dtype=torch.float64))
    torch.testing.assert_close(x, R @ torch.tensor([0.5, 0.0], dtype=torch.float64))
    torch.testing.assert_close(newton_solve(torch.tensor([2.0, 0.0], dtype=torch.float64),
                                            torch.tensor([1.0, 1.0], dtype=torch.float64)),
                               torch.tensor([0.5, 0.0], dtype=torch.float64))
    assert torch.equal(newton_solve(torch.tensor([2.0, 4.0]), torch.tensor([1.0, 1.0])), torch.tensor([0.5, 0.25]))


def test_a_near_singular_newton_system_leaves_out_what_rounding_decides_and_bounds_the_step():
    """diag(1, 10⁻¹³) is regular in float64 (a plain solve gives 10⁵ along the second axis from a
    right-hand side of 10⁻⁸ there: float32 rounding of a unit gradient) but its second direction is
    below float32's precision relative to the first: it is left out, counted, and the step's norm is
    at most ‖b‖ / (ε₃₂·σ_max). Rotated, and as a diagonal vector, the same."""
    from fairfl.federated.algorithms.base import NEWTON_RCOND, newton_solve
    D = torch.diag(torch.tensor([1.0, 1e-13], dtype=torch.float64))
    b = torch.tensor([1.0, 1e-8], dtype=torch.float64)
    assert float(torch.linalg.solve(D, b)[1]) == pytest.approx(1e5)       # what a plain solve does
    stats = {}
    torch.testing.assert_close(newton_solve(D, b, stats), torch.tensor([1.0, 0.0], dtype=torch.float64))
    assert stats == {"dropped": 1}
    c, s = np.cos(0.3), np.sin(0.3)
    R = torch.tensor([[c, -s], [s, c]], dtype=torch.float64)
    x = newton_solve(R @ D @ R.T, R @ b)
    torch.testing.assert_close(x, R @ torch.tensor([1.0, 0.0], dtype=torch.float64))
    assert float(x.norm()) <= float(b.norm()) / NEWTON_RCOND
    torch.testing.assert_close(newton_solve(torch.tensor([1.0, 1e-13], dtype=torch.float64), b),
                               torch.tensor([1.0, 0.0], dtype=torch.float64))
    # just above the cut-off: solved as it stands
    kept = torch.diag(torch.tensor([1.0, 10 * NEWTON_RCOND], dtype=torch.float64))
    assert torch.equal(newton_solve(kept, b), torch.linalg.solve(kept, b))


@pytest.mark.parametrize("where", ["diagonal", "matrix", "vector", "rhs"])
def test_a_newton_system_holding_nan_or_inf_stops_the_run_as_diverged_naming_it(where):
    """A NaN on a diagonal had zeroed the whole step (the vector form's tolerance became NaN) and a
    NaN in a matrix raised torch's raw LinAlgError from the SVD: both now stop the run as diverged,
    saying which part of the system is not finite. FedNL's Option 1 too."""
    from fairfl.federated.algorithms.base import newton_solve
    from fairfl.federated.algorithms.fednl import newton_direction
    from fairfl.base.errors import TrainingDivergedError
    A = torch.eye(3, dtype=torch.float64)
    b = torch.ones(3, dtype=torch.float64)
    if where == "diagonal":
        A[1, 1] = float("nan")
    elif where == "matrix":
        A[0, 2] = float("inf")
    elif where == "vector":
        A = torch.tensor([1.0, float("nan"), 2.0], dtype=torch.float64)
    else:
        b[2] = float("inf")
    part = "right-hand side" if where == "rhs" else "matrix"
    with pytest.raises(TrainingDivergedError, match=f"NaN or Inf in its {part}"):
        newton_solve(A, b)
    for opt in (1, 2):
        with pytest.raises(TrainingDivergedError, match=f"NaN or Inf in its {part}"):
            newton_direction(b, A, 1e-3, opt)


@pytest.mark.parametrize("rho, alpha", [(0.0, 1e-12), (1e-12, 0.0)])
def test_fednew_with_a_vanishing_regulariser_descends_instead_of_exploding(rho, alpha):
    """FedNew on Adult with ρ = 0, α = 10⁻¹² (or ρ = 10⁻¹², α = 0): each client's system Hᵢ + (α + ρ)I
    is regular in float64 but 10⁻¹³-conditioned; solved as it stood it took the training loss from
    0.69 to 5.8·10⁴ in one round and to 2·10¹² in two, and the run ended "finished". Now the
    directions below float32's precision are left out (counted in ``info["newton_dropped"]``) and
    every round descends."""
    from fairfl.runs.loop import simulate
    h = simulate(ADULT.replace(algorithm={"name": "fednew", "rho": rho, "alpha": alpha}, rounds=3), progress=False)
    losses = h.train_losses()
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert min(h.info["newton_dropped"]) > 0 and max(h.info["y_norm"]) < 10


@pytest.mark.parametrize("algorithm", [{"name": "fednl", "opt": 2}, {"name": "fednew", "rho": 0.0, "alpha": 1e-30}])
def test_a_singular_newton_system_gives_the_newton_step_in_the_loss_directions(algorithm):
    """FedNL's Option 2 at round 0 solves (H + 0·I) d = g with Hᵢ⁰ the exact Hessian, and FedNew with
    ρ = 0 and a vanishing α solves (Hᵢ + αI) yᵢ = gᵢ: on Adult's softmax regression both systems are
    singular (a shift of both classes' logits changes nothing). The step is the minimum-norm one: finite,
    of the size of a Newton step, and it lowers the training loss. Broken variants caught: a raw
    torch LinAlgError at round 0 (a zero pivot), or, one rounding away, a step of norm ~10¹³ that left
    the loss at ~10³ for the rest of the run."""
    from fairfl.runs.loop import simulate
    h = simulate(ADULT.replace(algorithm=algorithm, rounds=2), progress=False)
    norm = h.info["direction_norm" if algorithm["name"] == "fednl" else "y_norm"][0]
    assert np.isfinite(norm) and norm < 100
    assert h.train_loss[1] < h.train_loss[0] and h.train_loss[2] < h.train_loss[0]

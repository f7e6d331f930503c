"""Min-norm QP of FedMGDA+ eq. (25): the fast solver against the cvxpy reference, singular and
extreme-scale Gram matrices, the ε = 0 / ε ≥ 1 semantics, MGDA's common-descent property,
feasibility on random inputs, the fall-back ladder, and input errors."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import fairfl.federated.minnorm as mn
from fairfl.base.errors import ConfigError
from fairfl.federated.minnorm import bounds, kkt_residual, min_norm_direction, min_norm_weights

# Objectives are compared relative to 1e-6, with an absolute floor of 1e-12·max diag G: when the
# optimum is 0 (zero vector, 0 in the convex hull) a relative comparison means nothing, and the
# interior-point reference stops ~1e-13 above 0.
RTOL_OBJ, ATOL_OBJ = 1e-6, 1e-12
KKT_FAST = 1e-9      # quadprog on a float64 Gram lands around 1e-11 (the ridge is 1e-10)
KKT_REF = 1e-7       # CLARABEL (tightened) lands around 1e-8


def objective(gram: np.ndarray, lam: np.ndarray) -> float:
    """λᵀGλ / max diag G."""
    return float(lam @ gram @ lam) / float(np.diag(gram).max())


def assert_same_objective(gram, lam_a, lam_b):
    fa, fb = objective(gram, lam_a), objective(gram, lam_b)
    assert abs(fa - fb) <= RTOL_OBJ * max(fa, fb) + ATOL_OBJ, (fa, fb)


def assert_feasible(lam, lo, hi):
    m = lam.shape[0]
    assert lam.dtype == np.float64 and lam.shape == lo.shape
    assert np.isfinite(lam).all()
    assert abs(lam.sum() - 1.0) <= 4 * m * np.finfo(float).eps, lam.sum()
    assert (lam >= lo).all() and (lam <= hi).all(), (lam - lo, hi - lam)


def instance(rng, m, d, kind="gauss"):
    v = rng.standard_normal((m, d))
    if kind == "common":
        # A shared component plus heterogeneous norms, as client updates are: many bounds active.
        v = (rng.standard_normal(d) + 0.5 * v) * rng.lognormal(0.0, 1.0, (m, 1))
    return v


# ----------------------------------------------------------------------------- vs reference

@pytest.mark.parametrize("m", [2, 3, 5, 10, 30, 100])
@pytest.mark.parametrize("eps", [0.01, 0.05, 0.1, 0.5, 1.0])
def test_fast_solver_matches_cvxpy(m, eps):
    rng = np.random.default_rng(1000 * m + int(100 * eps))
    for kind in ("gauss", "common"):
        v = instance(rng, m, max(2 * m, 50), kind)     # d ≥ 2m: G positive definite, λ* unique
        gram = v @ v.T
        lam0 = rng.dirichlet(np.ones(m))
        lo, hi = bounds(lam0, eps)
        fast = min_norm_weights(gram, lam0, eps)
        ref = min_norm_weights(gram, lam0, eps, solver="cvxpy")
        assert_feasible(fast, lo, hi)
        assert_feasible(ref, lo, hi)
        assert_same_objective(gram, fast, ref)
        assert kkt_residual(gram, fast, lo, hi) <= KKT_FAST
        assert kkt_residual(gram, ref, lo, hi) <= KKT_REF
        np.testing.assert_allclose(fast, ref, atol=2e-5, rtol=0)


# ----------------------------------------------------------------------------- singular G

def _both(gram, lam0=None, eps=1.0):
    m = gram.shape[0]
    lo, hi = bounds(np.full(m, 1 / m) if lam0 is None else lam0, eps)
    fast = min_norm_weights(gram, lam0, eps)
    ref = min_norm_weights(gram, lam0, eps, solver="cvxpy")
    for lam in (fast, ref):
        assert_feasible(lam, lo, hi)
    assert kkt_residual(gram, fast, lo, hi) <= KKT_FAST
    assert kkt_residual(gram, ref, lo, hi) <= KKT_REF
    assert_same_objective(gram, fast, ref)
    return fast, ref


@pytest.mark.parametrize("eps", [0.05, 1.0])
def test_duplicate_vectors(eps):
    rng = np.random.default_rng(1)
    a, b, c = rng.standard_normal((3, 20))
    v = np.stack([a, a, b, c, c, c])
    fast, _ = _both(v @ v.T, eps=eps)
    # The ridge picks, among the optimal λ, the one of least norm: copies share weight equally.
    np.testing.assert_allclose(fast[0], fast[1], atol=1e-7)
    np.testing.assert_allclose(fast[3:], fast[4], atol=1e-7)


def test_collinear_vectors_reach_zero_with_mgda():
    v0 = np.random.default_rng(2).standard_normal(7)
    v = np.stack([v0, 3 * v0, -v0])
    fast, ref = _both(v @ v.T, eps=1.0)
    for lam in (fast, ref):           # 0 is in the convex hull of {v, 3v, −v}
        assert np.linalg.norm(lam @ v) <= 1e-6 * np.linalg.norm(v0)


def test_collinear_vectors_closed_form_in_a_box():
    # Σλv = (λ1 + 3λ2 − λ3)v = (1 + 2λ2 − 2λ3)v: minimised by λ2 = lo, λ3 = hi, so λ1 = 1/3.
    v0 = np.random.default_rng(3).standard_normal(5)
    v = np.stack([v0, 3 * v0, -v0])
    fast, ref = _both(v @ v.T, eps=0.1)
    expected = np.array([1 / 3, 1 / 3 - 0.1, 1 / 3 + 0.1])
    np.testing.assert_allclose(fast, expected, atol=1e-9)
    np.testing.assert_allclose(ref, expected, atol=1e-6)


def test_zero_vector_takes_all_weight():
    rng = np.random.default_rng(4)
    v = np.vstack([rng.standard_normal((4, 10)), np.zeros((1, 10))])
    fast, ref = _both(v @ v.T, eps=1.0)
    np.testing.assert_allclose(fast, [0, 0, 0, 0, 1], atol=1e-8)
    np.testing.assert_allclose(ref, [0, 0, 0, 0, 1], atol=1e-6)
    assert objective(v @ v.T, fast) <= 1e-15


def test_all_zero_vectors_keep_lam0():
    lam0 = np.array([0.5, 0.3, 0.2])
    lam = min_norm_weights(np.zeros((3, 3)), lam0, eps=0.5)
    np.testing.assert_allclose(lam, lam0, rtol=0, atol=1e-16)


@pytest.mark.parametrize("eps", [0.01, 0.1, 1.0])
def test_fewer_dimensions_than_clients(eps):
    rng = np.random.default_rng(5)
    v = instance(rng, 10, 3, "common")              # rank 3 < m = 10
    lam0 = rng.dirichlet(np.ones(10))
    _both(v @ v.T, lam0, eps)


def test_float32_gram_needs_second_rung_but_no_fallback(recwarn):
    # Singular G pushed slightly indefinite (as float32 rounding does): the first ridge (1e-10)
    # is not enough for the Cholesky factorisation; the second rung must solve it, not cvxpy.
    rng = np.random.default_rng(6)
    v = rng.standard_normal((30, 4))
    gram = v @ v.T - 1e-8 * np.diag(v @ v.T).max() * np.eye(30)
    calls = []
    real = mn.quadprog.solve_qp

    def spy(g, *args, **kw):
        calls.append(g[0, 0] - gram[0, 0] / np.diag(gram).max())
        return real(g, *args, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mn.quadprog, "solve_qp", spy)
        lam = min_norm_weights(gram, eps=1.0)
    assert len(calls) == 2 and calls[1] > 1e-8          # the ridge went up once, and it sufficed
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
    lo, hi = bounds(np.full(30, 1 / 30), 1.0)
    assert_feasible(lam, lo, hi)
    assert kkt_residual(gram, lam, lo, hi) <= 1e-6


# ----------------------------------------------------------------------------- scales

@pytest.mark.parametrize("eps", [0.1, 1.0])
@pytest.mark.parametrize("factor", [1e-20, 1e20])
def test_extreme_scales_give_the_same_lambda(eps, factor):
    rng = np.random.default_rng(7)
    v = instance(rng, 12, 40, "common")
    gram = v @ v.T
    base = min_norm_weights(gram, eps=eps)
    np.testing.assert_allclose(min_norm_weights(gram * factor, eps=eps), base, atol=1e-6, rtol=0)
    np.testing.assert_allclose(min_norm_weights(gram * factor, eps=eps, solver="cvxpy"), base,
                               atol=1e-6, rtol=0)


@pytest.mark.parametrize("factor", [1e-180, 1e180])
def test_direction_survives_vectors_whose_gram_would_overflow(factor):
    # Squares of 1e±180 over/underflow float64; the direction must not notice.
    v = torch.as_tensor(instance(np.random.default_rng(8), 6, 30, "common"))
    d, lam = min_norm_direction(v, eps=1.0)
    d_big, lam_big = min_norm_direction(v * factor, eps=1.0)
    torch.testing.assert_close(lam_big, lam, atol=1e-9, rtol=0)
    torch.testing.assert_close(d_big / factor, d, rtol=1e-9, atol=0)


# ----------------------------------------------------------------------------- eps semantics

@pytest.mark.parametrize("uniform", [True, False])
def test_eps_zero_returns_lam0_bit_for_bit(uniform):
    rng = np.random.default_rng(9)
    v = rng.standard_normal((7, 5))
    lam0 = None if uniform else rng.dirichlet(np.full(7, 0.3))
    lam = min_norm_weights(v @ v.T, lam0, eps=0.0)
    expected = np.full(7, 1 / 7) if uniform else lam0
    assert np.array_equal(lam, expected)
    if lam0 is not None:
        assert lam is not lam0
        lam[0] = 42.0                      # a copy: the caller's λ₀ is untouched
        assert lam0[0] != 42.0


def test_eps_zero_solves_nothing(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("a QP was solved for eps = 0")
    monkeypatch.setattr(mn.quadprog, "solve_qp", boom)
    lam0 = torch.tensor([0.25, 0.75], dtype=torch.float64)
    assert np.array_equal(min_norm_weights(torch.eye(2), lam0, eps=0.0), lam0.numpy())


def test_single_client():
    assert np.array_equal(min_norm_weights(np.array([[3.0]]), eps=0.3), [1.0])
    d, lam = min_norm_direction(torch.tensor([[1.0, -2.0]]))
    assert torch.equal(lam, torch.tensor([1.0])) and torch.equal(d, torch.tensor([1.0, -2.0]))


@pytest.mark.parametrize("solver", ["quadprog", "cvxpy"])
def test_eps_at_least_one_is_plain_mgda(solver):
    rng = np.random.default_rng(10)
    v = instance(rng, 8, 20, "common")
    gram = v @ v.T
    lam0 = rng.dirichlet(np.ones(8))
    mgda = min_norm_weights(gram, eps=1.0, solver=solver)
    for eps in (1.0, 1.5, 1e6, float("inf")):
        lo, hi = bounds(lam0, eps)
        assert np.array_equal(lo, np.zeros(8)) and np.array_equal(hi, np.ones(8))
        # the box no longer depends on λ₀: same QP, same answer
        assert np.array_equal(min_norm_weights(gram, lam0, eps, solver=solver), mgda)


def test_two_vectors_match_the_mgda_closed_form():
    rng = np.random.default_rng(11)
    pairs = [rng.standard_normal((2, 6)) for _ in range(20)]
    pairs += [np.array([[1.0, 0.0], [3.0, 0.0]]),           # λ clipped to 1
              np.array([[3.0, 0.0], [1.0, 0.1]]),           # λ clipped to 0
              np.array([[1.0, 0.0], [0.0, 1.0]])]           # λ = 1/2
    for v1, v2 in pairs:
        closed = np.clip((v2 - v1) @ v2 / np.sum((v1 - v2) ** 2), 0.0, 1.0)
        lam = min_norm_weights(np.stack([v1, v2]) @ np.stack([v1, v2]).T, eps=1.0)
        np.testing.assert_allclose(lam, [closed, 1 - closed], atol=1e-8)


@pytest.mark.parametrize("kind", ["gauss", "common"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_mgda_direction_is_a_common_descent_direction(kind, dtype):
    rng = np.random.default_rng(12)
    for m, d in [(2, 5), (5, 50), (20, 10), (40, 200)]:
        v = torch.as_tensor(instance(rng, m, d, kind), dtype=dtype)
        direction, lam = min_norm_direction(v, eps=1.0)
        assert direction.dtype == dtype and lam.dtype == dtype and direction.shape == (d,)
        v64, d64 = v.double(), direction.double()
        tol = (1e-6 if dtype == torch.float32 else 1e-10) * float((v64 ** 2).sum(1).max())
        # MGDA optimality: d·vᵢ ≥ ‖d‖² for every client (equality where λᵢ > 0)
        assert (v64 @ d64 >= d64 @ d64 - tol).all(), (v64 @ d64 - d64 @ d64)
        torch.testing.assert_close(d64, lam.double() @ v64, rtol=1e-5, atol=1e-6 * float(v64.abs().max()))


def test_common_descent_fails_inside_a_small_box():
    # The property is MGDA's: with a small ε some client can be ascended (checks the check).
    v = torch.tensor([[1.0, 0.0], [-0.9, 0.1]], dtype=torch.float64)
    d, _ = min_norm_direction(v, eps=0.01)
    assert (v @ d < d @ d).any()


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("eps", [1e-35, 1e-14, 1e-13, 1e-12, 1e-11])
def test_tiny_eps_is_answered_without_falling_back(eps):
    # A feasible set thinner than quadprog's tolerance is "inconsistent" to quadprog.
    rng = np.random.default_rng(17)
    for _ in range(30):
        m = int(rng.integers(2, 12))
        v = rng.standard_normal((m, 4))
        lam0 = rng.dirichlet(np.full(m, 0.5))
        lam = min_norm_weights(v @ v.T, lam0, eps)
        lo, hi = bounds(lam0, eps)
        assert_feasible(lam, lo, hi)
        assert kkt_residual(v @ v.T, lam, lo, hi) <= KKT_FAST
        np.testing.assert_allclose(lam, lam0, rtol=0, atol=2 * eps + 1e-15)


# ----------------------------------------------------------------------------- kkt_residual

def test_kkt_residual_detects_non_optimal_points_at_every_scale():
    rng = np.random.default_rng(13)
    v = instance(rng, 6, 20, "common")
    gram = v @ v.T
    lo, hi = bounds(np.full(6, 1 / 6), 0.1)
    lam = min_norm_weights(gram, eps=0.1)
    other = np.full(6, 1 / 6)
    for factor in (1e-20, 1.0, 1e20):
        assert kkt_residual(gram * factor, lam, lo, hi) <= KKT_FAST
        assert kkt_residual(gram * factor, other, lo, hi) > 1e-3
    assert kkt_residual(gram, lam + 1e-3, lo, hi) >= 6e-3 - 1e-12      # sum off by 6e-3
    assert kkt_residual(gram, np.full(6, np.nan), lo, hi) == np.inf


# ----------------------------------------------------------------------------- feasibility

@st.composite
def problems(draw):
    m = draw(st.integers(1, 8))
    d = draw(st.integers(1, 6))
    exponent = draw(st.integers(-30, 30))
    entries = draw(st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=m * d, max_size=m * d))
    v = np.array(entries).reshape(m, d) * 10.0 ** exponent
    if draw(st.booleans()):                       # duplicate one row: singular G
        v[-1] = v[0]
    weights = np.array(draw(st.lists(st.sampled_from([0.0, 0.1, 1.0, 3.0, 7.5]),
                                     min_size=m, max_size=m)))
    if weights.sum() == 0:
        weights[0] = 1.0
    lam0 = weights / weights.sum()
    eps = draw(st.sampled_from([0.0, 1e-12, 1e-6, 0.01, 0.1, 1.0, 7.0]) | st.floats(0.0, 2.0))
    return v, lam0, eps


# A RuntimeWarning here is quadprog falling back to cvxpy: the fast path must handle these itself.
@pytest.mark.filterwarnings("error::RuntimeWarning")
@given(problems())
def test_weights_are_feasible_on_random_inputs(problem):
    v, lam0, eps = problem
    gram = v @ v.T
    lam = min_norm_weights(gram, lam0, eps)
    lo, hi = bounds(lam0, eps)
    if eps == 0:
        assert np.array_equal(lam, lam0)
        return
    assert_feasible(lam, lo, hi)
    assert kkt_residual(gram, lam, lo, hi) <= KKT_FAST


@pytest.mark.filterwarnings("error::RuntimeWarning")
@given(problems())
def test_direction_is_finite_and_uses_feasible_weights(problem):
    v, lam0, eps = problem
    d, lam = min_norm_direction(torch.as_tensor(v, dtype=torch.float32), lam0, eps)
    assert d.dtype == torch.float32 and lam.dtype == torch.float32
    assert torch.isfinite(d).all() and torch.isfinite(lam).all()
    lo, hi = bounds(lam0, eps)
    lam64 = lam.double().numpy()
    assert abs(lam64.sum() - 1) <= 1e-6
    assert (lam64 >= lo - 1e-7).all() and (lam64 <= hi + 1e-7).all()


# ----------------------------------------------------------------------------- fall-backs

def test_quadprog_failure_falls_back_to_cvxpy_with_a_warning(monkeypatch):
    def inconsistent(*args, **kwargs):
        raise ValueError("constraints are inconsistent, no solution")
    monkeypatch.setattr(mn.quadprog, "solve_qp", inconsistent)
    v = instance(np.random.default_rng(14), 5, 10, "common")
    with pytest.warns(RuntimeWarning, match="constraints are inconsistent.*cvxpy"):
        lam = min_norm_weights(v @ v.T, eps=0.2)
    monkeypatch.undo()
    assert_same_objective(v @ v.T, lam, min_norm_weights(v @ v.T, eps=0.2))


@pytest.mark.parametrize("garbage", [np.nan, 0.0, 0.2])
def test_quadprog_garbage_is_not_returned(monkeypatch, garbage):
    # NaN, an infeasible point and a feasible but non-optimal point are all caught.
    def wrong(g, a, c, b, meq):
        return np.full(g.shape[0], garbage), 0.0
    monkeypatch.setattr(mn.quadprog, "solve_qp", wrong)
    v = instance(np.random.default_rng(15), 5, 10, "common")
    with pytest.warns(RuntimeWarning, match="quadprog failed"):
        lam = min_norm_weights(v @ v.T, eps=1.0)
    lo, hi = bounds(np.full(5, 0.2), 1.0)
    assert kkt_residual(v @ v.T, lam, lo, hi) <= KKT_REF


def test_every_solver_failing_raises(monkeypatch):
    def inconsistent(*args, **kwargs):
        raise ValueError("constraints are inconsistent, no solution")
    monkeypatch.setattr(mn.quadprog, "solve_qp", inconsistent)
    monkeypatch.setattr(mn, "_CLARABEL_OPTS", {"max_iter": 1})
    monkeypatch.setattr(mn, "_OSQP_OPTS", {"max_iter": 1, "polishing": False})
    v = instance(np.random.default_rng(16), 6, 10, "common")
    with pytest.warns(RuntimeWarning), pytest.raises(mn.MinNormSolverError, match="no solver"):
        min_norm_weights(v @ v.T, eps=1.0)


# ----------------------------------------------------------------------------- bad input

GOOD = np.eye(3)


@pytest.mark.parametrize("kwargs, message", [
    (dict(eps=-0.1), r"eps must be in \[0, inf\)"),
    (dict(eps=float("nan")), r"eps must be in \[0, inf\)"),
    (dict(eps="big"), r"eps must be a number"),
    (dict(gram=np.array([[1.0, np.nan, 0], [np.nan, 1, 0], [0, 0, 1]])), "NaN or Inf"),
    (dict(gram=np.diag([1.0, np.inf, 1.0])), "NaN or Inf"),
    (dict(gram=np.ones((3, 2))), r"square .* shape \(3, 2\)"),
    (dict(gram=np.ones(3)), "square"),
    (dict(gram=np.zeros((0, 0))), "empty"),
    (dict(gram=np.array([[1.0, 0.5, 0], [0.0, 1, 0], [0, 0, 1]])), "not symmetric"),
    (dict(gram=-np.eye(3)), "not positive semi-definite"),
    (dict(gram=np.array([[1.0, 0.9, -0.9], [0.9, 1, 0.9], [-0.9, 0.9, 1]])),
     "not positive semi-definite"),
    (dict(lam0=np.array([0.5, 0.5])), r"lam0 must have length m = 3"),
    (dict(lam0=np.array([1.2, -0.1, -0.1])), "non-negative"),
    (dict(lam0=np.array([0.5, 0.5, 0.5])), "sum to 1"),
    (dict(lam0=np.array([0.5, np.nan, 0.5])), "NaN"),
    (dict(solver="gurobi"), r"unknown min-norm solver 'gurobi'"),
])
def test_bad_inputs_raise_config_error(kwargs, message):
    args = dict(gram=GOOD, lam0=None, eps=0.5, solver="quadprog") | kwargs
    with pytest.raises(ConfigError, match=message):
        min_norm_weights(**args)


def test_bad_vectors_raise_config_error():
    with pytest.raises(ConfigError, match=r"\(m, d\)"):
        min_norm_direction(torch.ones(3))
    with pytest.raises(ConfigError, match="NaN or Inf"):
        min_norm_direction(torch.tensor([[1.0, float("nan")], [0.0, 1.0]]))
    with pytest.raises(ConfigError, match="lam0 must have length"):
        min_norm_direction(torch.ones(2, 3), lam0=[1.0])

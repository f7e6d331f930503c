"""DQN-Fed (Mohajer Hamidi, TMLR): a distributed quasi-Newton method for fair federated
learning. Both halves are here: the clients' BFGS rates (§4.3, Algorithm 1, eqs. (18)–(19)) and
the server's scaled Gram–Schmidt, closed-form weights and Newton-like step (§4.2, eqs. (7)–(17)).

Client side
-----------
Each sampled client k builds a BFGS estimate of its inverse Hessian from curvature pairs and
sends the server its update gₖ together with d̃ₖ = gₖᵀ B gₖ (eq. 18), the rate of decrease of fₖ
that a Newton step would achieve.

Choices the paper leaves open, and ours:

* **Which matrix.** Eq. (19) as printed, B ← B − BssᵀB/(sᵀBs) + yyᵀ/(sᵀy), is the BFGS update of
  a *Hessian* estimate (it makes B s = y), while the text says B ≈ H⁻¹ and eq. (6) needs the
  inverse. We use the inverse of the eq. (19) matrix — the BFGS *inverse*-Hessian estimate,
  which satisfies B y = s — so d̃ₖ approximates gᵀH⁻¹g as eq. (6) intends. The tests check
  our product against the dense inverse of the eq. (19) matrix.
* **Never a d×d matrix.** B is applied by the L-BFGS two-loop recursion over the pairs kept
  (O(pairs·d) memory), with the usual initial scaling B₀ = γI, γ = sᵀy / yᵀy of the newest
  pair (B₀ = I when there is no usable pair, e.g. in round 0).
* **What "local gradient" the client sends.** We send the update gₖ = θᵗ − θₖ after E local
  epochs (the pseudo-gradient of every other algorithm here; Appendix B.2 speaks of
  "pseudo-gradients after E local epochs"). With E = 1 and full batch (Appendix G.1) it is
  η_l ∇fₖ(θᵗ), so the server step changes fₖ at the rate ∇fₖ·Δθ = η_l ∇fₖᵀBₖ∇fₖ: a Newton
  decrement damped by the local learning rate. Sending the raw gradient instead (the letter of
  Algorithm 1) makes the step undamped; on the notebook-04 setting it diverged at once
  (round 0, where B = I: averaged training loss 1.11 → 4.05, measured).
* **The pairs.** Algorithm 1 sets θ̂⁰ = θᵗ⁻¹ (the previous global model) and θ̂¹ = θᵗ and, for
  e = 1…E, sᵉ = θ̂ᵉ − θ̂ᵉ⁻¹, yᵉ = ∇f(θ̂ᵉ) − ∇f(θ̂ᵉ⁻¹); θ̂ᵉ⁺¹ is θ̂ᵉ after one local epoch. So with
  E = 1 the one pair comes from the last two global models. y uses full-batch gradients on the
  client's training data, in training mode (a model with dropout would make them noisy; the
  papers' MLP has none). B starts afresh every round (the paper does not carry it across
  rounds, and a client may not have taken part in the previous ones).
* **Bad curvature.** A pair with sᵀy ≤ 1e-10·‖s‖‖y‖ would make B indefinite: it is skipped
  and counted (``extras["bfgs_skipped"]``, logged per round by the aggregator).
* **Curvature below rounding.** s and y are differences of float32 points and gradients, so sᵀy
  carries an error up to about ε(‖θ‖‖y‖ + ‖s‖‖∇f‖) (ε: float32's epsilon). A pair whose sᵀy does not
  exceed that bound by :data:`ROUNDING_MARGIN` measures rounding, not curvature (a client that has
  converged takes a step of a few ulps), and its sign would flip with the last bits of the kernels
  (it did, between an AMD and an Intel machine): it is skipped and counted the same way, and left
  out of L̂ₖ below. See :func:`usable_pair`.

Server side
-----------
The clients send gradients gₖ and d̃ₖ = gₖᵀBₖgₖ (the client half below). Then:

* eqs. (7)–(8): g̃₁ = g₁/d₁ and g̃ₖ = rₖ / cₖ, where rₖ = gₖ − Σᵢ<ₖ proj_g̃ᵢ(gₖ) is the Gram–Schmidt
  residual and cₖ = dₖ − Σᵢ<ₖ (gₖ·g̃ᵢ)/(g̃ᵢ·g̃ᵢ);
* eq. (12): λ*ₖ = (1/‖g̃ₖ‖²) / Σⱼ 1/‖g̃ⱼ‖² — the min-norm point of the hull of orthogonal vectors;
* eq. (17): θ ← θ − ηₜ 𝔡 with 𝔡 = Σ λ*ₖ g̃ₖ and ηₜ = Σ 1/‖g̃ₖ‖².

Theorem 4.1: gₖ·𝔡 = dₖ / Σ 1/‖g̃ⱼ‖², i.e. gₖ·(ηₜ𝔡) = dₖ for every participant.

**How we compute it without dividing by ~0.** Since ηₜλ*ₖ = 1/‖g̃ₖ‖², the step is
ηₜ𝔡 = Σₖ g̃ₖ/‖g̃ₖ‖² = Σₖ cₖ rₖ/‖rₖ‖², and (gₖ·g̃ᵢ)/(g̃ᵢ·g̃ᵢ) = cᵢ (gₖ·rᵢ)/‖rᵢ‖². So everything is
written with the residuals rᵢ and the scalars cᵢ: a cₖ near 0 (g̃ₖ would be huge) just makes
client k's term vanish, and the only division is by ‖rₖ‖². A client whose gradient lies in
the span of the earlier ones (‖rₖ‖ ≤ ``dependence_tol``·‖gₖ‖, including gₖ = 0) is left out of
the orthogonal set — its term would be unbounded — and counted in ``info["dependent"]``;
Theorem 4.1 then holds for the others. Orthogonalisation order: the order the clients were
sampled in (ascending id); the paper does not fix one. Modified Gram–Schmidt, in float64.

With ``step="eq17"`` the rule returns the whole step ηₜ𝔡 as its direction and the server step is 1.

**Two readings of the step** (``step=``). Eq. (17) sets the global learning rate to
ηₜ = Σ 1/‖g̃ₖ‖² (``"eq17"``, the default, with ``server_lr = 1``). Algorithm 1 instead takes a
global rate ηᵗ as an input and steps θ ← θ − ηᵗ𝔡, and Theorems 4.3–4.5 assume ηᵗ ≤ 1/(2L)
(``"algorithm1"``: the direction is 𝔡 itself and the options ``server_lr`` / ``decay`` set ηᵗ). They differ
near a Pareto-stationary point: for any convex weights λ, ‖ηₜ𝔡‖ ≥ (Σλₖdₖ)/‖Σλₖgₖ‖, so as the
min-norm point of the gradients' hull shrinks the eq. (17) step grows without bound (the dₖ
do not vanish), while ‖𝔡‖ = 1/‖ηₜ𝔡‖ shrinks. Theorem 4.2 guarantees descent only while
ηₜ ≤ (2/L)·minₖ dₖ, which nothing enforces; notebook 04 measures what this does.

**The safeguard Theorem 4.2 implies** (``step="eq17_safeguarded"``, a declared variant, not the
paper's algorithm). The proof (App. A, eqs. (30)–(35)) needs, for every participant k and the step
Δ = ηₜ𝔡, the descent-lemma condition ∇fₖ·Δ ≥ (L/2)‖Δ‖². Eq. (17) gives ‖Δ‖² = ηₜ and, by
Theorem 4.1, gₖ·Δ = d̃ₖ. Our gₖ is a pseudo-gradient, not ∇fₖ(θᵗ): each client also sends
σₖ = gₖ·∇fₖ/‖∇fₖ‖², the length of its update in units of its gradient (exactly ηₗ for one full-batch
step, as in Appendix G.1), so that ∇fₖ·Δ ≈ d̃ₖ/σₖ; and L̂ₖ = maxₑ ‖yₑ‖/‖sₑ‖ over its BFGS pairs,
a lower bound of its smoothness constant along the pairs. The server scales the eq. (17) step by
min(1, 2·minₖ(d̃ₖ/σₖ) / (L̂·ηₜ)), L̂ = maxₖ L̂ₖ: eq. (17) where Theorem 4.2's condition holds, the
largest step that satisfies it otherwise. Before the first pair (round 0) there is no estimate of L and
the step is eq. (17)'s. A later round in which no client resolves a pair above rounding (near a
stationary point the steps, and so sₑ, become tiny) keeps the last round's L̂: L is one constant of
the objective, and leaving the step unguarded in exactly the rounds where eq. (17)'s ηₜ is largest
is what made the safeguard diverge (Fashion-MNIST, seed 1: a factor of 0.004 in round 190, none in
round 192 where all three pairs fell below rounding, training loss 0.33 → 399 in round 194). L̂
underestimates L, so the safeguard is a necessary condition, not a guarantee.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np
import torch

from fairfl.base.errors import ConfigError
from ..messages import Aggregate, ClientUpdates
from ..schedules import Transformation, constant, scale_by_schedule
from .base import Algorithm, Context, ParamLayout, RoundPlan, ServerStep, option, register

CURVATURE_TOL = 1e-10
# float32's epsilon: the points and gradients a pair is made of are float32 (fairfl trains in float32)
ROUNDING = float(torch.finfo(torch.float32).eps)
# How far above the rounding bound sᵀy must stand. The pairs of the DQN-Fed cases of
# tests/test_golden.py stand 7·10³ to 5·10⁶ above it; the one pair whose decision flipped between
# machines, 10⁻⁶ (a converged client's step of a few ulps). 2⁸ keeps a decision from flipping under
# the spread of float32 reductions between kernels (tens of ε relative), with room to spare.
ROUNDING_MARGIN = 2.0 ** 8


def rounding_bound(s: torch.Tensor, y: torch.Tensor, point_scale: float, grad_scale: float) -> float:
    """The largest |δ(sᵀy)| that rounding the float32 inputs of a pair can cause, to first order:
    ‖δs‖ ≤ ε·‖θ‖ and ‖δy‖ ≤ ε·‖∇f‖ give |δ(sᵀy)| ≤ ε(‖θ‖‖y‖ + ‖s‖‖∇f‖). ``point_scale`` and
    ``grad_scale``: the larger norm of the two points and of the two gradients."""
    return ROUNDING * (point_scale * float(y.norm()) + float(s.norm()) * grad_scale)


def usable_pair(s: torch.Tensor, y: torch.Tensor, point_scale: float = 0.0, grad_scale: float = 0.0) -> bool:
    """The BFGS curvature condition sᵀy > 0, with a relative tolerance, and measured above
    rounding: sᵀy > ``ROUNDING_MARGIN`` × :func:`rounding_bound` (what the pair's float32 points
    and gradients may be off by; zero scales: exact inputs, the condition alone)."""
    sy = float(s @ y)
    return sy > CURVATURE_TOL * float(s.norm()) * float(y.norm()) and \
        sy > ROUNDING_MARGIN * rounding_bound(s, y, point_scale, grad_scale)


def curvature_pair(point_a: torch.Tensor, point_b: torch.Tensor, grad_a: torch.Tensor,
                   grad_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool, bool]:
    """The BFGS pair from θ_a to θ_b: s = θ_b − θ_a (computed in the points' float32, then
    float64), y = ∇f(θ_b) − ∇f(θ_a) (float64); whether it is usable (:func:`usable_pair`) and
    whether it is resolved at all (s and y each ``ROUNDING_MARGIN`` times above the rounding of
    the points and gradients they are differences of: only then does ‖y‖/‖s‖ say anything about
    the curvature)."""
    s = (point_b - point_a).double()
    y = grad_b.double() - grad_a.double()
    point_scale = max(float(point_a.norm()), float(point_b.norm()))
    grad_scale = max(float(grad_a.norm()), float(grad_b.norm()))
    resolved = float(s.norm()) > ROUNDING_MARGIN * ROUNDING * point_scale and \
        float(y.norm()) > ROUNDING_MARGIN * ROUNDING * grad_scale
    return s, y, usable_pair(s, y, point_scale, grad_scale), resolved


def inverse_hessian_product(v: torch.Tensor, pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """B v for the BFGS inverse-Hessian estimate built from ``pairs`` (oldest first), by the
    two-loop recursion (Nocedal & Wright, Algorithm 7.4) — never forming B. Every pair must
    satisfy the curvature condition (see :func:`usable_pair`)."""
    q = v.clone()
    alphas = []
    rhos = [1.0 / (s @ y) for s, y in pairs]
    for (s, y), rho in zip(reversed(pairs), reversed(rhos)):
        a = rho * (s @ q)
        q -= a * y
        alphas.append(a)
    if pairs:
        s, y = pairs[-1]
        q *= (s @ y) / (y @ y)              # B₀ = γ I, γ = sᵀy / yᵀy
    for (s, y), rho, a in zip(pairs, rhos, reversed(alphas)):
        b = rho * (y @ q)
        q += (a - b) * s
    return q


def client_updates(clients, plan: RoundPlan, ctx: Context) -> ClientUpdates:
    """Algorithm 1's client loop for every sampled client: E local epochs of the configured SGD,
    the update gₖ = θᵗ − θₖ, and ``extras["dqn_d"]`` = d̃ₖ = gₖᵀBₖgₖ (eq. 18), with Bₖ from the
    pairs of the points θᵗ⁻¹, θᵗ, θ̂², …, θ̂ᴱ; ``extras["bfgs_skipped"]`` counts the pairs dropped
    for bad curvature. ``clients`` is the loop's :class:`~fairfl.training.client.ClientRuntime`; θᵗ⁻¹ comes
    with the plan (``plan.extras["previous"]``, None in round 0).

    ``clients.cache`` (kept by the loop between rounds, never checkpointed) saves recomputing
    ∇fₖ(θᵗ⁻¹): when the same clients took part in the previous round, their gradients at θᵗ⁻¹
    were computed then, in the same batched pass, so reusing them gives the same bits (and a
    resumed run, whose cache starts empty, recomputes the same values)."""
    ids = plan.clients
    global_flat, previous_flat, cfg, round_ = ctx.params, plan.extras.get("previous"), plan.local, ctx.round
    m = len(ids)
    grads = clients.gradients(global_flat, ids).double()
    cache = clients.cache
    same_clients = cache.get("round") == round_ - 1 and cache.get("clients") == [int(k) for k in ids]
    previous_grads = cache["grads"] if same_clients else None
    cache.update(round=round_, clients=[int(k) for k in ids], grads=grads)
    pairs: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(m)]
    skipped = torch.zeros(m)
    curvature = torch.zeros(m, dtype=torch.float64)   # L̂ₖ = max ‖y‖/‖s‖ over the pairs resolved above rounding

    def add_pair(r: int, point_a: torch.Tensor, point_b: torch.Tensor, grad_a: torch.Tensor, grad_b: torch.Tensor) -> None:
        s, y, usable, resolved = curvature_pair(point_a, point_b, grad_a, grad_b)
        if resolved and s.norm() > 0:
            curvature[r] = max(curvature[r], y.norm() / s.norm())
        if usable:
            pairs[r].append((s, y))
        else:
            skipped[r] += 1

    if previous_flat is not None:              # θ̂⁰ = θᵗ⁻¹
        prev = previous_grads if previous_grads is not None else clients.gradients(previous_flat, ids).double()
        for r in range(m):
            add_pair(r, previous_flat, global_flat, prev[r], grads[r])
    if cfg.epochs == 1:                        # all clients start from θᵗ: one batched call
        updates = clients.train(ids, global_flat, cfg).updates
    else:                                      # θ̂ᵉ⁺¹ per client, with a pair after every epoch but the last
        updates = torch.empty(m, global_flat.numel())
        one_epoch = replace(cfg, epochs=1)
        for r, k in enumerate(ids):
            point, g_point = global_flat, grads[r]
            for e in range(cfg.epochs):
                # a distinct, deterministic batch order for every local epoch of every round
                step = clients.train([k], point, one_epoch, batch_round=round_ * 1000 + e).updates[0]
                new = point - step
                if e < cfg.epochs - 1:
                    g_new = clients.gradients(new, [k])[0].double()
                    add_pair(r, point, new, g_point, g_new)
                    g_point = g_new
                point = new
            updates[r] = global_flat - point
    u = updates.double()
    d = torch.stack([u[r] @ inverse_hessian_product(u[r], pairs[r]) for r in range(m)])
    before = clients.losses(global_flat, ids) if plan.loss_before else None
    g2 = (grads * grads).sum(dim=1)
    scale = torch.where(g2 > 0, (u * grads).sum(dim=1) / g2.clamp_min(torch.finfo(g2.dtype).tiny), torch.zeros_like(g2))
    return ClientUpdates(np.asarray(ids), updates, clients.num_samples(ids), before, None,
                         {"dqn_d": d, "bfgs_skipped": skipped, "dqn_curvature": curvature, "dqn_scale": scale})


def theorem_4_2_scale(eta: float, d: torch.Tensor, scale: torch.Tensor, curvature: torch.Tensor) -> float:
    """The factor in (0, 1] that makes the eq. (17) step Δ (‖Δ‖² = ηₜ) satisfy Theorem 4.2's
    condition ∇fₖ·Δ ≥ (L̂/2)‖Δ‖² for every participant, with ∇fₖ·Δ ≈ d̃ₖ/σₖ (module docstring).
    1 when the condition holds, when there is no curvature estimate or no step; a participant
    whose update does not point along its gradient (σₖ ≤ 0) or whose rate is not positive cannot
    be made to descend by scaling: the step is then 0."""
    L = float(curvature.max()) if len(curvature) else 0.0
    if not (eta > 0 and L > 0):
        return 1.0
    d, scale = d.double(), scale.double()
    if bool((scale <= 0).any() or (d <= 0).any()):
        return 0.0
    return min(1.0, 2.0 * float((d / scale).min()) / (L * eta))


# ----------------------------------------------------------------------------- server side

def dqnfed_step(g: torch.Tensor, d: torch.Tensor, dependence_tol: float = 1e-6):
    """(step ηₜ𝔡, λ* (zeros for dependent clients), ηₜ, kept mask) for gradients g (m, n) and
    rates d (m,). float64 throughout."""
    g, d = g.double(), d.double()
    m = len(g)
    residuals: list[torch.Tensor] = []
    norms2: list[torch.Tensor] = []
    cs: list[torch.Tensor] = []
    kept = torch.zeros(m, dtype=torch.bool)
    rows = []
    for k in range(m):
        r, c = g[k].clone(), d[k].clone()
        for ri, ni2, ci in zip(residuals, norms2, cs):
            coef = (r @ ri) / ni2              # modified Gram–Schmidt: equals gₖ·rᵢ/‖rᵢ‖² exactly in theory
            r -= coef * ri
            c -= ci * coef                     # eq. (8)'s denominator, written with rᵢ and cᵢ
        n2 = r @ r
        if not n2 > (dependence_tol ** 2) * (g[k] @ g[k]) or not n2 > 0:
            continue
        residuals.append(r), norms2.append(n2), cs.append(c)
        kept[k] = True
        rows.append(k)
    step = torch.zeros(g.shape[1], dtype=torch.float64)
    inv = torch.zeros(m, dtype=torch.float64)  # 1/‖g̃ₖ‖² = cₖ²/‖rₖ‖²
    for k, r, n2, c in zip(rows, residuals, norms2, cs):
        step += (c / n2) * r
        inv[k] = c * c / n2
    eta = inv.sum()
    lam = inv / eta if eta > 0 else inv
    return step, lam, float(eta), kept


@dataclass
class DQNFedState:
    previous: torch.Tensor | None      # θᵗ⁻¹, sent to the clients for their first BFGS pair
    curvature: float = 0.0             # the safeguard's last L̂ (0: none yet), kept through a round without one


STEPS = ("eq17", "algorithm1", "eq17_safeguarded")


@register
@dataclass(frozen=True)
class DQNFed(ServerStep, Algorithm):
    """DQN-Fed. ``step="eq17"`` (default): eq. (17)'s rate ηₜ = Σ 1/‖g̃ₖ‖², the rule's direction is
    the whole step; ``"algorithm1"``: the direction 𝔡 with a global rate ηᵗ = ``server_lr`` and
    FedMGDA+'s ``decay`` (the :class:`ServerStep` options: only this reading reads them);
    ``"eq17_safeguarded"``: eq. (17)'s step scaled down where Theorem 4.2's condition fails (a
    declared variant; see the module docstring)."""

    name = "dqnfed"
    State = DQNFedState
    dependence_tol: float = option(1e-6, low=0.0, high=1.0, low_open=True, high_open=True)
    step: str = option("eq17", choices=STEPS)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.step != "algorithm1" and (self.server_lr != 1.0 or self.decay != 1.0):
            raise ConfigError("dqnfed: server_lr and decay set the global rate of step='algorithm1'; "
                              f"eq. (17) fixes the rate itself (got server_lr={self.server_lr}, decay={self.decay})")

    def revision(self) -> int:
        # 1: a curvature pair must stand ROUNDING_MARGIN above the rounding of its float32 inputs (a converged
        # client's pair of a few ulps was kept before), which changes some runs of every step after results were
        # cached. 2 (the safeguard only): it keeps the last round's L̂ through a round in which no pair is resolved
        # above rounding, where it had taken eq. (17)'s unguarded step (module docstring)
        return 2 if self.step == "eq17_safeguarded" else 1

    def init(self, params: torch.Tensor, num_clients: int, layout: ParamLayout | None = None) -> DQNFedState:
        return DQNFedState(None)

    def configure(self, ctx: Context, state: DQNFedState) -> RoundPlan:
        return replace(super().configure(ctx, state), extras={"previous": state.previous})

    def client_update(self, ctx: Context, plan: RoundPlan, clients) -> ClientUpdates:
        return client_updates(clients, plan, ctx)

    def aggregate(self, reports: ClientUpdates, state: DQNFedState, ctx: Context) -> Aggregate:
        if "dqn_d" not in reports.extras:
            raise ValueError("DQN-Fed needs each client's d_k (eq. 18) in reports.extras['dqn_d']; "
                             "its clients compute them (DQNFed.client_update)")
        d = reports.extras["dqn_d"]
        step, lam, eta, kept = dqnfed_step(reports.updates, d, self.dependence_tol)
        info = {}
        curvature = state.curvature if state is not None else 0.0
        if self.step == "algorithm1":  # 𝔡 = Σ λ*ₖ g̃ₖ = (ηₜ𝔡)/ηₜ; no kept client: no step
            step = step / eta if eta > 0 else step
        elif self.step == "eq17_safeguarded":
            for key in ("dqn_curvature", "dqn_scale"):
                if key not in reports.extras:
                    raise ValueError(f"DQN-Fed's safeguard needs each client's {key} in reports.extras; "
                                     "its clients compute them (DQNFed.client_update)")
            measured = reports.extras["dqn_curvature"]
            if len(measured) and float(measured.max()) > 0:
                curvature = float(measured.max())
            factor = theorem_4_2_scale(eta, d, reports.extras["dqn_scale"], torch.tensor([curvature]))
            step = step * factor
            info.update(safeguard=factor, curvature=curvature)
        info.update(eta=eta, dependent=float((~kept).sum()), step_norm2=float(step @ step), min_d=float(d.min()),
                    bfgs_skipped=float(reports.extras.get("bfgs_skipped", torch.zeros(1)).sum()))
        return Aggregate(step.to(reports.updates.dtype), DQNFedState(ctx.params, curvature), info,
                         weights=lam.to(reports.updates.dtype))

    def server_optimizer(self) -> Transformation:
        if self.step == "algorithm1":
            return super().server_optimizer()
        return scale_by_schedule(constant(1.0))


def step_ratio(history) -> "np.ndarray":
    """Per round, ηₜ / minₖ d̃ₖ from a DQN-Fed run's log: Theorem 4.2 guarantees descent only while
    ηₜ ≤ (2/L)·minₖ d̃ₖ (inf where min d̃ₖ ≤ 0)."""
    eta, min_d = np.asarray(history.info["eta"]), np.asarray(history.info["min_d"])
    return np.divide(eta, min_d, out=np.full_like(eta, np.inf), where=min_d > 0)

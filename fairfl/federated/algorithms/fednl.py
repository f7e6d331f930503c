"""FedNL (Safaryan, Islamov, Qian & Richtárik, "FedNL: Making Newton-Type Methods Applicable to
Federated Learning", ICML 2022), a second-order baseline of DQN-Fed (Tables 1–6; App. H gives no
hyper-parameters for it). The authors' code is ``Rustem-Islamov/FedNL-Public`` (commit ac72ee9):
``methods.py`` (class ``FedNL``), ``utils.py`` and ``Example notebook.ipynb``.

Algorithm 1 (FedNL), round k, client i with its learned Hessian Hᵢᵏ (held by the client and,
summed, by the server):

    gᵢ = ∇fᵢ(xᵏ)                                   (the exact local gradient: no local training)
    Sᵢ = C(∇²fᵢ(xᵏ) − Hᵢᵏ),   lᵢ = ‖Hᵢᵏ − ∇²fᵢ(xᵏ)‖_F,   Hᵢᵏ⁺¹ = Hᵢᵏ + α Sᵢ
    server: ḡ = mean gᵢ;  Option 1: d = [Hᵏ]_μ⁻¹ ḡ;  Option 2: d = (Hᵏ + lᵏI)⁻¹ ḡ;  x ← x − η d;
            Hᵏ⁺¹ = Hᵏ + α mean Sᵢ

with [A]_μ the projection onto {M ⪰ μI} (eigenvalues clipped at μ; code ``utils.py:321-331``,
``pos_projection``, through ``semidef_projection``, ``:305-319``). The step uses Hᵏ, from *before*
this round's update, as the code's ``FedNL.method`` does (``methods.py:725-739`` steps, then
``:745-776`` learns). Compressors: ``"rank"`` (the R eigenpairs of largest |eigenvalue|, by ``eigh``:
symmetric by construction where the code's ``Low_Rank`` sums R terms σᵣvᵣuᵣᵀ of an SVD,
``utils.py:359-374``), ``"topk"`` (the K largest entries of the upper triangle, symmetrised, the
diagonal counted once: ``TopK``, ``utils.py:333-356``) and ``"identity"``. Defaults: the paper's and
its notebook's FedNL run (``Example notebook.ipynb``, the cell after "# FedNL": ``LowRank`` with
``hes_comp_param=1``, ``init='nonzero'``, ``option=1``, ``upd_rule=2``, i.e. α = 1,
``methods.py:752-755``) — Rank-1, α = 1, Option 1, Hᵢ⁰ = ∇²fᵢ(x⁰) (``h_init="hessian"``), η = 1;
μ = 1e-3, the notebook's L2 λ (``lmb = 1e-3``), at which the code projects (``methods.py:727``,
``pos_projection(H, lmb)``): a softmax model with no regulariser has a singular Hessian. Option 2
uses the Frobenius norm of the paper (the code's option 2 uses the spectral norm,
``methods.py:733``).

**Two readings, chosen by d** (``hessian_mode="auto"``: ``"full"`` when d ≤ ``max_full_d``, 2000 by
default, else ``"diag"``):

* ``"full"`` (Adult's logistic regression, d ≈ 200): the method above with the dense local
  Hessian (``clients.hessian``, float64), in float64 throughout;
* ``"diag"`` (networks: a d×d matrix at d = 10⁵ is 40 GB): FedNL's recursion restricted to diagonal
  matrices, held as d-vectors. ∇²fᵢ(xᵏ) is replaced by its Hutchinson estimate
  (1/s)Σᵣ zᵣ ⊙ ∇²fᵢ zᵣ, zᵣ Rademacher (``probes`` = s Hessian-vector products on the client's
  training data, by double backward, in the model's float32 unless ``products="float64"``; the probes
  come from (seed, round, client); with ``hessian_batch`` = b, on a fixed subsample of b of the client's
  samples, drawn once per run: a subsampled Hessian, Byrd et al. 2011); [D]_μ clips each
  entry at μ; lᵢ is the Euclidean norm of the vector difference; a compressor acts on the vector
  (``"rank"`` R on a diagonal matrix keeps its R largest |entries|, like ``"topk"``). The default
  compressor (``"auto"``) is Rank-1 in ``"full"`` and the identity in ``"diag"``, where learning one
  coordinate per round would take d rounds. This reading is ours: DQN-Fed does not say how it ran
  FedNL on networks, and the off-diagonal part is never learned, so FedNL's theory does not cover
  it. With a diagonal Hessian the two readings take the same steps (tested). Its defaults (``alpha``,
  ``mu`` = None) are α = 0.1 and μ = 1e-2: with one probe the estimate is noisy, and α < 1 makes
  Hᵢ an exponential average of the estimates (a grid: μ ∈ {1e-3, 1e-2, 1e-1, 1}, α ∈ {0.1, 1}).

Choices: **partial participation.** Hᵏ is the mean of the learned Hessians of the clients seen so
far (every client keeps its Hᵢ between its rounds, as FedNL-PP does); ḡ is the mean over the
round's clients. Under full participation this is Algorithm 1 exactly; it is not FedNL-PP, whose
step also keeps every client's last gradient. A client's Hᵢ⁰ is taken at its first round (at x⁰
under full participation) and sent once, in full. Sᵢ travels dense here (the simulation does not
count bytes). The clients' loss derivatives are of the training loss in eval mode (no dropout).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fairfl.base.errors import ConfigError
from ..messages import Aggregate, ClientUpdates
from .base import (PRODUCT_DTYPES, Algorithm, Context, ParamLayout, RoundPlan, ServerStep, hessian_rows,
                   newton_solve, option, register)

PROBES_STREAM = 0x4E1         # the Hutchinson probes of a round's client (purpose of ctx.rng)
ROWS_STREAM = 0x4E2           # a client's fixed Hessian subsample (hessian_batch)
MODES = ("auto", "full", "diag")
COMPRESSORS = ("auto", "rank", "topk", "identity")
INITS = ("hessian", "zero")


def project(H: torch.Tensor, mu: float) -> torch.Tensor:
    """[H]_μ: a symmetric matrix with its eigenvalues clipped below at μ, or a diagonal (a vector)
    with its entries clipped."""
    if H.ndim == 1:
        return H.clamp_min(mu)
    evals, evecs = torch.linalg.eigh((H + H.T) / 2)
    return (evecs * evals.clamp_min(mu)) @ evecs.T


def compress(M: torch.Tensor, kind: str, rank: int = 1, k: int | None = None) -> torch.Tensor:
    """C(M) for a symmetric matrix M (or a diagonal, as a vector)."""
    if kind == "identity":
        return M.clone()
    if M.ndim == 1:                                       # a diagonal: rank R ≡ its R largest |entries|
        keep = min(rank if kind == "rank" else (k or M.numel()), M.numel())
        out = torch.zeros_like(M)
        top = M.abs().topk(keep).indices
        out[top] = M[top]
        return out
    if kind == "rank":
        evals, evecs = torch.linalg.eigh((M + M.T) / 2)
        top = evals.abs().topk(min(rank, len(evals))).indices
        return (evecs[:, top] * evals[top]) @ evecs[:, top].T
    if kind == "topk":
        n = M.shape[0]
        rows, cols = torch.triu_indices(n, n)
        upper = M[rows, cols]
        top = upper.abs().topk(min(k or len(upper), len(upper))).indices
        out = torch.zeros_like(M)
        out[rows[top], cols[top]] = upper[top]
        out[cols[top], rows[top]] = upper[top]            # symmetric; a diagonal entry written once
        return out
    raise ValueError(f"unknown compressor {kind!r}")


def newton_direction(g: torch.Tensor, H: torch.Tensor, mu: float, opt: int, l: float = 0.0,
                     stats: dict | None = None) -> torch.Tensor:
    """Option 1: [H]_μ⁻¹ g; Option 2: (H + lI)⁻¹ g — for a dense H or a diagonal (a vector). Option 2's
    system is singular wherever l = 0 and H is (round 0 with Hᵢ⁰ = ∇²fᵢ(x⁰) on a softmax model): there
    the minimum-norm solution without the directions rounding decides (``base.newton_solve``, which
    counts them in ``stats["dropped"]``); Option 1's [H]_μ ⪰ μI never is. A NaN or Inf in H or g
    stops the run as diverged (``TrainingDivergedError``), naming it."""
    if opt == 1:
        if not (bool(torch.isfinite(H).all()) and bool(torch.isfinite(g).all())):
            return newton_solve(H, g)                      # refuses the system, naming what is not finite
        return g / project(H, mu) if H.ndim == 1 else torch.linalg.solve(project(H, mu), g)
    if H.ndim == 1:
        return newton_solve(H + l, g, stats)
    return newton_solve(H + l * torch.eye(len(H), dtype=H.dtype), g, stats)


def hutchinson_diagonal(clients, point: torch.Tensor, ids, probes: int, ctx: Context,
                        dtype: torch.dtype = torch.float64, rows=None) -> torch.Tensor:
    """(m, d) Hutchinson estimates (1/s)Σᵣ zᵣ ⊙ ∇²fᵢ zᵣ with Rademacher zᵣ of (seed, round, client); the
    products in ``dtype`` (on ``rows`` of each client's data where given), the estimate in float64."""
    d = point.numel()
    z = torch.stack([torch.as_tensor(ctx.rng(PROBES_STREAM, int(k)).integers(0, 2, size=(probes, d)),
                                     dtype=torch.float64) * 2 - 1 for k in ids])
    return (z * clients.hvp(point, ids, z, dtype=dtype, rows=rows).double()).mean(dim=1)


@dataclass
class FedNLState:
    H_sum: torch.Tensor      # Σ of the learned Hᵢ of the clients seen so far ((d, d), or (d,) diagonal)
    seen: torch.Tensor       # (n,) bool


@dataclass
class FedNLClient:
    H: torch.Tensor          # Hᵢᵏ: (d, d), or (d,) diagonal


@register
@dataclass(frozen=True)
class FedNL(ServerStep, Algorithm):
    """FedNL (Algorithm 1): Newton steps with Hessians learned from compressed differences."""

    name = "fednl"
    State = FedNLState
    ClientState = FedNLClient
    alpha: float | None = option(None, low=0.0, high=1.0, low_open=True,
                                 doc="Hessian learning rate α (None: 1 in full, 0.1 in diag)")
    mu: float | None = option(None, low=0.0, low_open=True, doc="projection level μ (None: 1e-3 full, 1e-2 diag)")
    opt: int = option(1, choices=(1, 2), doc="the paper's Option 1 ([H]_μ) or Option 2 (H + lI)")
    compressor: str = option("auto", choices=COMPRESSORS, doc="auto: rank (full), identity (diag)")
    rank: int = option(1, low=1, doc="R of the Rank-R compressor")
    topk: int | None = option(None, low=1, doc="K of the Top-K compressor (None: d)")
    h_init: str = option("hessian", choices=INITS, doc="Hᵢ⁰ = ∇²fᵢ at the client's first round, or 0")
    hessian_mode: str = option("auto", choices=MODES, doc="auto: full when d ≤ max_full_d, else diag")
    max_full_d: int = option(2000, low=1, doc="the largest d of the dense reading under hessian_mode='auto'")
    probes: int = option(1, low=1, doc="Hutchinson probes per client and round (diag)")
    products: str = option("float32", choices=tuple(PRODUCT_DTYPES),
                           doc="dtype of the Hessian-vector products (diag); float32 is 2.6× faster on a CPU")
    hessian_batch: int | None = option(None, low=1, doc="products on this many of a client's training samples, "
                                                        "fixed per run (diag; None: all of them)")

    def mode(self, d: int) -> str:
        if self.hessian_mode != "auto":
            return self.hessian_mode
        return "full" if d <= self.max_full_d else "diag"

    def rates(self, d: int) -> tuple[float, float]:
        """(α, μ): the options, or the reading's defaults (spec of the networks' reading: α = 0.1 and
        μ = 1e-2 average the noisy one-probe estimates and keep the step bounded)."""
        full = self.mode(d) == "full"
        return (self.alpha if self.alpha is not None else (1.0 if full else 0.1),
                self.mu if self.mu is not None else (1e-3 if full else 1e-2))

    def _compressor(self, mode: str) -> str:
        if self.compressor != "auto":
            return self.compressor
        return "rank" if mode == "full" else "identity"

    def check(self, config: Any) -> None:
        if config.attacks:
            raise ConfigError("fednl: clients send exact gradients and Hessian differences, which the attacks do "
                              "not model")

    def revision(self) -> int:
        # Option 2's solve leaves out the directions below float32's precision (base.newton_solve), where it had
        # solved near-singular systems into huge steps after results were cached: only Option 2's keys change
        return 1 if self.opt == 2 else 0

    def init(self, params: torch.Tensor, num_clients: int, layout: ParamLayout | None = None) -> FedNLState:
        d = params.numel()
        shape = (d, d) if self.mode(d) == "full" else (d,)
        return FedNLState(torch.zeros(shape, dtype=torch.float64), torch.zeros(num_clients, dtype=torch.bool))

    def client_update(self, ctx: Context, plan: RoundPlan, clients) -> ClientUpdates:
        ids, w = [int(k) for k in plan.clients], ctx.params
        mode, (alpha, _) = self.mode(w.numel()), self.rates(w.numel())
        grads = clients.gradients(w, ids).double()
        exact = (clients.hessian(w, ids) if mode == "full"
                 else hutchinson_diagonal(clients, w.double(), ids, self.probes, ctx,
                                           PRODUCT_DTYPES[self.products],
                                           hessian_rows(clients, ids, ctx, ROWS_STREAM, self.hessian_batch)))
        S, first, ls = torch.zeros_like(exact), torch.zeros_like(exact), torch.zeros(len(ids), dtype=torch.float64)
        new = torch.zeros(len(ids))
        for r, k in enumerate(ids):
            own = clients.states.get(k)
            if own is None:                                # Hᵢ⁰, sent once
                H = exact[r].clone() if self.h_init == "hessian" else torch.zeros_like(exact[r])
                first[r], new[r] = H, 1.0
            else:
                H = own.H
            diff = exact[r] - H
            ls[r] = diff.norm()                            # Frobenius (a vector: Euclidean)
            S[r] = compress(diff, self._compressor(mode), self.rank, self.topk)
            clients.states[k] = FedNLClient(H + alpha * S[r])
        return ClientUpdates(plan.clients, grads.to(w.dtype), clients.num_samples(ids),
                             clients.losses(w, ids) if plan.loss_before else None, None,
                             {"fednl_S": S, "fednl_H0": first, "fednl_new": new, "fednl_l": ls})

    def aggregate(self, reports: ClientUpdates, state: FedNLState, ctx: Context) -> Aggregate:
        if "fednl_S" not in reports.extras:
            raise ValueError("FedNL needs each client's compressed Hessian difference in reports.extras['fednl_S']; "
                             "its clients compute them (FedNL.client_update)")
        ex = reports.extras
        ids = torch.as_tensor(reports.clients, dtype=torch.long)
        new = ex["fednl_new"].bool()
        H_sum = state.H_sum + ex["fednl_H0"][new].sum(dim=0)
        seen = state.seen.clone()
        seen[ids] = True
        H = H_sum / int(seen.sum())                         # Hᵏ: before this round's learning step
        g = reports.updates.double().mean(dim=0)
        alpha, mu = self.rates(g.numel())
        stats: dict = {}
        direction = newton_direction(g, H, mu, self.opt, float(ex["fednl_l"].mean()), stats)
        H_sum = H_sum + alpha * ex["fednl_S"].sum(dim=0)
        info = {"hessian_error": float(ex["fednl_l"].mean()), "direction_norm": float(direction.norm())}
        if self.opt == 2:                # directions left out of Option 2's solve (base.newton_solve)
            info["newton_dropped"] = float(stats.get("dropped", 0))
        return Aggregate(direction.to(reports.updates.dtype), FedNLState(H_sum, seen), info)

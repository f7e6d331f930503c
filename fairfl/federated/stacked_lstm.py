"""The character LSTM (``fairfl.federated.models.CharLSTM``) as a stack of m instances: one forward and
backward pass for many clients' and runs' copies, each with its own parameters, as
``fairfl.federated.stacked`` does for the feed-forward models.

``torch.func.vmap`` cannot batch ``nn.LSTM`` (aten::lstm has no batching rule), and m copies of
``nn.LSTM`` one after another are the reference path. Here every parameter has a leading instance
axis — embedding (m, V, E), per layer W_ih (m, 4H, In), W_hh (m, 4H, H), b_ih, b_hh (m, 4H), head
(m, C, H) and (m, C) — and every product is a batched one (``torch.bmm`` / ``baddbmm``: the m
instances' matrices, each multiplied on its own), with ``nn.LSTM``'s gates and equations
(PyTorch's documentation of ``nn.LSTM``; gates in the order i, f, g, o)::

    i = σ(W_ii x + b_ii + W_hi h + b_hi)      f = σ(W_if x + b_if + W_hf h + b_hf)
    g = tanh(W_ig x + b_ig + W_hg h + b_hg)   o = σ(W_io x + b_io + W_ho h + b_ho)
    c' = f ⊙ c + i ⊙ g                        h' = o ⊙ tanh(c')

from h = c = 0, and the head on the last step's h (``CharLSTM.forward``). All in the parameters'
dtype (float32). The results equal ``nn.LSTM``'s to float tolerance, not bit for bit: on a CPU
``nn.LSTM`` is oneDNN's fused cell, which adds in another order (tests/test_stacked_lstm.py).

Layout: an instance's activations are time-major, (m, T, b, F), so that step t of every instance
is one strided slice (m, b, F) and the products over all steps at once — the input projection
X·W_ihᵀ, and in the backward pass the weight gradients Σₜ dGₜᵀ·xₜ and Σₜ dGₜᵀ·hₜ₋₁ — are single
batched products with T·b rows. Only the recurrence h·W_hhᵀ, and its transpose backward, are
taken step by step.

The backward pass is written by hand (:class:`_Layer`, a ``torch.autograd.Function``): autograd's
graph of the unrolled cell holds some 20 nodes a step and takes each step's weight gradient as a
product of its own (measured at b = 10 on a shared 2-core CPU: 203 against 159 ms an instance-step
alone, 302 against 234 in a stack of 10). It takes the derivatives of the equations above: the
factors that do not depend on the incoming gradient (σ'(i)·g, σ'(f)·c₋₁, tanh'(g)·i, σ'(o)·tanh(c)
and o·tanh'(c), with the kernels autograd uses for them, ``sigmoid_backward`` and ``tanh_backward``)
for every step at once, then per step, backwards, dL/dc and the gates' gradient in four elementwise
operations and dL/dh₋₁ in one product; the biases' gradient is the sum over the T·b rows of the
gates' gradient (both bias vectors get it, as in ``nn.LSTM``).

The embedding is taken as a batched product of one-hot rows with the instance's table: exact (a
one-hot row picks its entry with products by 0 and 1), and its gradient a batched product too, whose
rounding is that of one instance's matrices whatever the stack (a gather's backward on CUDA picks
its algorithm by the number of indices, and so by the stack's size).

Every operation acts on each instance's slice alone, so an instance's bits depend on the stack's
size only through the kernels a batched product picks for it; ``fairfl.training.engine.exactness``
probes that, as for every model.
"""
from __future__ import annotations

import weakref

import torch
from torch import nn

from .models import CharLSTM

_SUPPORTS: "weakref.WeakKeyDictionary[nn.Module, bool]" = weakref.WeakKeyDictionary()


def supports(model: nn.Module) -> bool:
    """Whether :func:`forward` computes stacked copies of ``model``: a :class:`CharLSTM` (its own
    ``forward``, not a subclass's) whose embedding is a plain lookup and whose ``nn.LSTM`` is
    unidirectional, batch-first, with biases and without projections or dropout between layers,
    its parameters in the order :func:`forward` reads them. Remembered per model."""
    known = _SUPPORTS.get(model)
    if known is None:
        known = type(model) is CharLSTM and _plain(model)
        _SUPPORTS[model] = known
    return known


def _plain(model: CharLSTM) -> bool:
    embed, lstm, head = model.embed, model.lstm, model.head
    if not (type(embed) is nn.Embedding and type(lstm) is nn.LSTM and type(head) is nn.Linear):
        return False
    if (embed.padding_idx is not None or embed.max_norm is not None or embed.scale_grad_by_freq or embed.sparse
            or head.bias is None):
        return False
    if (not lstm.batch_first or lstm.bidirectional or lstm.proj_size or not lstm.bias
            or (lstm.dropout and lstm.num_layers > 1) or lstm.mode != "LSTM"):
        return False
    expected = [embed.weight] + [getattr(lstm, f"{kind}_l{k}") for k in range(lstm.num_layers)
                                 for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")] + [head.weight, head.bias]
    return [id(p) for p in model.parameters()] == [id(p) for p in expected]


def activation_floats(model: CharLSTM, length: int) -> int:
    """Floats one sample of ``length`` steps holds after a stacked forward pass with gradients: its
    one-hot rows and embedding, per layer its gates (4H a step), cells, their tanh and outputs
    (3H a step), and its logits — the measure of ``fairfl.federated.stacked``'s models (their activations),
    which ``fairfl.training.engine`` triples for the backward pass when it cuts stacks (here the gates'
    gradient, 4H a step per layer, and a layer's input gradient)."""
    lstm = model.lstm
    per_step = model.embed.num_embeddings + lstm.input_size + lstm.num_layers * 7 * lstm.hidden_size
    return length * per_step + model.head.out_features


def forward(model: nn.Module, params, x: torch.Tensor) -> torch.Tensor:
    """Logits (m, b, classes) of m stacked copies of ``model`` on token windows x (m, b, T);
    ``params``: the model's parameters in ``model.parameters()`` order, each with a leading axis
    of size m. With gradients enabled, the LSTM layers keep what their hand-written backward pass
    needs (:class:`_Layer`); without, the layers advance step by step together, holding no
    sequence (a loss over 512 samples of many instances at once)."""
    m, b, steps = x.shape
    lstm = model.lstm
    layers = lstm.num_layers
    table, head_w, head_b = params[0], params[-2], params[-1]
    weights = [params[1 + 4 * k: 5 + 4 * k] for k in range(layers)]
    vocab = table.shape[1]
    if x.device.type == "cpu" and x.numel() and not 0 <= int(x.min()) <= int(x.max()) < vocab:
        raise IndexError(f"token indices must lie in [0, {vocab}), got [{int(x.min())}, {int(x.max())}]")
    # time-major one-hot rows (m, T·b, V): the embedding as a batched product, exact. Built by a
    # comparison (F.one_hot checks its input's range on the device, a synchronisation that a CUDA
    # graph cannot capture)
    tokens = x.transpose(1, 2).reshape(m, steps * b, 1)
    hot = (tokens == torch.arange(vocab, device=x.device)).to(table.dtype)
    h = torch.bmm(hot, table)                                                    # (m, T·b, E)
    if torch.is_grad_enabled() and any(p.requires_grad for p in params):
        for k, (w_ih, w_hh, b_ih, b_hh) in enumerate(weights):
            h = _Layer.apply(h.reshape(m, steps, b, -1), w_ih, w_hh, b_ih, b_hh, k == layers - 1)
        last = h
    else:
        last = _infer(h.reshape(m, steps, b, -1), weights)
    return torch.baddbmm(head_b.unsqueeze(1), last, head_w.transpose(1, 2))


def _cell(gates: torch.Tensor, c_prev: torch.Tensor | None, c_out: torch.Tensor, tanh_out: torch.Tensor,
          h_out: torch.Tensor) -> None:
    """One step of the cell on pre-activations ``gates`` (m, b, 4H), in place: the gates' activations
    replace them (σ on i, f, o; tanh on g); c' = f·c + i·g into ``c_out``, tanh(c') into ``tanh_out``,
    h' = o·tanh(c') into ``h_out``. ``c_prev`` None: c = 0."""
    m, b, four = gates.shape
    i, f, g, o = _activate(gates.view(m, b, 4, four // 4))
    if c_prev is None:
        torch.mul(i, g, out=c_out)
    else:
        torch.mul(f, c_prev, out=c_out)
        c_out.addcmul_(i, g)
    torch.tanh(c_out, out=tanh_out)
    torch.mul(o, tanh_out, out=h_out)


def _activate(g4: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The gates' activations in place on pre-activations (..., 4, H): σ on i, f and o, tanh on g;
    the four views i, f, g, o."""
    g4.narrow(-2, 0, 2).sigmoid_()
    g4.select(-2, 3).sigmoid_()
    g4.select(-2, 2).tanh_()
    return g4.unbind(-2)


def _projection(x: torch.Tensor, w_ih: torch.Tensor, b_ih: torch.Tensor, b_hh: torch.Tensor) -> torch.Tensor:
    """x·W_ihᵀ + b_ih + b_hh for every row of x (m, rows, In): (m, rows, 4H)."""
    # the product, then the biases: baddbmm would first copy the broadcast biases into every row
    return torch.bmm(x, w_ih.transpose(1, 2)).add_((b_ih + b_hh).unsqueeze(1))


_SIGMOID_BACK = torch.ops.aten.sigmoid_backward.grad_input       # grad·(1 − y)·y into grad_input
_TANH_BACK = torch.ops.aten.tanh_backward.grad_input             # grad·(1 − y²) into grad_input


class _Layer(torch.autograd.Function):
    """One stacked LSTM layer over a whole sequence: inputs (m, T, b, In) -> outputs (m, T, b, H),
    or only the last step's (m, b, H) with ``last``; its backward pass by hand (the module's
    docstring)."""

    @staticmethod
    def forward(ctx, x, w_ih, w_hh, b_ih, b_hh, last: bool):
        m, steps, b, width = x.shape
        hidden = w_hh.shape[2]
        gates = _projection(x.reshape(m, steps * b, width), w_ih, b_ih, b_hh).view(m, steps, b, 4 * hidden)
        cells, tanhs, outs = (x.new_empty(m, steps, b, hidden) for _ in range(3))
        # every step's views, made once
        g_t, c_t, tc_t, h_t = gates.unbind(1), cells.unbind(1), tanhs.unbind(1), outs.unbind(1)
        w_hh_t = w_hh.transpose(1, 2)
        for t in range(steps):
            if t:
                g_t[t].baddbmm_(h_t[t - 1], w_hh_t)                  # + h·W_hhᵀ (h = 0 at t = 0)
            _cell(g_t[t], c_t[t - 1] if t else None, c_t[t], tc_t[t], h_t[t])
        ctx.save_for_backward(x, w_ih, w_hh, gates, cells, tanhs, outs)
        ctx.last = last
        return outs[:, -1] if last else outs

    @staticmethod
    def backward(ctx, d_out):
        x, w_ih, w_hh, gates, cells, tanhs, outs = ctx.saved_tensors
        m, steps, b, width = x.shape
        hidden = w_hh.shape[2]
        a = gates.view(m, steps, b, 4, hidden)
        i, f, g, o = a.unbind(3)
        # What each gate's pre-activation gradient multiplies at a step, for every step at once (the
        # chain rule through the equations): dL/d(pre-i) = dc·g·σ'(i), dL/d(pre-f) = dc·c₋₁·σ'(f),
        # dL/d(pre-g) = dc·i·tanh'(g), dL/d(pre-o) = dh·tanh(c)·σ'(o); and dL/dc gains dh·o·tanh'(c).
        # The buffer becomes the gates' gradient in place, step by step.
        d_gates = torch.empty_like(a)
        _SIGMOID_BACK(g, i, grad_input=d_gates[:, :, :, 0])
        if steps > 1:
            _SIGMOID_BACK(cells[:, :-1], f[:, 1:], grad_input=d_gates[:, 1:, :, 1])
        d_gates[:, 0, :, 1].zero_()                                # c₋₁ = 0: f has no effect at t = 0
        _TANH_BACK(i, g, grad_input=d_gates[:, :, :, 2])
        _SIGMOID_BACK(tanhs, o, grad_input=d_gates[:, :, :, 3])
        through = torch.ops.aten.tanh_backward.default(o, tanhs)   # o·tanh'(c)
        dg_t, ifg_t, og_t, f_t, th_t = (d_gates.unbind(1), d_gates[:, :, :, 0:3].unbind(1),
                                        d_gates[:, :, :, 3].unbind(1), f.unbind(1), through.unbind(1))
        d_h = d_out if ctx.last else d_out[:, -1]
        d_c = None
        for t in range(steps - 1, -1, -1):
            if t < steps - 1 and not ctx.last:
                d_h = d_h.add_(d_out[:, t])
            d_c = d_h * th_t[t] if d_c is None else d_c.addcmul_(d_h, th_t[t])
            ifg_t[t].mul_(d_c.unsqueeze(2))
            og_t[t].mul_(d_h)
            if t:
                d_c = d_c * f_t[t]
                d_h = torch.bmm(dg_t[t].view(m, b, 4 * hidden), w_hh)
        rows = d_gates.view(m, steps * b, 4 * hidden)
        d_x = torch.bmm(rows, w_ih).view(m, steps, b, width) if ctx.needs_input_grad[0] else None
        d_w_ih = torch.bmm(rows.transpose(1, 2), x.reshape(m, steps * b, width))
        if steps > 1:          # Σₜ dGₜᵀ·hₜ₋₁ over t ≥ 1 (h₋₁ = 0)
            d_w_hh = torch.bmm(d_gates[:, 1:].reshape(m, (steps - 1) * b, 4 * hidden).transpose(1, 2),
                               outs[:, :-1].reshape(m, (steps - 1) * b, hidden))
        else:
            d_w_hh = torch.zeros_like(w_hh)
        d_b = rows.sum(1)
        return d_x, d_w_ih, d_w_hh, d_b, d_b.clone(), None


@torch.no_grad()
def _infer(x: torch.Tensor, weights) -> torch.Tensor:
    """The last step's output (m, b, H) of the stacked layers on inputs (m, T, b, In), without
    gradients: the layers advance together one step at a time (each step's input projection a
    product of its own), so that no sequence is held."""
    m, steps, b, _ = x.shape
    layers = [((b_ih + b_hh).unsqueeze(1), w_ih.transpose(1, 2), w_hh.transpose(1, 2)) for w_ih, w_hh, b_ih, b_hh in weights]
    cells: list = [None] * len(layers)
    outs: list = [None] * len(layers)
    for t in range(steps):
        h = x[:, t]
        for k, (bias, w_ih_t, w_hh_t) in enumerate(layers):
            gates = torch.baddbmm(bias, h, w_ih_t)
            if t:
                gates.baddbmm_(outs[k], w_hh_t)
            hidden = w_hh_t.shape[1]
            c, tanh, h = (x.new_empty(m, b, hidden) for _ in range(3))
            _cell(gates, cells[k], c, tanh, h)
            cells[k], outs[k] = c, h
    return h

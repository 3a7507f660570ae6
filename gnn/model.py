"""The encoder and the placement policy.

:class:`Encoder` runs stock torch-geometric layers over the heterogeneous
problem graph of :mod:`gnn.features`: a direction-aware GATv2 over tensor
flows (``DirGNNConv``), GINE over device links and GATv2 both ways over the
candidate placements, with residual connections and layer norm.

:class:`PlacementPolicy` scores every (unit, device) pair from the two
embeddings, so the output distribution is over *this* cluster's devices and
one model serves clusters of any size. Decoding walks the units in
topological order (one decision per colocation group), adding to the static
score a small network over the decoding state: where the unit's producers and
consumers sit, each device's compute load and memory so far, the previous
unit's device. Devices whose memory would overflow are masked while another
device still fits.

- one-shot: :meth:`PlacementPolicy.sample` from an empty placement;
- refinement (Placeto-style): ``sample(..., context=placement)`` revisits
  every unit given the current placement of all others.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn
from torch_geometric.nn import DirGNNConv, GATv2Conv, GINEConv, HeteroConv

from placer.cost.warmup import on_warm_up

from . import dense
from .features import (CAND_FEATURES, DEV_FEATURES, FLOW_FEATURES, LINK_FEATURES, OP_FEATURES,
                       ProblemGraph)

__all__ = ["PolicyConfig", "Encoder", "PlacementPolicy", "Decoded", "FastDecoder"]

N_DYNAMIC = 12
_POSITION = 8   # the dynamic feature that is the unit's position in the order
_HALVED = (2, 3, 9)   # dynamic features scaled by 0.5 (FastDecoder folds it into weights)


@dataclass
class PolicyConfig:
    """Shape of a policy: embedding width, message-passing depth, heads of the
    candidate attention, width of the projections the decoder sees."""

    hidden: int = 64
    layers: int = 3
    heads: int = 2
    proj: int = 16
    dyn_hidden: int = 32

    def to_dict(self) -> dict:
        return asdict(self)

    #: largest value of each field a checkpoint may give (a policy of these
    #: sizes is already far larger than any trained one)
    LIMITS = {"hidden": 4096, "layers": 64, "heads": 64, "proj": 4096, "dyn_hidden": 4096}
    #: largest layers x hidden^2 (about 11 weights each: some 46 million)
    MAX_SIZE = 2**22

    @classmethod
    def from_dict(cls, data: dict, file: str | None = None,
                  where: str = "policy") -> "PolicyConfig":
        """The config in ``data``; a missing field keeps its default, a bad
        one is a :class:`placer.errors.FormatError` naming it."""
        from placer._io import Fields
        from placer.errors import FormatError
        fields = Fields(data, where, file, FormatError)
        values = {}
        for key, limit in cls.LIMITS.items():
            value = fields.count(key, limit, cls.__dataclass_fields__[key].default)
            values[key] = value
        size = values["layers"] * values["hidden"] ** 2
        if size > cls.MAX_SIZE:
            fields.fail("hidden", f"layers x hidden^2 = {size:,} is over the limit of "
                        f"{cls.MAX_SIZE:,} (a policy of some {11 * size / 1e6:.0f} million "
                        "weights)", fix="give a smaller hidden or fewer layers")
        if values["hidden"] % values["heads"]:
            fields.fail("heads", f"must divide hidden ({values['hidden']}), got "
                        f"{values['heads']}", fix="give a divisor of hidden, e.g. 2")
        return cls(**values)


class _DirEdgeConv(DirGNNConv):
    """DirGNNConv that passes edge features to both directions."""

    def forward(self, x, edge_index, edge_attr=None):  # noqa: D102
        x_in = self.conv_in(x, edge_index, edge_attr)
        x_out = self.conv_out(x, edge_index.flip([0]), edge_attr)
        out = self.alpha * x_out + (1 - self.alpha) * x_in
        if self.root_weight:
            out = out + self.lin(x)
        return out


def _mlp(*sizes: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class Encoder(nn.Module):
    """Embeddings of units (``op``) and devices (``dev``) of one problem."""

    def __init__(self, config: PolicyConfig):
        super().__init__()
        H, heads = config.hidden, config.heads
        self.op_in = _mlp(OP_FEATURES, H, H)
        self.dev_in = _mlp(DEV_FEATURES, H, H)
        self.convs = nn.ModuleList()
        self.norms = nn.ModuleList()
        for _ in range(config.layers):
            self.convs.append(HeteroConv({
                ("op", "flow", "op"): _DirEdgeConv(
                    GATv2Conv(H, H, edge_dim=FLOW_FEATURES, add_self_loops=False)),
                ("dev", "link", "dev"): GINEConv(_mlp(H, H, H), edge_dim=LINK_FEATURES),
                ("op", "cand", "dev"): GATv2Conv((H, H), H // heads, heads=heads,
                                                 edge_dim=CAND_FEATURES, add_self_loops=False),
                ("dev", "rcand", "op"): GATv2Conv((H, H), H // heads, heads=heads,
                                                  edge_dim=CAND_FEATURES, add_self_loops=False),
            }, aggr="sum"))
            self.norms.append(nn.ModuleDict({"op": nn.LayerNorm(H), "dev": nn.LayerNorm(H)}))

    def forward(self, data) -> tuple[torch.Tensor, torch.Tensor]:
        """``(h_op (U, H), h_dev (D, H))``."""
        h = {"op": self.op_in(data["op"].x), "dev": self.dev_in(data["dev"].x)}
        edge_index = {k: data[k].edge_index for k in data.edge_types}
        edge_attr = {k: data[k].edge_attr for k in data.edge_types}
        for conv, norm in zip(self.convs, self.norms):
            out = conv(h, edge_index, edge_attr_dict=edge_attr)
            h = {k: norm[k](h[k] + torch.relu(out[k])) if k in out else h[k] for k in h}
        return h["op"], h["dev"]


@dataclass
class Decoded:
    """Samples of one decoding: ``actions`` (k, U) device per unit,
    ``log_prob`` (k,) and ``entropy`` (k,) summed over decided units."""

    actions: torch.Tensor
    log_prob: torch.Tensor
    entropy: torch.Tensor


class PlacementPolicy(nn.Module):
    """Per-unit distributions over a cluster's devices (see the module doc).

    >>> from placer import Graph, Op, Edge, Cluster, Device
    >>> from placer.cost import Problem
    >>> from gnn.features import encode_problem
    >>> g = Graph("t", [Op("a", flops=1e9), Op("b", flops=1e9)], [Edge("a", "b", 1e6)])
    >>> c = Cluster.from_rules("c", [Device("x", 1e12, 1e10), Device("y", 1e12, 1e10)],
    ...                        default=(1e9, 0.0))
    >>> policy = PlacementPolicy(PolicyConfig(hidden=16, layers=1))
    >>> out = policy.sample(encode_problem(Problem(g, c)), k=3,
    ...                     generator=torch.Generator().manual_seed(0))
    >>> tuple(out.actions.shape)
    (3, 2)
    """

    def __init__(self, config: PolicyConfig | None = None):
        super().__init__()
        self.config = config or PolicyConfig()
        H, P = self.config.hidden, self.config.proj
        self.encoder = Encoder(self.config)
        self.pair = _mlp(2 * H + CAND_FEATURES, H, 1)
        self.op_proj = nn.Linear(H, P)
        self.dev_proj = nn.Linear(H, P)
        self.dynamic = _mlp(N_DYNAMIC + 2 * P, self.config.dyn_hidden, 1)
        # A linear prior over the decoding state, initialised to "follow your
        # producers and consumers, avoid overloaded devices": it starts the
        # policy near contiguous, balanced plans instead of scattered ones.
        self.prior = nn.Linear(N_DYNAMIC, 1, bias=False)
        with torch.no_grad():
            self.prior.weight.zero_()
            self.prior.weight[0, 0] = 6.0    # share of input bytes already there
            self.prior.weight[0, 1] = 3.0    # share of output bytes there (refinement)
            self.prior.weight[0, 3] = -4.0   # load after adding this unit
            self.prior.weight[0, 11] = -3.0  # time to fetch the inputs over the links

    def static_scores(self, pg: ProblemGraph, embeddings=None):
        """Encode once: static (U, D) scores and the decoder's projections.
        ``embeddings`` ``(h_op, h_dev)`` replaces the encoder's pass (e.g.
        :func:`gnn.dense.encode`'s, for inference)."""
        h_op, h_dev = embeddings if embeddings is not None else self.encoder(pg.data)
        U, D = pg.n_units, pg.n_devices
        H = h_op.shape[1]
        cand = pg.data["op", "cand", "dev"].edge_attr.view(U, D, CAND_FEATURES)
        # the pair MLP's first layer split by input block: the same maths as
        # applying it to cat([h_op, h_dev, cand]) without the (U, D, 2H) copy;
        # adding in place, in the same order, is 5x faster than the expression
        first, rest = self.pair[0], self.pair[1:]
        w = first.weight
        hidden = (h_op @ w[:, :H].T)[:, None, :] + (h_dev @ w[:, H:2 * H].T)[None, :, :]
        hidden += cand @ w[:, 2 * H:].T
        hidden += first.bias
        return rest(hidden).squeeze(-1), self.op_proj(h_op), self.dev_proj(h_dev)

    def sample(self, pg: ProblemGraph, k: int = 1, *, generator: torch.Generator | None = None,
               greedy: bool = False, context: np.ndarray | torch.Tensor | None = None,
               temperature: float = 1.0, encoded=None,
               actions: np.ndarray | torch.Tensor | None = None) -> Decoded:
        """Decode ``k`` placements (``greedy``: the most likely one, k times).

        ``context`` (k, U) or (U,) device per unit turns on refinement: each
        unit is re-decided given the current devices of all others.
        ``encoded`` reuses a :meth:`static_scores` result. ``actions`` (k, U)
        scores given placements instead of sampling (teacher forcing).
        """
        s0, p_op, p_dev = encoded if encoded is not None else self.static_scores(pg)
        first, rest = self.dynamic[0], self.dynamic[2:]
        P = p_op.shape[1]
        w_dyn = first.weight[:, :N_DYNAMIC]
        pre_op = p_op @ first.weight[:, N_DYNAMIC:N_DYNAMIC + P].T                   # (U, Hd)
        pre_dev = p_dev @ first.weight[:, N_DYNAMIC + P:].T + first.bias            # (D, Hd)
        U, D = pg.n_units, pg.n_devices
        work = torch.as_tensor(pg.work, dtype=torch.float32)
        rate = torch.as_tensor(pg.rate, dtype=torch.float32)
        need = torch.as_tensor(pg.need, dtype=torch.float32)
        memory = torch.as_tensor(pg.memory, dtype=torch.float32)
        workspace = torch.as_tensor(pg.workspace, dtype=torch.float32)
        t_bal = work.sum().clamp_min(1e-30) / rate.sum()
        add_time = work[:, None] / rate[None, :] / t_bal          # (U, D)
        ins, outs = _adjacency(pg)
        inv_bw = torch.as_tensor(pg.inv_bandwidth, dtype=torch.float32)
        latency = torch.as_tensor(pg.latency, dtype=torch.float32)
        t_unit = float(work.sum() / rate.sum()) / max(U, 1)   # seconds per unit if balanced
        refine = context is not None
        forced = None
        if actions is not None:
            forced = torch.as_tensor(np.asarray(actions), dtype=torch.long)
            forced = forced.expand(k, U) if forced.dim() == 1 else forced
        if refine:
            assign = torch.as_tensor(np.asarray(context), dtype=torch.long)
            assign = assign.expand(k, U).clone() if assign.dim() == 1 else assign.clone()
            load = torch.zeros(k, D).scatter_add_(1, assign, add_time[torch.arange(U), assign])
            mem = torch.zeros(k, D).scatter_add_(1, assign, need.expand(k, U).contiguous())
        else:
            assign = torch.full((k, U), -1, dtype=torch.long)
            load = torch.zeros(k, D)
            mem = torch.zeros(k, D)
        peak_ws = torch.zeros(k, D)   # largest transient workspace placed so far
        rows = torch.arange(k)
        log_prob = torch.zeros(k)
        entropy = torch.zeros(k)
        tie = pg.tie
        for u in range(U):
            if refine:   # take u out of the state before re-deciding it
                cur = assign[:, u]
                load[rows, cur] -= add_time[u, cur]
                mem[rows, cur] -= need[u]
            if tie[u] != u:
                action = assign[:, int(tie[u])]
            else:
                dyn = self._dynamic_features(u, U, D, k, assign, load, mem, memory, need,
                                             add_time, ins, outs, inv_bw, latency, t_unit)
                # first layer of self.dynamic split by input block (same maths as
                # applying it to [dyn, p_op[u], p_dev]), the static blocks precomputed
                hidden = torch.relu(torch.nn.functional.linear(dyn, w_dyn) + pre_op[u] + pre_dev)
                logits = (s0[u][None, :] + rest(hidden).squeeze(-1)
                          + self.prior(dyn).squeeze(-1)) / temperature
                fits = (mem + need[u] + torch.clamp_min(peak_ws, workspace[u])) <= memory[None, :]
                fits = fits | ~fits.any(dim=1, keepdim=True)
                if forced is not None:
                    fits[rows, forced[:, u]] = True
                logits = logits.masked_fill(~fits, -1e9)
                logp = torch.log_softmax(logits, dim=-1)
                if forced is not None:
                    action = forced[:, u]
                elif greedy:
                    action = logits.argmax(dim=-1)
                else:
                    action = torch.multinomial(logp.exp().detach(), 1,
                                               generator=generator).squeeze(-1)
                log_prob = log_prob + logp[rows, action]
                p = logp.exp()
                entropy = entropy - (p * logp.masked_fill(~fits, 0.0)).sum(-1)
            assign[:, u] = action
            load[rows, action] += add_time[u, action]
            mem[rows, action] += need[u]
            peak_ws[rows, action] = torch.clamp_min(peak_ws[rows, action], workspace[u])
        return Decoded(assign, log_prob, entropy)

    @staticmethod
    def _dynamic_features(u, U, D, k, assign, load, mem, memory, need, add_time, ins, outs,
                          inv_bw, latency, t_unit):
        feats = []
        src, weight = ins[u][0], ins[u][2]
        if len(src):
            dev = assign[:, src]                                  # (k, p)
            ok = (dev >= 0).float()[..., None]
            d = dev.clamp_min(0)
            secs = (inv_bw[d] * weight[None, :, None] + latency[d]) * ok
            fetch = torch.log1p(secs.sum(1) / max(t_unit, 1e-30)) / 3
        else:
            fetch = torch.zeros(k, D)
        for src, weight, _ in (ins[u], outs[u]):
            aff = torch.zeros(k, D)
            if len(src):
                dev = assign[:, src]
                ok = dev >= 0
                w = weight.expand(k, -1) * ok
                aff.scatter_add_(1, dev.clamp_min(0), w)
                aff = aff / w.sum(-1, keepdim=True).clamp_min(1e-30)
            feats.append(aff)
        used = (load > 0).float()
        prev = torch.zeros(k, D)
        if u > 0:
            prev.scatter_(1, assign[:, u - 1:u].clamp_min(0), 1.0)
        ones = torch.ones(k, D)
        feats += [
            load.clamp_max(8.0) / 2,
            (load + add_time[u][None]).clamp_max(8.0) / 2,
            (mem / memory).clamp_max(4.0),
            ((mem + need[u]) / memory).clamp_max(4.0),
            used,
            prev,
            ones * (u / max(U - 1, 1)),
            ones * load.max(dim=1, keepdim=True).values.clamp_max(8.0) / 2,
            ones * used.mean(dim=1, keepdim=True),
            fetch,
        ]
        return torch.stack(feats, dim=-1)


def _adjacency(pg: ProblemGraph):
    """Per unit: (producer units, normalised bytes) and (consumer units, bytes)."""
    return pg.cache.get_or_build("model.adjacency", lambda: _build_adjacency(pg))


def _build_adjacency(pg: ProblemGraph):
    U = pg.n_units
    ins: list = [[[], []] for _ in range(U)]
    outs: list = [[[], []] for _ in range(U)]
    for s, d, b in zip(pg.flow_src.tolist(), pg.flow_dst.tolist(), pg.flow_bytes.tolist()):
        ins[d][0].append(s)
        ins[d][1].append(b + 1.0)
        outs[s][0].append(d)
        outs[s][1].append(b + 1.0)

    def pack(pairs):
        return [(torch.as_tensor(a, dtype=torch.long),
                 torch.as_tensor(b, dtype=torch.float32)[None, :],
                 torch.as_tensor(b, dtype=torch.float32) - 1.0) for a, b in pairs]
    return pack(ins), pack(outs)


class FastDecoder:
    """Inference-only decoding with the logits of :meth:`PlacementPolicy.sample`
    (float32), compiled with numba (:func:`gnn.decode_loops.decode_units`):
    no autograd, no per-op dispatch. Sampling is Gumbel-max from a NumPy
    generator, so sampled rows are distributed like ``sample``'s but are not
    the same draws.

    Built once per problem (the encoder runs once, without message passing
    (:func:`gnn.dense.encode`), unless ``encoded`` gives
    :meth:`PlacementPolicy.static_scores`' result); :meth:`decode` then
    costs one pass over the devices per unit and row.

    >>> from placer import Graph, Op, Edge, Cluster, Device
    >>> from placer.cost import Problem
    >>> from gnn.features import encode_problem
    >>> g = Graph("t", [Op("a", flops=1e9), Op("b", flops=1e9)], [Edge("a", "b", 1e6)])
    >>> c = Cluster.from_rules("c", [Device("x", 1e12, 1e10), Device("y", 1e12, 1e10)],
    ...                        default=(1e9, 0.0))
    >>> pg = encode_problem(Problem(g, c))
    >>> dec = FastDecoder(PlacementPolicy(PolicyConfig(hidden=16, layers=1)), pg)
    >>> dec.decode(4, greedy=1, rng=np.random.default_rng(0)).shape
    (4, 2)
    """

    def __init__(self, policy: "PlacementPolicy", pg: ProblemGraph, encoded=None):
        with torch.no_grad():
            if encoded is None:
                encoded = policy.static_scores(pg, dense.encode(policy.encoder, pg))
            s0, p_op, p_dev = encoded
            first, last = policy.dynamic[0], policy.dynamic[2]
            W, P = first.weight, p_op.shape[1]
            # the prior's weights as one more hidden column, without ReLU
            w_dyn = torch.cat([W[:, :N_DYNAMIC].T, policy.prior.weight.T], dim=1)
            pre_op = p_op @ W[:, N_DYNAMIC:N_DYNAMIC + P].T
            pre_dev = p_dev @ W[:, N_DYNAMIC + P:].T + first.bias
            U, Hd = pg.n_units, W.shape[0]
            # Everything that depends on the unit alone, precomputed per unit
            # (U, Hd + 1, D): the static hidden pre-activations and, last,
            # the static logits; dynamic feature 8 (the unit's position, the
            # same for every row and device) folded into both.
            position = torch.arange(U, dtype=torch.float32)[:, None] / max(U - 1, 1)
            step = position * w_dyn[_POSITION]                     # (U, Hd + 1)
            pre = torch.empty(U, Hd + 1, pg.n_devices)
            pre[:, :Hd] = pre_op[:, :, None] + pre_dev.T[None, :, :] + step[:, :-1, None]
            pre[:, Hd] = s0 + float(last.bias[0]) + step[:, -1:]
            self.pre = pre.numpy()
            w_dyn = w_dyn.clone()
            w_dyn[_POSITION] = 0.0
            w_dyn[list(_HALVED)] *= 0.5   # those features are stored unhalved
            self.w_dyn = w_dyn.numpy()
            # the output layer, with a weight 1 for the last column (prior
            # and static logit)
            self.w_out = torch.cat([last.weight[0], torch.ones(1)]).numpy().copy()
        self.pg = pg
        self.U, self.D = pg.n_units, pg.n_devices
        f = np.float32
        work, rate = pg.work.astype(f), pg.rate.astype(f)
        t_bal = max(float(work.sum()), 1e-30) / float(rate.sum())
        self.add_time = (work[:, None] / rate[None, :] / f(t_bal)).astype(f)
        self.need, self.memory = pg.need.astype(f), pg.memory.astype(f)
        self.workspace = pg.workspace.astype(f)
        self.inv_bw, self.latency = pg.inv_bandwidth.astype(f), pg.latency.astype(f)
        self.inv_memory = (1.0 / np.maximum(self.memory, 1e-30)).astype(f)
        self.inv_t_unit = f(1.0 / max(float(work.sum() / rate.sum()) / max(self.U, 1), 1e-30))
        self.ins, self.outs = _np_adjacency(pg)

    def decode(self, k: int, *, greedy: int = 0, rng: np.random.Generator | None = None,
               context: np.ndarray | None = None, temperature: float = 1.0) -> np.ndarray:
        """``(k, U)`` device per unit: the first ``greedy`` rows take the most
        likely device, the others sample (``rng``). ``context`` (U,) or
        (k, U) turns on refinement, like :meth:`PlacementPolicy.sample`."""
        from .decode_loops import decode_units     # numba loads on first use, not import
        U, D = self.U, self.D
        g = min(greedy, k)
        uniform = np.zeros((U, 0, D))
        if k > g:
            rng = rng if rng is not None else np.random.default_rng(0)
            uniform = _gumbel_draws(rng, (U, k - g, D))
        refine = context is not None
        if refine:
            assign = np.array(np.broadcast_to(np.asarray(context, np.int64), (k, U)), order="C")
        else:
            assign = np.full((k, U), -1, np.int64)
        return decode_units(assign, refine, g, uniform, np.float32(1.0 / temperature), self.pre,
                            self.w_dyn, self.w_out, self.add_time, self.need, self.workspace,
                            self.memory, self.inv_memory, self.inv_bw, self.latency,
                            self.inv_t_unit, *self.ins, *self.outs[:3],
                            np.asarray(self.pg.tie, np.int64))


@on_warm_up
def _warm_up() -> None:
    """Decode a two-unit problem, one-shot and refining, so that the
    compiled decoder loads (or compiles) before a time-budgeted search."""
    from placer import Cluster, Device, Edge, Graph, Op
    from placer.cost import Problem
    from .features import encode_problem
    g = Graph("warm-up", [Op("a", flops=1e9), Op("b", flops=1e9)], [Edge("a", "b", 1e6)])
    c = Cluster.from_rules("warm-up", [Device("x", 1e12, 1e10), Device("y", 1e12, 1e10)],
                           default=(1e9, 0.0))
    with torch.random.fork_rng(devices=[]):   # the caller's torch draws stay as they were
        policy = PlacementPolicy(PolicyConfig(hidden=8, layers=1, heads=1, proj=4,
                                              dyn_hidden=4))
    dec = FastDecoder(policy, encode_problem(Problem(g, c)))
    rows = dec.decode(2, greedy=1, rng=np.random.default_rng(0))
    dec.decode(2, greedy=1, rng=np.random.default_rng(0), context=rows[0])


def _gumbel_draws(rng: np.random.Generator, shape) -> np.ndarray:
    """The uniform draws ``rng.gumbel(size=shape)`` would transform, leaving
    ``rng`` as it would: it rejects a draw of 0 and draws again."""
    n = int(np.prod(shape))
    x = rng.random(n)
    while not x.all():
        x = x[x != 0.0]
        x = np.concatenate([x, rng.random(n - len(x))])
    return x.reshape(shape)


def _np_adjacency(pg: ProblemGraph):
    """Producers of each unit in CSR form (pointers, producer units, their
    shares of the unit's input bytes + 1, bytes) and the same for consumers,
    as NumPy arrays (cached on ``pg``)."""
    return pg.cache.get_or_build("model.np_adjacency", lambda: _build_np_adjacency(pg))


def _build_np_adjacency(pg: ProblemGraph):
    U = pg.n_units
    src, dst = pg.flow_src.astype(np.int64), pg.flow_dst.astype(np.int64)
    b = pg.flow_bytes.astype(np.float32)

    def group(key, other):
        order = np.argsort(key, kind="stable")
        bounds = np.searchsorted(key[order], np.arange(U + 1))
        share = np.empty(len(order), np.float32)
        for u in range(U):
            w = b[order[bounds[u]:bounds[u + 1]]] + 1.0
            share[bounds[u]:bounds[u + 1]] = w / max(float(w.sum()), 1e-30)
        return bounds.astype(np.int64), other[order], share, b[order]
    return group(dst, src), group(src, dst)

"""Inference of :class:`gnn.model.Encoder` without message passing.

The candidate-placement edges join every unit to every device and the link
edges every ordered pair of devices, so their layers are dense: GATv2's
attention over the candidates is a softmax over one axis of a ``(U, D)``
score array and GINE's sum over links a masked sum over ``(D, D)``. Only the
sparse flow edges keep gather and scatter. :func:`encode` computes the
encoder's output with the same weights and the same maths as the
torch-geometric layers (tested equal to float rounding), for a fraction of
their per-layer overhead; training keeps the stock layers.

>>> import torch
>>> from placer import Graph, Op, Edge, Cluster, Device
>>> from placer.cost import Problem
>>> from gnn.features import encode_problem
>>> from gnn.model import PlacementPolicy, PolicyConfig
>>> g = Graph("t", [Op("a", flops=1e9), Op("b", flops=1e9)], [Edge("a", "b", 1e6)])
>>> c = Cluster.from_rules("c", [Device("x", 1e12, 1e10), Device("y", 1e12, 1e10)],
...                        default=(1e9, 0.0))
>>> pg = encode_problem(Problem(g, c))
>>> enc = PlacementPolicy(PolicyConfig(hidden=16, layers=1)).encoder.eval()
>>> with torch.no_grad():
...     fast, ref = encode(enc, pg), enc(pg.data)
>>> all(torch.allclose(a, b, atol=1e-5) for a, b in zip(fast, ref))
True
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["encode"]


def encode(encoder, pg) -> tuple[torch.Tensor, torch.Tensor]:
    """``(h_op (U, H), h_dev (D, H))`` of ``encoder`` on problem graph ``pg``
    (a :class:`gnn.features.ProblemGraph`), as ``encoder(pg.data)`` gives
    them; call it under ``torch.no_grad()`` (it is not meant for training)."""
    data = pg.data
    U, D = pg.n_units, pg.n_devices
    flow_index = data["op", "flow", "op"].edge_index
    flow_attr = data["op", "flow", "op"].edge_attr
    cand = data["op", "cand", "dev"].edge_attr                       # (U*D, F) unit-major
    # the link edges are every ordered pair of distinct devices: laid out
    # densely (source, target) with zero features on the diagonal, which
    # _gine_dense takes back out of its sums
    link_index = data["dev", "link", "dev"].edge_index
    link_attr = data["dev", "link", "dev"].edge_attr
    link = link_attr.new_zeros(D * D, link_attr.shape[1])
    link.index_copy_(0, link_index[0] * D + link_index[1], link_attr)
    h_op = encoder.op_in(data["op"].x)
    h_dev = encoder.dev_in(data["dev"].x)
    for conv, norm in zip(encoder.convs, encoder.norms):
        convs = conv.convs
        flow = convs["op", "flow", "op"]
        out_op = (_gatv2_sparse(flow.conv_in, h_op, flow_index, flow_attr) * (1 - flow.alpha)
                  + _gatv2_sparse(flow.conv_out, h_op, flow_index.flip([0]), flow_attr)
                  * flow.alpha)
        if flow.root_weight:
            out_op = out_op + flow.lin(h_op)
        out_op += _gatv2_dense(convs["dev", "rcand", "op"], h_dev, h_op, cand, U, D,
                               source_axis=1)
        out_dev = (_gine_dense(convs["dev", "link", "dev"], h_dev, link, D)
                   + _gatv2_dense(convs["op", "cand", "dev"], h_op, h_dev, cand, U, D,
                                  source_axis=0))
        h_op = norm["op"](h_op + torch.relu(out_op))
        h_dev = norm["dev"](h_dev + torch.relu(out_dev))
    return h_op, h_dev


def _gatv2_dense(conv, x_src, x_dst, cand, U: int, D: int, source_axis: int):
    """GATv2Conv over the complete unit x device bipartite graph; the edge
    features ``cand`` are unit-major ``(U*D, F)``. ``source_axis`` 0: units
    send to devices, 1: devices send to units."""
    heads, C = conv.heads, conv.out_channels
    xl = conv.lin_l(x_src).view(-1, heads, C)
    xr = conv.lin_r(x_dst).view(-1, heads, C)
    # in place on the (U, D, heads, C) array: it is the bulk of the work
    z = conv.lin_edge(cand).view(U, D, heads, C)
    if source_axis == 0:     # xl per unit, xr per device
        z += xl[:, None]
        z += xr[None, :]
    else:                    # xl per device, xr per unit
        z += xr[:, None]
        z += xl[None, :]
    F.leaky_relu_(z, conv.negative_slope)
    # a product with a (heads*C, heads) matrix is 3x slower here (tall, thin)
    alpha = z.mul_(conv.att).sum(-1)                                        # (U, D, heads)
    alpha = torch.softmax(alpha, dim=source_axis)
    if source_axis == 0:
        out = torch.einsum("udh,uhc->dhc", alpha, xl)
    else:
        out = torch.einsum("udh,dhc->uhc", alpha, xl)
    out = out.reshape(out.shape[0], heads * C) if conv.concat else out.mean(dim=1)
    if conv.res is not None:
        out = out + conv.res(x_dst)
    return out + conv.bias if conv.bias is not None else out


def _gatv2_sparse(conv, x, edge_index, edge_attr):
    """GATv2Conv on a sparse edge list (the flow edges), as torch-geometric
    computes it: softmax over each target's incoming edges."""
    heads, C = conv.heads, conv.out_channels
    n = x.shape[0]
    xl = conv.lin_l(x).view(-1, heads, C)
    xr = conv.lin_r(x).view(-1, heads, C)
    src, dst = edge_index[0], edge_index[1]
    z = xl[src] + xr[dst] + conv.lin_edge(edge_attr).view(-1, heads, C)
    alpha = (F.leaky_relu(z, conv.negative_slope) * conv.att).sum(-1)      # (E, heads)
    top = alpha.new_full((n, heads), float("-inf")).scatter_reduce(
        0, dst[:, None].expand_as(alpha), alpha, "amax", include_self=True)
    alpha = (alpha - top[dst]).exp()
    total = alpha.new_zeros(n, heads).index_add_(0, dst, alpha) + 1e-16
    alpha = alpha / total[dst]
    out = x.new_zeros(n, heads, C).index_add_(0, dst, xl[src] * alpha[..., None])
    out = out.reshape(n, heads * C) if conv.concat else out.mean(dim=1)
    if conv.res is not None:
        out = out + conv.res(x)
    return out + conv.bias if conv.bias is not None else out


def _gine_dense(conv, x, link, D: int):
    """GINEConv over every ordered pair of distinct devices; ``link`` holds
    the link features densely, ``(source * D + target, F)``, zero on the
    diagonal."""
    msg = conv.lin(link).view(D, D, -1)                                     # (src, dst, H)
    msg += x[:, None, :]
    msg.relu_()
    # the diagonal is no link: its message is summed and taken back out
    agg = msg.sum(0) - msg.diagonal(0, 0, 1).T
    return conv.nn(agg + (1 + conv.eps) * x)

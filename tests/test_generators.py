"""The out-of-family split: its generators and its place beside the other splits."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from placer import datasets, generators
from placer.cost import Problem


def _dag(g):
    d = nx.DiGraph()
    d.add_nodes_from(g.ids)
    d.add_edges_from((e.src, e.dst) for e in g.edges)
    return d


@pytest.mark.parametrize("name", ["opgraph-n400-s3", "rnn-t6-l3-s1", "experts-e4-l3-s2"])
def test_graphs_are_acyclic_deterministic_and_named(name):
    g = datasets.graph(name)
    assert g.name == name and nx.is_directed_acyclic_graph(_dag(g))
    assert g.fingerprint() == datasets.graph(name).fingerprint()
    assert datasets.family(name) == "ood-" + name.split("-")[0]
    assert g.total_flops() > 0 and Problem(g, datasets.cluster("classes-d4-s0")).n_ops == len(g)


def test_op_graph_costs_are_skewed():
    """Most ops carry no FLOPs; the FLOPs span orders of magnitude."""
    g = generators.op_graph(2000, seed=0)
    flops = np.array([o.flops for o in g])
    assert (flops == 0).mean() > 0.7
    top = np.sort(flops)[::-1]
    assert top[:20].sum() > 0.5 * flops.sum()            # 1% of the ops: most of the work
    positive = flops[flops > 0]
    assert positive.max() / positive.min() > 1e4           # four orders of magnitude


def test_unrolled_rnn_shares_weights_and_recurs():
    g = generators.unrolled_rnn(5, 3, seed=0)
    groups = g.colocation_groups()
    assert sorted(len(v) for v in groups.values()) == [5, 5, 5, 5, 5]
    assert sum(o.param_bytes > 0 for o in g) == 5          # each shared weight counted once
    assert "cell3.1" in g.successors("cell2.1") and "cell2.2" in g.successors("cell2.1")


def test_expert_layers_branch_per_expert():
    g = generators.expert_layers(6, 2, seed=1)
    assert len(g.successors("b0.router")) == 6
    assert len(g.predecessors("b1.combine")) == 6 + 1    # the experts and the residual
    ups = [o for o in g if o.op == "expert_up"]
    assert len(ups) == 12 and len({o.param_bytes for o in ups}) > 1


def test_speed_class_cluster_has_a_slow_site_link():
    c = datasets.cluster("classes-d8-s0")
    rates = np.array([d.flops for d in c.devices])
    assert 3 <= rates.max() / rates.min() <= 16
    bw = np.array(c.bandwidth)
    site = [d.site for d in c.devices]
    between = sorted({bw[i, j] for i in range(len(c)) for j in range(len(c))
                      if site[i] != site[j]})
    assert between[-1] / between[0] == pytest.approx(8.0)   # one site pair 8x slower


def test_region_cluster_spreads_gpus_over_regions():
    c = datasets.cluster("regions-d8-r4-s0")
    sites = c.sites()
    assert len(sites) == 4 and all(len(v) == 2 for v in sites.values())
    lat = np.array(c.latency)
    i, j = sites["region0"][0], sites["region1"][0]
    assert lat[c.index(i), c.index(j)] >= 0.01
    assert c.fingerprint() == datasets.cluster("regions-d8-r4-s0").fingerprint()


def test_ood_split_is_out_of_every_other_split():
    parts = datasets.ood()
    assert parts["graphs"] and parts["clusters"]
    families = {datasets.family(n) for n in parts["graphs"]}
    assert all(f.startswith("ood-") for f in families)
    seen = {datasets.family(n) for n in sum(datasets.splits().values(), [])}
    assert not families & seen
    assert not set(parts["clusters"]) & set(datasets.clusters())   # no shipped preset
    for name in parts["clusters"]:
        assert len(datasets.cluster(name).sites()) >= 3


def test_bad_generator_sizes_are_rejected():
    with pytest.raises(ValueError, match="steps"):
        generators.unrolled_rnn(0, 2)
    with pytest.raises(ValueError, match="not an out-of-family"):
        generators.cluster("classes-x")

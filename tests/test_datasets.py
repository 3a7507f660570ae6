"""placer.datasets: cluster presets, traced graphs, synthetic generators, splits."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

import placer
from placer import datasets
from placer._paths import data_dir
from placer.errors import GraphError

GBPS = 1e9 / 8  # bytes/s in one Gbit/s

EXPECTED_DEVICES = {
    "a100x8": 8, "two-sites": 8, "ib-4x8-a100": 32, "hetero-lab": 10, "edge-wireless": 9,
    "dtfm-datacenter-ondemand": 64, "dtfm-datacenter-spot": 64,
    "dtfm-multi-universities": 64, "dtfm-regional": 64, "dtfm-worldwide": 64,
}


# --- clusters ------------------------------------------------------------------

def test_clusters_lists_the_presets():
    assert datasets.clusters() == placer.Cluster.presets()
    assert set(EXPECTED_DEVICES) <= set(datasets.clusters())


@pytest.mark.parametrize("name", sorted(EXPECTED_DEVICES))
def test_preset_loads_with_sensible_numbers(name):
    cluster = datasets.cluster(name)
    assert len(cluster) == EXPECTED_DEVICES[name]
    off = ~np.eye(len(cluster), dtype=bool)
    assert (cluster.bandwidth[off] >= 1e6).all() and (cluster.bandwidth[off] <= 1e12).all()
    assert (cluster.latency[off] >= 0).all() and (cluster.latency[off] < 1.0).all()
    assert np.allclose(cluster.bandwidth, cluster.bandwidth.T)
    for device in cluster.devices:
        assert 1e9 <= device.flops <= 1e16
        assert 1e9 <= device.memory <= 1e12
    assert cluster.meta.get("description")


@pytest.mark.parametrize("name", [n for n in EXPECTED_DEVICES if n.startswith("dtfm-")])
def test_dtfm_scenarios_cite_their_source(name):
    meta = datasets.cluster(name).meta
    assert "2206.01288" in meta["source"] and "DT-FM" in meta["source"]
    assert all(d.kind == "V100-16GB" for d in datasets.cluster(name).devices)


def test_dtfm_numbers_match_the_paper():
    world = datasets.cluster("dtfm-worldwide")
    assert len(world.sites()) == 8 and all(len(v) == 8 for v in world.sites().values())
    assert world.link("oregon0", "virginia7") == pytest.approx((0.79 * GBPS, 0.067))
    assert world.link("seoul3", "london1") == pytest.approx((0.342 * GBPS, 0.238))
    assert world.link("tokyo0", "tokyo5") == pytest.approx((2 * GBPS, 0.005))
    uni = datasets.cluster("dtfm-multi-universities")
    assert uni.link("ohio0", "virginia0") == pytest.approx((1.12 * GBPS, 0.011))
    assert uni.link("ohio0", "ohio31") == pytest.approx((5 * GBPS, 0.001))
    regional = datasets.cluster("dtfm-regional")
    assert regional.link("oregon0", "california0") == pytest.approx((1.25 * GBPS, 0.012))
    ondemand = datasets.cluster("dtfm-datacenter-ondemand")
    assert ondemand.link("i0-gpu0", "i0-gpu7")[0] == pytest.approx(100 * GBPS)
    assert ondemand.link("i0-gpu0", "i1-gpu0")[0] == pytest.approx(3.125 * GBPS)
    spot = datasets.cluster("dtfm-datacenter-spot")
    assert spot.link("s0-gpu0", "s0-gpu3")[0] == pytest.approx(100 * GBPS)
    assert spot.link("s0-gpu0", "single0")[0] == pytest.approx(1.25 * GBPS)
    assert spot.link("single0", "single1")[0] == pytest.approx(1.25 * GBPS)


def test_infiniband_and_lab_links():
    ib = datasets.cluster("ib-4x8-a100")
    assert ib.link("n0-gpu0", "n3-gpu7")[0] == pytest.approx(200 * GBPS)
    assert ib.link("n2-gpu0", "n2-gpu1")[0] == pytest.approx(3e11)
    lab = datasets.cluster("hetero-lab")
    assert len({d.kind for d in lab.devices}) >= 4
    assert len({d.memory for d in lab.devices}) >= 3
    assert lab.link("rtx3090-0", "t4-0")[0] == pytest.approx(10 * GBPS)


# --- synthetic graphs ----------------------------------------------------------------

GENERATORS = [
    lambda n, seed: datasets.layered(n, 6, seed),
    lambda n, seed: datasets.series_parallel(n, seed),
    lambda n, seed: datasets.random_dag(n, 6, seed),
]


@pytest.mark.parametrize("make", GENERATORS, ids=["layered", "series_parallel", "random_dag"])
@pytest.mark.parametrize("n", [1, 2, 17, 300])
def test_generators_are_sized_acyclic_and_deterministic(make, n):
    a, b = make(n, 3), make(n, 3)
    assert len(a) == n
    assert nx.is_directed_acyclic_graph(a.nx)
    assert a.fingerprint() == b.fingerprint()
    if n > 2:
        assert a.fingerprint() != make(n, 4).fingerprint()
        assert nx.is_weakly_connected(a.nx)
    assert datasets.graph(a.name).fingerprint() == a.fingerprint()


def test_generator_costs_look_like_real_ops():
    g = datasets.layered(500, 8, 0)
    by_kind: dict[str, list] = {}
    for op in g:
        by_kind.setdefault(op.op, []).append(op)
    assert all(op.flops > 0 and op.param_bytes > 0 for op in by_kind["linear"])
    for kind in ("relu", "add", "dropout"):
        assert all(op.flops == 0 and op.output_bytes > 0 for op in by_kind[kind])
    heavy = sum(op.flops for k in ("linear", "conv", "matmul") for op in by_kind.get(k, []))
    assert heavy > 0.9 * g.total_flops()
    for edge in g.edges:
        assert edge.bytes == g.op(edge.src).output_bytes


def test_layered_width_and_random_dag_window():
    g = datasets.layered(200, 5, 1)
    depths = g.depths()
    counts = np.bincount(list(depths.values()))
    assert counts.max() <= 5
    r = datasets.random_dag(200, 4, 1)
    for i in range(1, 200):
        assert r.predecessors(f"op{i}")


def test_series_parallel_has_one_source_and_one_sink():
    g = datasets.series_parallel(150, 2)
    assert sum(1 for o in g.ids if not g.predecessors(o)) == 1
    assert sum(1 for o in g.ids if not g.successors(o)) == 1


def test_bad_sizes_are_rejected():
    with pytest.raises(ValueError):
        datasets.layered(0)
    with pytest.raises(ValueError):
        datasets.random_dag(10, width=0)


# --- shipped graphs and splits ----------------------------------------------------------

def test_shipped_graphs_load_and_are_small():
    names = datasets.graphs()
    total = 0
    for name in names:
        path = data_dir() / "graphs" / f"{name}.json.gz"
        assert path.stat().st_size < 1_000_000
        total += path.stat().st_size
        g = datasets.graph(name)
        assert g.name == name and len(g) > 0 and g.total_flops() > 0
    assert total < 10_000_000


def test_unknown_graph_name():
    with pytest.raises(GraphError, match="unknown graph"):
        datasets.graph("no-such-graph")


def test_splits_are_disjoint_and_hold_out_families():
    splits = datasets.splits()
    assert set(splits) == {"train", "val", "test"}
    sets = {k: set(v) for k, v in splits.items()}
    assert all(len(v) == len(sets[k]) for k, v in splits.items())  # no repeats
    assert not (sets["train"] & sets["val"] or sets["train"] & sets["test"]
                or sets["val"] & sets["test"])
    families = {k: {datasets.family(n) for n in v} for k, v in splits.items()}
    assert not families["test"] & families["train"]
    assert not families["test"] & families["val"]
    assert not families["val"] & families["train"]
    assert {"moe", "gnmt", "unet", "inception", "dlrm"} <= families["test"]
    assert {"gpt", "bert", "resnet"} <= families["train"]
    assert all(splits.values())


def test_every_split_name_resolves():
    shipped = set(datasets.graphs())
    for name in sum(datasets.splits().values(), []):
        assert name in shipped or datasets._SYNTHETIC.match(name), name
    assert len(datasets.graph(datasets.split("val")[-1])) > 0


def test_unknown_split():
    with pytest.raises(ValueError):
        datasets.split("dev")

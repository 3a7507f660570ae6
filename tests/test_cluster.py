import math

import numpy as np
import pytest

from placer import Cluster, Device
from placer.errors import ClusterError

GOOD = """
format: placer.cluster/v1
name: two-sites
devices:
  - {name: a0, flops: 1.25e14, memory: 4.0e10, site: oregon}
  - {name: a1, flops: 1.25e14, memory: 4.0e10, site: oregon}
  - {name: b0, flops: 6.5e13, memory: 1.6e10, site: virginia}
links:
  default: {bandwidth: 1.0e9, latency: 0.001}
  sites:
    - {between: [oregon, virginia], bandwidth: 1.5e8, latency: 0.035}
    - {between: [oregon, oregon], bandwidth: 1e10, latency: 1e-5}
"""


def write(tmp_path, text, name="c.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_load_rules_and_exponent_numbers(tmp_path):
    c = Cluster.load(write(tmp_path, GOOD))
    assert c.names == ["a0", "a1", "b0"]
    assert c.device("a0").flops == 1.25e14 and isinstance(c.device("b0").memory, float)
    assert c.link("a0", "b0") == (1.5e8, 0.035) and c.link("b0", "a1") == (1.5e8, 0.035)
    assert c.link("a0", "a1") == (1e10, 1e-5)
    assert math.isinf(c.bandwidth[0, 0]) and c.latency[1, 1] == 0
    assert c.sites() == {"oregon": ["a0", "a1"], "virginia": ["b0"]}


def test_roundtrip_and_fingerprint(tmp_path):
    c = Cluster.load(write(tmp_path, GOOD))
    c.save(tmp_path / "out.yaml")
    back = Cluster.load(tmp_path / "out.yaml")
    assert back.fingerprint() == c.fingerprint()
    assert np.array_equal(back.bandwidth, c.bandwidth)
    # the same links as explicit matrices give the same fingerprint
    explicit = Cluster(c.name, c.devices, c.bandwidth, c.latency)
    explicit.save(tmp_path / "m.yaml")
    assert Cluster.load(tmp_path / "m.yaml").fingerprint() == c.fingerprint()
    changed = Cluster.load(write(tmp_path, GOOD.replace("0.035", "0.036")))
    assert changed.fingerprint() != c.fingerprint()


def test_count_expands_names(tmp_path):
    text = """
format: placer.cluster/v1
devices: [{name: gpu, count: 3, flops: 1e14, memory: 1e10}]
links: {default: {bandwidth: 1e11, latency: 1e-6}}
"""
    c = Cluster.load(write(tmp_path, text))
    assert c.names == ["gpu0", "gpu1", "gpu2"] and c.name == "c"


def test_matrix_links(tmp_path):
    text = """
format: placer.cluster/v1
name: m
devices: [{name: x, flops: 1e12, memory: 1e9}, {name: y, flops: 1e12, memory: 1e9}]
links:
  bandwidth: [[null, 1e9], [2e9, null]]
  latency: [[0, 0.01], [0.02, 0]]
"""
    c = Cluster.load(write(tmp_path, text))
    assert c.link("x", "y") == (1e9, 0.01) and c.link("y", "x") == (2e9, 0.02)


@pytest.mark.parametrize("old, new, field, words", [
    ("bandwidth: 1.5e8", "bandwidth: -5", "links.sites[0].bandwidth", "> 0"),
    ("bandwidth: 1.5e8", "bandwidth: 0", "links.sites[0].bandwidth", "> 0"),
    ("bandwidth: 1.5e8", "bandwidth: .nan", "links.sites[0].bandwidth", "NaN"),
    ("latency: 0.035", "latency: fast", "links.sites[0].latency", "expected a number"),
    ("memory: 1.6e10", "memory: 0", "devices[2].memory", "> 0"),
    ("flops: 6.5e13", "flops: .inf", "devices[2].flops", "infinite"),
    ("name: b0", "name: a0", "devices", "named twice"),
    ("[oregon, virginia]", "[oregon, texas]", "links.sites[0].between", "unknown site"),
    ("format: placer.cluster/v1", "format: placer.graph/v1", "format", "expected"),
    ("  default: {bandwidth: 1.0e9, latency: 0.001}\n", "", "links.default", "missing"),
    ("{name: b0, flops", "{flops", "devices[2].name", "missing"),
    ("site: virginia}", "site: 7}", "devices[2].site", "expected a string"),
])
def test_bad_cluster_files(tmp_path, old, new, field, words):
    assert old in GOOD
    path = write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(ClusterError) as info:
        Cluster.load(path)
    message = str(info.value)
    assert str(path) in message and field in message and words in message, message


@pytest.mark.parametrize("text, words", [
    ("devices: [", "invalid YAML"),
    ("- just\n- a list\n", "expected a mapping"),
    ("format: placer.cluster/v1\nname: x\nname: y\n", "duplicate key"),
    ("!!python/object/apply:os.system ['echo hacked']", "invalid YAML"),
])
def test_malformed_yaml(tmp_path, text, words):
    with pytest.raises(ClusterError, match=words):
        Cluster.load(write(tmp_path, text))


def test_bad_matrix_shape(tmp_path):
    text = """
format: placer.cluster/v1
devices: [{name: x, flops: 1e12, memory: 1e9}, {name: y, flops: 1e12, memory: 1e9}]
links: {bandwidth: [[1, 2]], latency: [[0, 0], [0, 0]]}
"""
    with pytest.raises(ClusterError, match="links.bandwidth: expected 2 rows"):
        Cluster.load(write(tmp_path, text))


def test_presets():
    names = Cluster.presets()
    assert {"a100x8", "two-sites"} <= set(names)
    server = Cluster.preset("a100x8")
    assert len(server) == 8 and len(server.sites()) == 1
    two = Cluster.preset("two-sites")
    assert len(two.sites()) == 2
    a, b = two.sites().values()
    assert two.link(a[0], b[0])[0] < two.link(a[0], a[1])[0]
    with pytest.raises(ClusterError, match="unknown preset"):
        Cluster.preset("nope")


def test_local_and_subset():
    local = Cluster.local()
    assert local.names[0] == "cpu" and local.device("cpu").memory > 0
    two = Cluster.preset("two-sites")
    sub = two.without(["a0"])
    assert "a0" not in sub and len(sub) == len(two) - 1
    assert sub.link("a1", "b0") == two.link("a1", "b0")
    with pytest.raises(ClusterError, match="unknown device"):
        two.without(["zz"])


def test_from_rules_api():
    c = Cluster.from_rules("r", [Device("p", 1e12, 1e9, site="s"), Device("q", 1e12, 1e9, site="t")],
                           default=(1e9, 0.0), pairs=[("p", "q", 5e8, 0.1)])
    assert c.link("q", "p") == (5e8, 0.1)

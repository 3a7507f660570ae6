import gzip
import json

import pytest

from placer import Edge, Graph, Op
from placer.errors import GraphError, PlacerError


def write(tmp_path, data, name="g.json"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def doc(**over):
    data = {"format": "placer.graph/v1", "name": "g",
            "nodes": [{"id": "a", "op": "linear", "flops": 10.0, "param_bytes": 4},
                      {"id": "b", "op": "relu", "flops": 0, "output_bytes": 8}],
            "edges": [{"src": "a", "dst": "b", "bytes": 8}]}
    data.update(over)
    return data


def test_roundtrip_keeps_everything(tmp_path, tiny_graph):
    tiny_graph.op("fc1").extra["custom"] = {"k": 1}
    tiny_graph.meta["batch"] = 8
    for name in ("g.json", "g.json.gz"):
        path = tmp_path / name
        tiny_graph.save(path)
        back = Graph.load(path)
        assert back.to_dict() == tiny_graph.to_dict()
        assert back.fingerprint() == tiny_graph.fingerprint()
    assert gzip.decompress((tmp_path / "g.json.gz").read_bytes()).startswith(b"{")


def test_defaults_and_unknown_keys(tmp_path):
    data = doc()
    data["nodes"][0]["future_field"] = [1, 2]
    data["producer"] = "someone else"
    g = Graph.load(write(tmp_path, data))
    assert g.op("a").bwd_flops == 20.0          # defaults to 2x flops
    assert g.op("a").extra == {"future_field": [1, 2]}
    assert g.meta["producer"] == "someone else"
    assert g.training
    assert Graph.load(write(tmp_path, doc(training=False))).training is False


def test_fingerprint_changes_with_costs(tiny_graph):
    before = tiny_graph.fingerprint()
    tiny_graph.op("fc1").flops += 1
    assert tiny_graph.fingerprint() != before


def test_topological_order_and_critical_path():
    ops = [Op(i, flops=f) for i, f in [("s", 1), ("a", 10), ("b", 1), ("t", 1)]]
    edges = [Edge("s", "a"), Edge("s", "b"), Edge("a", "t"), Edge("b", "t")]
    g = Graph("diamond", ops, edges)
    order = g.topological_order()
    assert order[0] == "s" and order[-1] == "t"
    path, weight = g.critical_path("flops")
    assert path == ["s", "a", "t"] and weight == 12
    path, weight = g.critical_path()  # forward + backward
    assert weight == 36
    assert g.depths() == {"s": 0, "a": 1, "b": 1, "t": 2}


def test_totals(tiny_graph):
    t = tiny_graph.totals()
    assert t["ops"] == 4 and t["edges"] == 3
    assert t["flops"] == 4e9 and t["bwd_flops"] == 8e9 and t["param_bytes"] == 8e6


@pytest.mark.parametrize("mutate, field, words", [
    (lambda d: d.update(format="placer.cluster/v1"), "format", "expected"),
    (lambda d: d.pop("nodes"), "nodes", "missing"),
    (lambda d: d["nodes"].append({"id": "a"}), "nodes[2].id", "duplicate"),
    (lambda d: d["edges"].append({"src": "a", "dst": "zz"}), "edges[1].dst", "unknown op"),
    (lambda d: d["edges"].append({"src": "b", "dst": "b"}), "edges[1]", "self-loop"),
    (lambda d: d["edges"].append({"src": "b", "dst": "a"}), "edges", "cycle"),
    (lambda d: d["nodes"][0].update(flops=-1), "nodes[0].flops", ">= 0"),
    (lambda d: d["nodes"][0].update(flops="lots"), "nodes[0].flops", "expected a number"),
    (lambda d: d["nodes"][0].update(flops=float("nan")), "nodes[0].flops", "NaN"),
    (lambda d: d["nodes"][0].update(param_bytes=float("inf")), "nodes[0].param_bytes", "infinite"),
    (lambda d: d["nodes"][0].pop("id"), "nodes[0].id", "missing"),
    (lambda d: d.update(nodes={"a": 1}), "nodes", "expected a list"),
    (lambda d: d["nodes"].__setitem__(0, 5), "nodes[0]", "expected a mapping"),
    (lambda d: d.update(training="yes"), "training", "true or false"),
])
def test_bad_graph_files_name_file_and_field(tmp_path, mutate, field, words):
    data = doc()
    mutate(data)
    text = json.dumps(data)
    path = write(tmp_path, text)
    with pytest.raises(GraphError) as info:
        Graph.load(path)
    message = str(info.value)
    assert str(path) in message and field in message and words in message
    assert "\n" not in message


@pytest.mark.parametrize("text, words", [
    ('{"format": "placer.graph/v1", "nodes": [', "invalid JSON"),
    ('{"format": "placer.graph/v1", "nodes": [], "x": NaN}', "x: holds NaN"),
    ("[1, 2]", "expected a mapping"),
    ("", "invalid JSON"),
])
def test_malformed_json(tmp_path, text, words):
    path = write(tmp_path, text)
    with pytest.raises(GraphError, match=words):
        Graph.load(path)


def test_missing_file_and_binary(tmp_path):
    with pytest.raises(GraphError, match="file not found"):
        Graph.load(tmp_path / "nope.json")
    bad = tmp_path / "bin.json"
    bad.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(GraphError, match="UTF-8"):
        Graph.load(bad)
    gz = tmp_path / "t.json.gz"
    gz.write_bytes(gzip.compress(b'{"format": "placer.graph/v1", "nodes": [')[:-6])
    with pytest.raises(PlacerError):
        Graph.load(gz)


def test_save_is_atomic(tmp_path, tiny_graph, monkeypatch):
    path = tmp_path / "g.json"
    tiny_graph.save(path)
    before = path.read_bytes()
    import placer._io as io

    def boom(*a, **k):
        raise OSError("disk full")
    monkeypatch.setattr(io.os, "replace", boom)
    with pytest.raises(OSError):
        tiny_graph.save(path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["g.json"]

"""Fuzzing the three loaders: every bad file must end in a placer error."""

import json

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placer import Cluster, Graph, Plan
from placer.errors import PlacerError

GRAPH = {"format": "placer.graph/v1", "name": "g",
         "nodes": [{"id": "a", "op": "linear", "flops": 10.0, "param_bytes": 4, "colocate": "w"},
                   {"id": "b", "op": "relu", "output_bytes": 8},
                   {"id": "c", "op": "linear", "flops": 3, "colocate": "w"}],
         "edges": [{"src": "a", "dst": "b", "bytes": 8}, {"src": "b", "dst": "c", "bytes": 8}]}
CLUSTER = {"format": "placer.cluster/v1", "name": "c",
           "devices": [{"name": "x", "flops": 1e12, "memory": 1e9, "site": "s"},
                       {"name": "y", "count": 2, "flops": 2e12, "memory": 2e9, "site": "t"}],
           "links": {"default": {"bandwidth": 1e9, "latency": 1e-3},
                     "sites": [{"between": ["s", "t"], "bandwidth": 1e8, "latency": 0.03}]}}
PLAN = {"format": "placer.plan/v1", "graph": None, "cluster": None, "method": "m",
        "placement": {"a": ["x"], "b": ["y0", "y1"], "c": ["x"]},
        "microbatches": 2, "schedule": "1f1b", "predicted": {}}

LOADERS = [(Graph, GRAPH, "g.json"), (Cluster, CLUSTER, "c.yaml"), (Plan, PLAN, "p.json")]

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12)


def paths(doc, prefix=()):
    """Every (path) into a nested document."""
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from paths(v, prefix + (i,))


def mutate(doc, path, value, action):
    doc = json.loads(json.dumps(doc))
    if not path:
        return value
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if action == "delete":
        del parent[last]
    elif action == "duplicate" and isinstance(parent, list):
        parent.append(parent[last])
    else:
        parent[last] = value
    return doc


def dump(doc, name):
    if name.endswith(".yaml"):
        return yaml.safe_dump(doc)
    return json.dumps(doc)


def load_and_check(cls, tmp_path, name, text, counter):
    path = tmp_path / name
    path.write_text(text)
    counter["cases"] = counter.get("cases", 0) + 1
    try:
        obj = cls.load(path)
    except PlacerError as exc:
        message = str(exc)
        assert "\n" not in message and message, message
        counter["rejected"] = counter.get("rejected", 0) + 1
        return
    if cls is Plan:
        # a structurally valid plan must still be validated against its graph
        try:
            obj.validate(Graph.from_dict(GRAPH), Cluster.from_dict(CLUSTER))
        except PlacerError:
            counter["rejected"] = counter.get("rejected", 0) + 1


COUNTS: dict = {}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(range(len(LOADERS))), st.data(), values,
       st.sampled_from(["replace", "delete", "duplicate"]))
def test_mutated_documents_fail_cleanly(tmp_path, which, data, value, action):
    cls, doc, name = LOADERS[which]
    path = data.draw(st.sampled_from(list(paths(doc))))
    if not path and action != "replace":
        action = "replace"
    try:
        mutated = mutate(doc, path, value, action)
        text = dump(mutated, name)
    except (TypeError, ValueError, KeyError, IndexError, yaml.YAMLError):
        return
    load_and_check(cls, tmp_path, name, text, COUNTS)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(range(len(LOADERS))), st.data())
def test_truncated_files_fail_cleanly(tmp_path, which, data):
    cls, doc, name = LOADERS[which]
    text = dump(doc, name)
    cut = data.draw(st.integers(0, len(text) - 1))
    load_and_check(cls, tmp_path, name, text[:cut], COUNTS)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(range(len(LOADERS))), st.binary(max_size=200))
def test_random_bytes_fail_cleanly(tmp_path, which, blob):
    cls, _, name = LOADERS[which]
    path = tmp_path / name
    path.write_bytes(blob)
    try:
        cls.load(path)
    except PlacerError:
        pass


def test_valid_documents_load(tmp_path):
    for cls, doc, name in LOADERS:
        path = tmp_path / name
        path.write_text(dump(doc, name))
        cls.load(path)

"""Fuzzing the three loaders and the CLI: every bad file must end in a
placer error (the CLI: exit 2 and one line naming the file), never another
exception, a hang or a partial output file."""

import contextlib
import json
import signal
import tempfile
from pathlib import Path

import pytest
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
            return
    counter["accepted"] = counter.get("accepted", 0) + 1


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
    COUNTS["cases"] = COUNTS.get("cases", 0) + 1
    try:
        cls.load(path)
    except PlacerError:
        COUNTS["rejected"] = COUNTS.get("rejected", 0) + 1
    else:
        COUNTS["accepted"] = COUNTS.get("accepted", 0) + 1


def test_valid_documents_load(tmp_path):
    for cls, doc, name in LOADERS:
        path = tmp_path / name
        path.write_text(dump(doc, name))
        cls.load(path)


# --- the CLI on broken files: exit 2, one line naming the file, no output left ------------

def _bound_plan() -> dict:
    graph, cluster = Graph.from_dict(GRAPH), Cluster.from_dict(CLUSTER)
    return Plan.from_dict(PLAN).bind(graph, cluster).to_dict()


def _other_fingerprint(key: str) -> str:
    if key == "graph":
        return Graph.from_dict({**GRAPH, "name": "other", "nodes": GRAPH["nodes"][:2],
                                "edges": GRAPH["edges"][:1]}).fingerprint()
    return Cluster.from_dict({**CLUSTER, "name": "other",
                              "links": {"default": CLUSTER["links"]["default"]}}).fingerprint()


def _broken_plan_text(kind: str) -> str:
    """A plan for GRAPH on CLUSTER broken in one of the ways users break them."""
    plan = _bound_plan()
    if kind == "missing op":
        del plan["placement"]["b"]
    elif kind == "unknown op":
        plan["placement"]["zz"] = ["x"]
    elif kind == "unknown device":
        plan["placement"]["b"] = ["nowhere"]
    elif kind == "no devices":
        plan["placement"]["b"] = []
    elif kind in ("graph", "cluster"):          # made for another graph or cluster
        plan[kind] = _other_fingerprint(kind)
    elif kind == "bad fingerprint":
        plan["graph"] = 42
    text = json.dumps(plan)
    if kind == "repeated op":                   # JSON would silently keep the last one
        text = text.replace('"b": ["y0", "y1"]', '"b": ["y0", "y1"], "b": ["x"]')
        assert text.count('"b":') == 2
    return text


PLAN_BREAKS = ["missing op", "repeated op", "unknown op", "unknown device", "no devices",
               "graph", "cluster", "bad fingerprint"]

COMMANDS = {   # command line -> the files it writes
    "show": (["show", "{target}"], []),
    "simulate": (["simulate", "{g}", "{p}", "-c", "{c}", "--trace", "{out}/t.json",
                  "--gantt", "{out}/gantt.png", "--json"], ["t.json", "gantt.png"]),
    "compare": (["compare", "{g}", "{p}", "{p}", "-c", "{c}", "--plot", "{out}/cmp.png", "--json"],
                ["cmp.png"]),
    "replan": (["replan", "{p}", "-g", "{g}", "-c", "{c}", "--without", "y1", "-m", "heft",
                "-o", "{out}/r.json", "--json"], ["r.json"]),
    "plan": (["plan", "{g}", "-c", "{c}", "-m", "heft", "-o", "{out}/plan.json", "--no-plots",
              "--json"], ["plan.json", "plan.trace.json"]),
}
CLI_COUNTS: dict = {}


class _Hang(Exception):
    pass


@contextlib.contextmanager
def _no_hang(seconds: int = 30):
    """Fail (instead of waiting forever) when a command hangs."""
    def ring(signum, frame):
        raise _Hang(f"no answer within {seconds}s")
    previous = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _broken_file(data, which: int):
    """(file index, its text): one of the three files mutated, truncated or,
    for the plan, broken like a hand-edited plan."""
    cls, doc, name = LOADERS[which]
    doc = _bound_plan() if cls is Plan else doc
    how = data.draw(st.sampled_from(["mutate", "truncate"] + (["break"] if cls is Plan else [])))
    if how == "break":
        return _broken_plan_text(data.draw(st.sampled_from(PLAN_BREAKS)))
    text = dump(doc, name)
    if how == "truncate":
        return text[:data.draw(st.integers(0, len(text) - 1))]
    path = data.draw(st.sampled_from(list(paths(doc))))
    action = data.draw(st.sampled_from(["replace", "delete", "duplicate"])) if path else "replace"
    try:
        return dump(mutate(doc, path, data.draw(values), action), name)
    except (TypeError, ValueError, KeyError, IndexError, yaml.YAMLError):
        return text[: len(text) // 2]


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(range(len(LOADERS))), st.sampled_from(sorted(COMMANDS)), st.data())
def test_cli_on_broken_files_exits_2_with_one_line(capsys, which, command, data):
    from placer.cli import main
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        files = [tmp / name for _, _, name in LOADERS]
        for (cls, doc, name), path in zip(LOADERS, files):
            path.write_text(json.dumps(_bound_plan()) if cls is Plan else dump(doc, name))
        files[which].write_text(_broken_file(data, which))
        (tmp / "out").mkdir()
        argv, outputs = COMMANDS[command]
        names = {"g": files[0], "c": files[1], "p": files[2], "target": files[which],
                 "out": tmp / "out"}
        capsys.readouterr()
        with _no_hang():
            rc = main([part.format(**names) for part in argv])
        err = capsys.readouterr().err
        CLI_COUNTS["cases"] = CLI_COUNTS.get("cases", 0) + 1
        CLI_COUNTS[f"exit {rc}"] = CLI_COUNTS.get(f"exit {rc}", 0) + 1
        assert rc in (0, 2), err
        if rc == 2:
            lines = err.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith(f"placer {command}: error: "), err
            assert any(str(f) in lines[0] for f in files), err     # names the file
            assert not list((tmp / "out").iterdir()), "output left after an error"
            assert not list(tmp.glob(".*.tmp")), "temporary file left"


@pytest.mark.parametrize("command", ["simulate", "compare", "replan"])
@pytest.mark.parametrize("kind", PLAN_BREAKS)
def test_cli_refuses_each_broken_plan(tmp_path, capsys, command, kind):
    from placer.cli import main
    files = [tmp_path / name for _, _, name in LOADERS]
    for (cls, doc, name), path in zip(LOADERS, files):
        path.write_text(_broken_plan_text(kind) if cls is Plan else dump(doc, name))
    (tmp_path / "out").mkdir()
    argv, _ = COMMANDS[command]
    names = {"g": files[0], "c": files[1], "p": files[2], "out": tmp_path / "out"}
    assert main([part.format(**names) for part in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"placer {command}: error: {files[2]}: ") and "\n" not in err, err
    assert not list((tmp_path / "out").iterdir())


def test_zz_case_counts(capsys):
    """How many cases the fuzz tests tried and how each ended (run after them)."""
    if not COUNTS or not CLI_COUNTS:
        pytest.skip("the fuzz tests did not run in this pytest run")
    with capsys.disabled():
        print(f"\nfuzz: loaders {COUNTS}; CLI {CLI_COUNTS}")
    assert COUNTS["cases"] == COUNTS["rejected"] + COUNTS.get("accepted", 0)
    assert CLI_COUNTS["cases"] == CLI_COUNTS.get("exit 0", 0) + CLI_COUNTS.get("exit 2", 0)
    assert CLI_COUNTS.get("exit 2", 0) > CLI_COUNTS["cases"] // 2

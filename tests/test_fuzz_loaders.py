"""Fuzzing every loader and the CLI: every bad file must end in a placer
error (the CLI: exit 2 and one line naming the file), never another
exception, a hang (10 s) or a blow-up of memory (1 GB) or a partial output
file. Loaders: graph, cluster and plan files (with the figures ``placer
profile`` writes into them), search checkpoints, policy checkpoints and
configs, and training configs; at least 1,000 seeded cases each."""

import contextlib
import gzip
import json
import re
import resource
import signal
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placer import Cluster, Graph, Plan
from placer.errors import PlacerError

#: peak RSS (kB) before the fuzz tests: they may not grow it by 1 GB
RSS_BEFORE = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

GRAPH = {"format": "placer.graph/v1", "name": "g",
         "nodes": [{"id": "a", "op": "linear", "flops": 10.0, "param_bytes": 4, "colocate": "w"},
                   {"id": "b", "op": "relu", "output_bytes": 8,
                    "measured": {"x": {"fwd": 1e-4, "bwd": 2e-4}, "V100": 3e-4}},
                   {"id": "c", "op": "linear", "flops": 3, "colocate": "w"}],
         "edges": [{"src": "a", "dst": "b", "bytes": 8}, {"src": "b", "dst": "c", "bytes": 8}]}
CLUSTER = {"format": "placer.cluster/v1", "name": "c",
           "devices": [{"name": "x", "flops": 1e12, "memory": 1e9, "site": "s",
                        "op_overhead": 1e-5, "cpu_share": 0.5},
                       {"name": "y", "count": 2, "flops": 2e12, "memory": 2e9, "site": "t"}],
           "links": {"default": {"bandwidth": 1e9, "latency": 1e-3},
                     "sites": [{"between": ["s", "t"], "bandwidth": 1e8, "latency": 0.03}]}}
PLAN = {"format": "placer.plan/v1", "graph": None, "cluster": None, "method": "m",
        "placement": {"a": ["x"], "b": ["y0", "y1"], "c": ["x"]},
        "microbatches": 2, "schedule": "1f1b", "predicted": {}}

LOADERS = [(Graph, GRAPH, "g.json"), (Cluster, CLUSTER, "c.yaml"), (Plan, PLAN, "p.json")]

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
                    st.sampled_from([10**400, -10**400, 2**64, 10**8, 10**9, 1e300, 1e31,
                                     "1e999", "x"]))
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


COUNTS: dict = {}
FUZZ = dict(max_examples=1000, deadline=None, derandomize=True, database=None,
            suppress_health_check=list(HealthCheck))

#: text edits no mutation of the parsed document can make
HOSTILE_NUMBERS = ["1" * 5000, "1" * 400, "1e999", "-1e999", "1e308", "NaN", "-0",
                   "18446744073709551616", "100000000", "1000000000000"]
BOMB = "\n".join(["b0: &b0 [x, x, x, x, x, x, x, x, x, x]"]
                 + [f"b{i}: &b{i} [{', '.join([f'*b{i - 1}'] * 10)}]" for i in range(1, 9)])
HOSTILE_YAML = [f"extra_stuff:\n  {BOMB.replace(chr(10), chr(10) + '  ')}\n",
                "extra_stuff: &self [*self]\n", "extra_stuff: &m {a: *m}\n",
                "extra_stuff: " + "[" * 3000 + "]" * 3000 + "\n",
                "extra_stuff: " + "[" * 80 + "]" * 80 + "\n",
                "extra_stuff: !!python/object/apply:os.system [echo]\n"]
HOSTILE_JSON = ["[" * 3000 + "]" * 3000, "[" * 80 + "]" * 80, '{"a": ' * 900 + "1" + "}" * 900]


def _case(data, doc: dict, name: str) -> bytes:
    """One hostile file made from ``doc``: mutated, truncated, random bytes,
    a number swapped for a hostile literal, a hostile value added, gzipped."""
    how = data.draw(st.sampled_from(["mutate", "mutate", "mutate", "truncate", "bytes",
                                     "number", "add", "gzip"]))
    if how == "bytes":
        return data.draw(st.binary(max_size=200))
    text = dump(doc, name)
    if how == "mutate":
        path = data.draw(st.sampled_from(list(paths(doc))))
        action = data.draw(st.sampled_from(["replace", "delete", "duplicate"])) if path \
            else "replace"
        try:
            text = dump(mutate(doc, path, data.draw(values), action), name)
        except (TypeError, ValueError, KeyError, IndexError, yaml.YAMLError):
            pass
    elif how == "truncate":
        text = text[:data.draw(st.integers(0, len(text) - 1))]
    elif how == "number":
        spots = [m.span() for m in re.finditer(r"(?<![\w.])\d[\d.e+-]*", text)]
        if spots:
            a, b = data.draw(st.sampled_from(spots))
            text = text[:a] + data.draw(st.sampled_from(HOSTILE_NUMBERS)) + text[b:]
    elif how == "add":
        if name.endswith(".yaml"):
            text = text + data.draw(st.sampled_from(HOSTILE_YAML))
        else:
            hostile = data.draw(st.sampled_from(HOSTILE_JSON))
            text = text.replace("{", '{"extra_stuff": ' + hostile + ", ", 1)
    blob = text.encode()
    return gzip.compress(blob, mtime=0) if how == "gzip" else blob


def _count(kind: str, outcome: str) -> None:
    row = COUNTS.setdefault(kind, {})
    row["cases"] = row.get("cases", 0) + 1
    row[outcome] = row.get(outcome, 0) + 1


def _one(kind: str, load) -> None:
    """Run ``load``: a placer error (one line) or success, within 10 s."""
    try:
        with _no_hang(10):
            load()
    except PlacerError as exc:
        message = str(exc)
        assert message and "\n" not in message, message
        _count(kind, "rejected")
    else:
        _count(kind, "accepted")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


def _use_graph(graph):
    """What a cost model does with a loaded graph (``measured`` times included)."""
    from placer.cost import Problem
    from placer.cost.problem import measured_times
    measured_times(Problem(graph, Cluster.from_dict(CLUSTER)))


def _use_cluster(cluster):
    from placer.cost import Problem
    from placer.cost.problem import measured_times
    measured_times(Problem(Graph.from_dict(GRAPH), cluster))


@settings(**FUZZ)
@given(data=st.data())
@pytest.mark.parametrize("kind", ["graph", "cluster", "plan"])
def test_hostile_files_fail_cleanly(folder, kind, data):
    """Graph (JSON and gzipped), cluster (YAML) and plan files: each 1,000 cases."""
    cls, doc, name = LOADERS[["graph", "cluster", "plan"].index(kind)]
    if kind == "graph" and data.draw(st.booleans()):
        name += ".gz"
    blob = _case(data, doc, name)
    if name.endswith(".gz") and blob[:2] != b"\x1f\x8b":
        blob = gzip.compress(blob, mtime=0)
    path = folder / name
    path.write_bytes(blob)

    def load():
        obj = cls.load(path)
        if cls is Plan:
            obj.validate(Graph.from_dict(GRAPH), Cluster.from_dict(CLUSTER))
        elif cls is Graph:
            _use_graph(obj)
        else:
            _use_cluster(obj)
    _one(kind, load)


@pytest.fixture(scope="module")
def checkpoint(folder):
    """A real search checkpoint of GRAPH on CLUSTER and what reading it needs."""
    import placer
    from placer.space import Space
    from placer.cost import Problem
    from placer.search.base import SearchInterrupted
    from placer.search.base import get_strategy
    path = folder / "state.json"

    def stop(event):
        if event.message == "generation 1":
            raise KeyboardInterrupt
    with pytest.raises(SearchInterrupted):
        placer.optimize(Graph.from_dict(GRAPH), Cluster.from_dict(CLUSTER), method="evolution",
                        seed=1, evaluations=400, population=8, checkpoint=path, resume=True,
                        progress=stop)
    state = json.loads(path.read_text())
    strategy = get_strategy("evolution", checkpoint=str(path), resume=True, population=8)
    problem = Problem(Graph.from_dict(GRAPH), Cluster.from_dict(CLUSTER))
    space = Space(problem, strategy.microbatch_choices(problem), strategy.schedule_choices())
    return state, space


@settings(**FUZZ)
@given(data=st.data())
def test_hostile_search_checkpoints_fail_cleanly(folder, checkpoint, data):
    from evolution.search import Evolution, _check_state
    state, space = checkpoint
    path = folder / "fuzz-state.json"
    path.write_bytes(_case(data, state, "state.json"))
    strategy = Evolution(checkpoint=str(path), resume=True)

    def load():
        loaded = strategy._load_state(state["identity"])
        _check_state(loaded, str(path), space)
    _one("search checkpoint", load)


@pytest.fixture(scope="module")
def policy(folder):
    """A small saved policy: its config (as a dict) and its stem."""
    from gnn.checkpoint import save_policy
    from gnn.model import PlacementPolicy, PolicyConfig
    stem = folder / "policy"
    save_policy(stem, PlacementPolicy(PolicyConfig(hidden=8, layers=1, heads=2, proj=4,
                                                   dyn_hidden=4)), {"train": {"iterations": 3}})
    return json.loads((folder / "policy.json").read_text()), stem


@settings(**FUZZ)
@given(data=st.data())
def test_hostile_policy_configs_fail_cleanly(folder, policy, data):
    """Policy checkpoint config (and, a tenth of the time, damaged weights)."""
    from gnn.checkpoint import load_policy
    config, stem = policy
    case = folder / "case"
    (folder / "case.json").write_bytes(_case(data, config, "case.json"))
    weights = (folder / "policy.pt").read_bytes()
    if data.draw(st.integers(0, 9)) == 0:
        weights = weights[:data.draw(st.integers(0, len(weights) - 1))]
    (folder / "case.pt").write_bytes(weights)
    _one("policy checkpoint", lambda: load_policy(case))


@settings(**FUZZ)
@given(data=st.data())
def test_hostile_training_configs_fail_cleanly(folder, data):
    """The training config a resumed run reads from the checkpoint's JSON."""
    from gnn.train import TrainConfig
    from placer._io import load_document
    from placer.errors import FormatError
    base = {"format": "placer.policy/v1", "train": TrainConfig().to_dict(), "iteration": 3}
    path = folder / "train.json"
    path.write_bytes(_case(data, base, "train.json"))

    def load():
        doc = load_document(path, FormatError)
        if not isinstance(doc, dict) or not isinstance(doc.get("train", {}), dict):
            raise FormatError("not a mapping", file=str(path))
        TrainConfig.from_dict(doc.get("train") or {}, str(path))
    _one("training config", load)


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
        if rc == 2:     # one line (after any one-line warnings about unknown keys)
            lines = [line for line in err.strip().splitlines()
                     if not line.startswith(f"placer {command}: warning: ")]
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
    """How many cases the fuzz tests tried and how each ended (run after
    them): at least 1,000 per loader, and memory never grew by 1 GB."""
    if not COUNTS or not CLI_COUNTS:
        pytest.skip("the fuzz tests did not run in this pytest run")
    with capsys.disabled():
        print(f"\nfuzz: loaders {COUNTS}; CLI {CLI_COUNTS}")
    for kind, row in COUNTS.items():
        assert row["cases"] >= 1000 and row["cases"] == row.get("rejected", 0) + \
            row.get("accepted", 0), (kind, row)
        assert row.get("rejected", 0) > row["cases"] // 4, (kind, row)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - RSS_BEFORE
    assert grown < 2**20, f"peak memory grew by {grown / 2**20:.2f} GB"
    assert CLI_COUNTS["cases"] == CLI_COUNTS.get("exit 0", 0) + CLI_COUNTS.get("exit 2", 0)
    assert CLI_COUNTS.get("exit 2", 0) > CLI_COUNTS["cases"] // 2

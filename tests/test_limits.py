"""Hostile files and careless paths, one test per case that once failed:
each ends in one line naming the file, the field and the limit (or fix),
quickly and without a large allocation; unknown keys are reported with the
nearest known key; the shipped JSON Schemas fit every shipped file."""

import gzip
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

import placer
from placer import Cluster, Graph, Plan, _io
from placer.cli import main
from placer.search.base import SearchInterrupted
from placer.errors import (ClusterError, FormatError, GraphError, PlacerError, PlanError,
                           StrategyError, UnknownKeyWarning)

ROOT = Path(__file__).resolve().parents[1]
GRAPH = {"format": "placer.graph/v1", "name": "g",
         "nodes": [{"id": "a", "flops": 1e9, "param_bytes": 1e6}, {"id": "b", "flops": 1e9}],
         "edges": [{"src": "a", "dst": "b", "bytes": 1e6}]}
CLUSTER_YAML = """format: placer.cluster/v1
name: lab
devices:
  - {name: g, count: 2, flops: 1.0e12, memory: 1.0e10, site: s}
links:
  default: {bandwidth: 1.0e9, latency: 0.001}
"""


def _one_line(exc: PlacerError, *words: str) -> str:
    text = str(exc)
    assert "\n" not in text and "Traceback" not in text, text
    for word in words:
        assert word in text, (word, text)
    return text


# --- numbers, sizes, counts -----------------------------------------------------------

def test_integer_too_large_for_a_float(tmp_path):
    path = tmp_path / "g.json"
    path.write_text(json.dumps(GRAPH).replace("1000000000.0", "1" + "0" * 400, 1))
    with pytest.raises(GraphError) as info:
        Graph.load(path)
    text = _one_line(info.value, str(path), "nodes[0].flops", "too large", "1e+30")
    assert len(text) < 300


def test_integer_longer_than_python_reads(tmp_path):
    path = tmp_path / "g.json"
    path.write_text(json.dumps(GRAPH).replace("1000000000.0", "7" * 5000, 1))
    with pytest.raises(GraphError) as info:
        Graph.load(path)
    assert len(_one_line(info.value, str(path))) < 300


@pytest.mark.parametrize("name", ["bomb.json.gz", "bomb.json"])
def test_gzip_bomb_is_refused_without_expanding(tmp_path, monkeypatch, name):
    """A small file that expands past the limit: refused after reading at most
    the limit (named .gz or not: gzip's magic bytes alone used to unzip it whole)."""
    monkeypatch.setattr(_io, "MAX_FILE_BYTES", 2**20)
    path = tmp_path / name
    path.write_bytes(gzip.compress(b" " * (64 * 2**20), mtime=0))
    assert path.stat().st_size < 100_000
    with pytest.raises(GraphError) as info:
        Graph.load(path)
    _one_line(info.value, str(path), "larger than 1 MiB")


def test_file_over_the_limit_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(_io, "MAX_FILE_BYTES", 1000)
    path = tmp_path / "g.json"
    path.write_text(json.dumps({**GRAPH, "pad": "x" * 2000}))
    with pytest.raises(GraphError) as info:
        Graph.load(path)
    _one_line(info.value, "larger than")


def test_gzip_with_several_members_reads_all(tmp_path):
    text = json.dumps(GRAPH).encode()
    path = tmp_path / "g.json.gz"
    path.write_bytes(gzip.compress(text[:20], mtime=0) + gzip.compress(text[20:], mtime=0))
    assert len(Graph.load(path)) == 2


def test_yaml_alias_bomb_under_an_unknown_key_is_refused_fast(tmp_path):
    lines = ["lol0: &l0 [x, x, x, x, x, x, x, x, x, x]"] + [
        f"  lol{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 10)]
    path = tmp_path / "c.yaml"
    path.write_text(CLUSTER_YAML + "extra:\n  " + "\n".join(lines) + "\n")
    start = time.perf_counter()
    with pytest.raises(ClusterError) as info:
        Cluster.load(path)
    assert time.perf_counter() - start < 2.0
    _one_line(info.value, str(path), "aliases are expanded", "line ")


@pytest.mark.parametrize("text", ["extra: &a [*a]\n", "extra: &m {k: *m}\n"])
def test_self_referencing_alias_is_refused(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(CLUSTER_YAML + text)
    with pytest.raises(ClusterError) as info:
        Cluster.load(path)
    _one_line(info.value, str(path), "refers to the mapping or list that holds it")


def test_shared_aliases_within_the_limit_still_load(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(CLUSTER_YAML.replace("  - {name: g, count: 2,",
                                         "  - &dev {name: g, count: 2,")
                    + "x-copy: *dev\n")
    assert len(Cluster.load(path)) == 2


@pytest.mark.parametrize("depth", [100, 5000, 100_000])
def test_deep_nesting_is_refused_fast(tmp_path, depth):
    for name, text in (("c.yaml", CLUSTER_YAML + "extra: " + "[" * depth + "]" * depth + "\n"),
                       ("g.json", json.dumps({**GRAPH, "extra": "HERE"}).replace(
                           '"HERE"', "[" * depth + "]" * depth))):
        path = tmp_path / name
        path.write_text(text)
        start = time.perf_counter()
        with pytest.raises(PlacerError) as info:
            (Cluster if name.endswith("yaml") else Graph).load(path)
        assert time.perf_counter() - start < 2.0, (name, depth)
        _one_line(info.value, str(path), "nested deeper than 64 levels")


def test_huge_device_count_is_refused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(CLUSTER_YAML.replace("count: 2", "count: 100000000"))
    with pytest.raises(ClusterError) as info:
        Cluster.load(path)
    _one_line(info.value, str(path), "devices[0].count", "100,000,000", "limit of 8,192")


def test_device_counts_add_up_to_the_limit(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(CLUSTER_YAML.replace("  - {name: g, count: 2,",
                                         "  - {name: h, count: 8000, flops: 1.0e12, "
                                         "memory: 1.0e10}\n  - {name: g, count: 500,"))
    with pytest.raises(ClusterError) as info:
        Cluster.load(path)
    _one_line(info.value, "devices[1].count", "8,000 before it")


def test_billion_microbatches_is_refused(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"format": "placer.plan/v1", "placement": {"a": ["g0"]},
                                "microbatches": 1_000_000_000}))
    with pytest.raises(PlanError) as info:
        Plan.load(path)
    _one_line(info.value, str(path), "microbatches", "limit of 65,536")


def test_too_many_ops_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(placer.graph, "MAX_OPS", 1)
    path = tmp_path / "g.json"
    path.write_text(json.dumps(GRAPH))
    with pytest.raises(GraphError) as info:
        Graph.load(path)
    _one_line(info.value, "nodes", "2 ops, over the limit of 1")


def test_malformed_measured_times_are_refused(tmp_path):
    bad = {**GRAPH, "nodes": [{**GRAPH["nodes"][0], "measured": {"g0": {"fwd": "x"}}},
                              GRAPH["nodes"][1]]}
    with pytest.raises(GraphError) as info:
        Graph.from_dict(bad, file="m.json")
    _one_line(info.value, "m.json", "nodes[0].measured.g0.fwd")


# --- unknown keys -------------------------------------------------------------------

def test_misspelt_links_key_warns_with_the_nearest_key(tmp_path):
    """The observed case: `site:` for `sites:` silently fell back to default links."""
    path = tmp_path / "c.yaml"
    path.write_text(CLUSTER_YAML + "  site:\n    - {between: [s, s], bandwidth: 1.0e11, "
                    "latency: 1.0e-6}\n")
    with pytest.warns(UnknownKeyWarning) as record:
        Cluster.load(path)
    assert [str(w.message) for w in record] == [
        f"{path}: links.site: unknown key, did you mean 'sites'?"]
    with pytest.raises(ClusterError) as info:
        Cluster.load(path, strict=True)
    _one_line(info.value, str(path), "links.site", "did you mean 'sites'?")


def test_unknown_keys_warn_once_per_key_with_a_count():
    nodes = [{"id": f"n{i}", "flpos": 1.0} for i in range(5)]
    with pytest.warns(UnknownKeyWarning) as record:
        Graph.from_dict({"format": "placer.graph/v1", "nodes": nodes}, file="g.json")
    assert [str(w.message) for w in record] == [
        "g.json: nodes[0].flpos: unknown key, did you mean 'flops'? (and 4 more like it)"]


def test_placers_own_and_user_keys_do_not_warn(tmp_path):
    data = {**GRAPH, "granularity": "op", "x-mine": {"anything": 1},
            "nodes": [{**GRAPH["nodes"][0], "module": "m", "fx": "a", "x_note": 1},
                      GRAPH["nodes"][1]]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Graph.from_dict(data, file="g.json", strict=True)
        for name in Cluster.presets():
            Cluster.preset(name)
        for path in sorted((ROOT / "datasets" / "graphs").glob("*.json.gz"))[:4]:
            Graph.load(path, strict=True)


def test_cli_strict_flag_turns_the_warning_into_an_error(tmp_path, capsys):
    (tmp_path / "g.json").write_text(json.dumps(GRAPH))
    (tmp_path / "c.yaml").write_text(CLUSTER_YAML + "  site: []\n")
    args = ["plan", str(tmp_path / "g.json"), "--cluster", str(tmp_path / "c.yaml"),
            "-m", "heft", "-o", str(tmp_path / "p.json"), "--no-plots", "--json"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert f"placer plan: warning: {tmp_path / 'c.yaml'}: links.site: unknown key, did you " \
           "mean 'sites'?" in err
    assert main(args + ["--strict"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("placer plan: error: ") and "links.site" in err and "\n" not in err
    assert main(["--strict"] + args) == 2
    capsys.readouterr()


# --- schemas ------------------------------------------------------------------------

SHIPPED = {"graph": sorted((ROOT / "datasets" / "graphs").glob("*.json.gz")),
           "cluster": sorted((ROOT / "datasets" / "clusters").glob("*.yaml")),
           "plan": [p for p in sorted((ROOT / "docs").rglob("*.json"))
                    if json.loads(p.read_text()).get("format") == "placer.plan/v1"]}


def test_schemas_ship_in_the_package_and_in_docs():
    for name in ("graph", "cluster", "plan"):
        packaged = ROOT / "placer" / "schemas" / f"{name}.v1.json"
        assert packaged.read_text() == (ROOT / "docs" / "schemas" / f"{name}.v1.json").read_text()
        data = json.loads(packaged.read_text())
        assert data["title"] == f"placer.{name}/v1" and data["additionalProperties"] is True
    assert len(SHIPPED["graph"]) >= 20 and len(SHIPPED["cluster"]) >= 10 and SHIPPED["plan"]


@pytest.mark.parametrize("name", ["graph", "cluster", "plan"])
def test_schemas_fit_every_shipped_file_and_catch_mistakes(name):
    jsonschema = pytest.importorskip("jsonschema")
    schema = _io.schema(name)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for path in SHIPPED[name]:
        errors = list(validator.iter_errors(_io.load_document(path)))
        assert not errors, (path, errors[0].message)
    doc = _io.load_document(SHIPPED[name][0])
    broken = {"graph": lambda d: d["nodes"][0].update(flops=-1.0),
              "cluster": lambda d: d["devices"][0].update(count=100_000_000),
              "plan": lambda d: d.update(microbatches=10**9)}
    broken[name](doc)
    assert list(validator.iter_errors(doc))
    doc = _io.load_document(SHIPPED[name][0])
    doc["my_own_key"] = {"kept": True}      # unknown keys are kept: the schema allows them
    assert not list(validator.iter_errors(doc))


# --- outputs ------------------------------------------------------------------------

def _files(tmp_path):
    (tmp_path / "g.json").write_text(json.dumps(GRAPH))
    (tmp_path / "c.yaml").write_text(CLUSTER_YAML)
    return tmp_path / "g.json", tmp_path / "c.yaml"


@pytest.mark.parametrize("which", ["graph", "cluster", "link"])
def test_output_equal_to_an_input_is_refused(tmp_path, capsys, which):
    graph, cluster = _files(tmp_path)
    before = graph.read_text(), cluster.read_text()
    out = {"graph": graph, "cluster": cluster, "link": tmp_path / "link.json"}[which]
    if which == "link":
        os.symlink(graph, out)
    rc = main(["plan", str(graph), "--cluster", str(cluster), "-m", "heft", "-o", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "is also an input" in err and "\n" not in err, err
    assert (graph.read_text(), cluster.read_text()) == before


@pytest.mark.parametrize("place,words", [("dir", "is a directory"),
                                         ("file/x.json", "is not a directory"),
                                         ("/proc/none/x.json", "cannot be written")])
def test_bad_output_place_is_refused_before_the_search(tmp_path, capsys, place, words):
    graph, cluster = _files(tmp_path)
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("")
    out = place if place.startswith("/") else str(tmp_path / place)
    start = time.perf_counter()
    rc = main(["plan", str(graph), "--cluster", str(cluster), "-m", "evolution",
               "--time-budget", "60", "-o", out])
    assert time.perf_counter() - start < 10      # no 60 s search first
    err = capsys.readouterr().err.strip()
    assert rc == 2 and words in err and "--output" in err and "\n" not in err, err


def test_existing_output_is_replaced_atomically_and_help_says_so(tmp_path, capsys):
    graph, cluster = _files(tmp_path)
    out = tmp_path / "p.json"
    out.write_text("old")
    assert main(["plan", str(graph), "--cluster", str(cluster), "-m", "heft", "-o", str(out),
                 "--no-plots", "--json"]) == 0
    assert Plan.load(out).method == "heft"
    assert not list(tmp_path.glob(".*.tmp"))
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    assert "replaced atomically" in " ".join(capsys.readouterr().out.split())


def test_closed_pipe_ends_quietly(tmp_path):
    graph, _ = _files(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    code = ("import sys, runpy; sys.argv = ['placer', 'show', sys.argv[1]]; "
            "from placer.cli import main; sys.exit(main())")
    reader = subprocess.Popen([sys.executable, "-c", code, str(graph)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=env)
    reader.stdout.close()      # like `| head -0`: the reader is gone before any output
    err = reader.stderr.read().decode()
    reader.wait(timeout=60)
    assert err == "" and reader.returncode == 141, err


def test_check_outputs_refuses_the_same_output_twice(tmp_path):
    with pytest.raises(PlacerError, match="also written as --trace"):
        _io.check_outputs([("--trace", tmp_path / "a.json"), ("--gantt", tmp_path / "a.json")])


# --- checkpoints and configs ------------------------------------------------------------

SEARCH = dict(method="evolution", seed=1, evaluations=300, population=8)


@pytest.mark.parametrize("field,change", [
    ("population", None), ("rng", {"bit_generator": "PCG64"}), ("cache", [["zz", 1.0]]),
    ("groups", [[0, 99]]), ("seeds", [{"assign": [0], "m": 1, "s": "1f1b", "o": "", "f": 1}]),
    ("used", "many"), ("logbook", [{"not a name": 1}])])
def test_damaged_search_checkpoint_is_one_line(tmp_path, field, change):
    graph = Graph.from_dict(GRAPH)
    cluster = Cluster.from_dict(_io.parse_yaml(CLUSTER_YAML, None))
    state = tmp_path / "state.json"

    def stop(event):
        if event.message == "generation 1":
            raise KeyboardInterrupt
    with pytest.raises(SearchInterrupted):
        placer.optimize(graph, cluster, checkpoint=state, progress=stop, **SEARCH)
    data = json.loads(state.read_text())
    if change is None:
        del data[field]
    else:
        data[field] = change
    state.write_text(json.dumps(data))
    with pytest.raises(StrategyError) as info:
        placer.optimize(graph, cluster, checkpoint=state, resume=True, **SEARCH)
    _one_line(info.value, str(state), field)


@pytest.mark.parametrize("key,value,words", [
    ("hidden", "x", "expected a number"), ("hidden", -4, "must be > 0"),
    ("hidden", 300_000, "limit of 4,096"), ("layers", 10_000_000, "limit of 64"),
    ("heads", 3, "must divide hidden"), ("hidden", 4096, "over the limit of 4,194,304")])
def test_bad_policy_config_is_one_line(tmp_path, key, value, words):
    from gnn.checkpoint import load_policy, save_policy
    from gnn.model import PlacementPolicy, PolicyConfig
    stem = tmp_path / "p"
    save_policy(stem, PlacementPolicy(PolicyConfig(hidden=8, layers=1, proj=4, dyn_hidden=4)))
    config = json.loads((tmp_path / "p.json").read_text())
    config["policy"][key] = value
    (tmp_path / "p.json").write_text(json.dumps(config))
    start = time.perf_counter()
    with pytest.raises(FormatError) as info:
        load_policy(stem)
    assert time.perf_counter() - start < 5
    _one_line(info.value, str(tmp_path / "p.json"), f"policy.{key}", words)


@pytest.mark.parametrize("damage", ["missing", "corrupt", "bad value"])
def test_train_resume_of_a_missing_or_corrupt_file_is_one_line(tmp_path, capsys, damage):
    stem = tmp_path / "run"
    if damage == "corrupt":
        (tmp_path / "run.json").write_text("{not json")
    elif damage == "bad value":
        (tmp_path / "run.json").write_text(json.dumps(
            {"format": "placer.policy/v1", "train": {"iterations": "x"}, "iteration": 1}))
    rc = main(["train", "--resume", "-o", str(stem), "--iterations", "1"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and str(tmp_path / "run.json") in err, err

"""Safety: files placer reads are data, never code.

An audit of the source tree (``ast``) for loaders that can run code, and
behavioural checks that graph, cluster, plan and checkpoint files naming
modules, or tagged as Python objects, import and execute nothing.
"""

import ast
import json
import sys
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("placer", "gnn", "evolution", "train_policy.py", "scripts", "examples")

#: calls that run code from data whatever their arguments
FORBIDDEN = {
    "pickle.load", "pickle.loads", "pickle.Unpickler", "_pickle.load", "_pickle.loads",
    "cPickle.load", "cPickle.loads", "dill.load", "dill.loads", "cloudpickle.load",
    "cloudpickle.loads", "joblib.load", "marshal.load", "marshal.loads", "shelve.open",
    "pandas.read_pickle", "jsonpickle.decode", "yaml.unsafe_load", "yaml.unsafe_load_all",
    "yaml.full_load", "yaml.full_load_all", "eval", "exec", "os.system", "os.popen",
    "runpy.run_path", "runpy.run_module", "importlib.util.spec_from_file_location",
    "importlib.machinery.SourceFileLoader",
}
SAFE_YAML_LOADERS = {"yaml.SafeLoader", "yaml.CSafeLoader", "yaml.BaseLoader",
                     "yaml.CBaseLoader"}
IMPORTERS = {"importlib.import_module", "__import__", "importlib.__import__"}

#: (file, function) that import a module whose name is not a literal, and why
#: that name never comes from a graph, cluster or plan file
DYNAMIC_IMPORTS = {
    # MODULE:FACTORY is the user's own model, given on the command line (the
    # MODEL/GRAPH argument of `placer trace/plan/...`, --model of `placer
    # run/launch`); importing it is the point. Nothing read from a file
    # reaches it: graph files are recognised by name and loaded as data first.
    ("placer/loaders.py", "load_factory"),
    # subcommand table _DELEGATE_TARGETS: constants in the source
    ("placer/cli.py", "_delegate"),
    # lazy attributes of the package: the constant table _LAZY
    ("placer/__init__.py", "__getattr__"),
    # strategies: the constant LAZY table and installed packages' entry points
    ("placer/search/base.py", "strategy_class"),
}


def _python_files():
    for name in SCANNED:
        path = ROOT / name
        if path.is_file():
            yield path
        elif path.is_dir():
            yield from sorted(p for p in path.rglob("*.py") if ".venv" not in p.parts)


class _Audit(ast.NodeVisitor):
    """Findings ``(line, function, message)`` of one module's source."""

    def __init__(self):
        self.aliases: dict[str, str] = {}
        self.safe_classes: set[str] = set()
        self.function = "<module>"
        self.findings: list[tuple[int, str, str]] = []

    # --- names ------------------------------------------------------------------
    def visit_Import(self, node):
        for a in node.names:
            self.aliases[a.asname or a.name.split(".")[0]] = a.asname and a.name or \
                a.name.split(".")[0]

    def visit_ImportFrom(self, node):
        for a in node.names:
            self.aliases[a.asname or a.name] = f"{node.module or ''}.{a.name}"

    def dotted(self, node) -> str | None:
        """``a.b.c`` of a Name/Attribute chain, its head resolved through imports."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        parts.append(self.aliases.get(node.id, node.id))
        return ".".join(reversed(parts))

    def visit_ClassDef(self, node):
        if any(self.dotted(b) in SAFE_YAML_LOADERS | self.safe_classes for b in node.bases):
            self.safe_classes.add(node.name)
        self._inside(node)

    def visit_FunctionDef(self, node):
        self._inside(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def _inside(self, node):
        outer, self.function = self.function, node.name
        self.generic_visit(node)
        self.function = outer

    # --- calls --------------------------------------------------------------------
    def visit_Call(self, node):
        name = self.dotted(node.func)
        if name is not None:
            problem = self.check(name, node)
            if problem:
                self.findings.append((node.lineno, self.function, problem))
        self.generic_visit(node)

    def check(self, name: str, node: ast.Call) -> str | None:
        kw = {k.arg: k.value for k in node.keywords}
        if name in FORBIDDEN:
            return f"{name}() can run code from data"
        if name in ("yaml.load", "yaml.load_all"):
            loader = kw.get("Loader", node.args[1] if len(node.args) > 1 else None)
            if self.dotted(loader) not in SAFE_YAML_LOADERS | self.safe_classes:
                return f"{name}() without a safe Loader"
        if name == "torch.load":
            flag = kw.get("weights_only")
            if not (isinstance(flag, ast.Constant) and flag.value is True):
                return "torch.load() without weights_only=True"
        if name in ("numpy.load", "np.load"):
            flag = kw.get("allow_pickle")
            if flag is not None and not (isinstance(flag, ast.Constant) and flag.value is False):
                return f"{name}() with allow_pickle"
        if name in IMPORTERS:
            arg = node.args[0] if node.args else kw.get("name")
            if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
                return f"dynamic {name}()"
        return None


def audit(source: str) -> list[tuple[int, str, str]]:
    """What :class:`_Audit` finds in ``source``."""
    visitor = _Audit()
    visitor.visit(ast.parse(source))
    return visitor.findings


def _tree_findings():
    out = []
    for path in _python_files():
        rel = path.relative_to(ROOT).as_posix()
        for line, function, problem in audit(path.read_text(encoding="utf-8")):
            out.append((rel, line, function, problem))
    return out


def test_source_tree_loads_no_code_from_data():
    findings = _tree_findings()
    allowed = [f for f in findings
               if f[3].startswith("dynamic ") and (f[0], f[2]) in DYNAMIC_IMPORTS]
    bad = [f"{rel}:{line} in {fn}: {problem}" for rel, line, fn, problem in findings
           if (rel, line, fn, problem) not in allowed]
    assert not bad, "\n".join(bad)
    # every exception still exists (a stale entry would hide a new call there)
    assert {(f[0], f[2]) for f in allowed} == DYNAMIC_IMPORTS
    assert len(list(_python_files())) > 50       # the scan saw the tree


@pytest.mark.parametrize("source", [
    "import yaml\nyaml.load(text)",
    "import yaml\nyaml.load(text, Loader=yaml.Loader)",
    "import yaml\nyaml.load(text, yaml.UnsafeLoader)",
    "from yaml import load, FullLoader\nload(text, Loader=FullLoader)",
    "import yaml\nclass L(yaml.FullLoader): pass\nyaml.load(text, Loader=L)",
    "import yaml as y\ny.unsafe_load(text)",
    "import yaml\nyaml.full_load(text)",
    "import pickle\npickle.loads(blob)",
    "from pickle import load as l\nl(handle)",
    "import torch\ntorch.load(path)",
    "import torch\ntorch.load(path, weights_only=False)",
    "import torch as t\nt.load(path, weights_only=flag)",
    "import numpy as np\nnp.load(path, allow_pickle=True)",
    "eval(text)",
    "exec(compile(text, 'f', 'exec'))",
    "import importlib\nimportlib.import_module(plan['module'])",
    "from importlib import import_module\nimport_module(name)",
    "__import__(name)",
    "import os\nos.system(cmd)",
])
def test_audit_catches(source):
    assert audit(source), source


@pytest.mark.parametrize("source", [
    "import yaml\nyaml.load(text, Loader=yaml.SafeLoader)",
    "import yaml\nclass L(yaml.SafeLoader): pass\nclass M(L): pass\nyaml.load(t, Loader=M)",
    "import yaml\nyaml.safe_load(text)",
    "import torch\ntorch.load(path, map_location='cpu', weights_only=True)",
    "import importlib\nimportlib.import_module('placer.trace')",
    "policy.eval()",
    "import re\nre.compile('a')",
])
def test_audit_passes(source):
    assert not audit(source), source


def test_shipped_yaml_loader_is_a_safe_loader():
    from placer import _io
    assert issubclass(_io._SafeLoader, yaml.SafeLoader)
    assert not issubclass(_io._SafeLoader, (yaml.FullLoader, yaml.UnsafeLoader))


# --- behaviour: module-like strings and Python tags in user files ----------------------

SENTINEL = "placer_safety_sentinel"


@pytest.fixture
def sentinel(tmp_path, monkeypatch):
    """A module that leaves a file if it is ever imported or its function run,
    importable from the working directory; yields the check."""
    (tmp_path / f"{SENTINEL}.py").write_text(
        "import pathlib\npathlib.Path(__file__).with_name('IMPORTED').write_text('x')\n"
        "def boom(*args):\n    pathlib.Path(__file__).with_name('RAN').write_text('x')\n"
        "    return 0\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)

    def untouched():
        assert not (tmp_path / "IMPORTED").exists() and not (tmp_path / "RAN").exists()
        assert SENTINEL not in sys.modules
        new = {m for m in set(sys.modules) - before
               if not m.startswith(("placer", "gnn", "evolution"))}
        assert not {m for m in new if m.split(".")[0] in ("os", "subprocess", SENTINEL)}
    yield untouched
    untouched()


EVIL = f"{SENTINEL}:boom"


def _graph_doc():
    return {"format": "placer.graph/v1", "name": EVIL, "meta": {"model": EVIL, "factory": "os:system"},
            "nodes": [{"id": EVIL, "op": "os:system", "flops": 10.0, "param_bytes": 4,
                       "output_bytes": 8, "module": EVIL},
                      {"id": "os:system", "op": f"{SENTINEL}.boom", "flops": 5, "output_bytes": 8,
                       "colocate": EVIL}],
            "edges": [{"src": EVIL, "dst": "os:system", "bytes": 8}]}


def _cluster_doc():
    return {"format": "placer.cluster/v1", "name": EVIL,
            "devices": [{"name": EVIL, "flops": 1e12, "memory": 1e9, "site": "os:system",
                         "kind": f"{SENTINEL}.boom"},
                        {"name": "os:system", "flops": 2e12, "memory": 2e9, "site": EVIL}],
            "links": {"default": {"bandwidth": 1e9, "latency": 1e-3}}}


def _files(tmp_path):
    """Graph, cluster and a plan of them whose every name looks like code."""
    from placer import Cluster, Graph, Plan
    g, c = tmp_path / "g.json", tmp_path / "c.yaml"
    g.write_text(json.dumps(_graph_doc()))
    c.write_text(yaml.safe_dump(_cluster_doc()))
    graph, cluster = Graph.load(g), Cluster.load(c)
    plan = Plan({EVIL: [EVIL], "os:system": ["os:system"]}, microbatches=1, schedule="1f1b",
                method=EVIL).bind(graph, cluster)
    data = plan.to_dict()
    data.update(module=EVIL, loader="!!python/object/apply:os.system")   # kept as extras
    p = tmp_path / "p.json"
    p.write_text(json.dumps(data))
    return g, c, p


def test_module_like_strings_are_only_data(tmp_path, sentinel):
    import placer
    from placer import Cluster, Graph, Plan
    g, c, p = _files(tmp_path)
    graph, cluster, plan = Graph.load(g), Cluster.load(c), Plan.load(p)
    assert graph.name == EVIL and EVIL in graph and cluster.name == EVIL
    plan.validate(graph, cluster)
    assert placer.simulate(graph, cluster, plan).step_time > 0
    sentinel()


@pytest.mark.parametrize("command", [
    ["show", "{g}"], ["show", "{c}"], ["show", "{p}"],
    ["simulate", "{g}", "{p}", "-c", "{c}", "--json"],
    ["compare", "{g}", "{p}", "{p}", "-c", "{c}", "--json"],
    ["replan", "{p}", "-g", "{g}", "-c", "{c}", "--without", "os:system", "-m", "heft",
     "-o", "{tmp}/r.json", "--json"],
])
def test_cli_reads_module_like_strings_as_data(tmp_path, sentinel, capsys, command):
    from placer.cli import main
    g, c, p = _files(tmp_path)
    names = {"g": g, "c": c, "p": p, "tmp": tmp_path}
    rc = main([part.format(**names) for part in command])
    err = capsys.readouterr().err
    assert rc == 0, err            # names are names: the command works on them
    sentinel()


PYTHON_TAGS = [
    f"!!python/object/apply:{SENTINEL}.boom []",
    "!!python/object/apply:os.system ['touch RAN']",
    f"!!python/name:{SENTINEL}.boom",
    f"!!python/module:{SENTINEL}",
    f"!!python/object/new:{SENTINEL}.boom []",
    "!!python/tuple [1, 2]",
]


@pytest.mark.parametrize("tag", PYTHON_TAGS)
@pytest.mark.parametrize("kind", ["graph", "cluster", "plan"])
def test_python_yaml_tags_are_refused(tmp_path, sentinel, tag, kind):
    from placer import Cluster, Graph, Plan
    from placer.errors import PlacerError
    docs = {"graph": (Graph, _graph_doc(), "name"), "cluster": (Cluster, _cluster_doc(), "name"),
            "plan": (Plan, {"format": "placer.plan/v1", "placement": {"a": ["x"]}}, "method")}
    cls, doc, key = docs[kind]
    text = yaml.safe_dump({k: v for k, v in doc.items() if k != key})
    path = tmp_path / f"{kind}.yaml"
    path.write_text(f"{key}: {tag}\n{text}")
    with pytest.raises(PlacerError, match=r"invalid YAML: could not determine a constructor"):
        cls.load(path)
    sentinel()


def test_pickled_object_in_a_checkpoint_is_refused(tmp_path, sentinel):
    from gnn.checkpoint import load_policy, save_policy
    from gnn.model import PlacementPolicy, PolicyConfig
    from gnn.train import Trainer, TrainConfig
    from placer.errors import FormatError

    class Payload:                 # unpickling it would call the sentinel's boom()
        def __reduce__(self):
            return (sys.modules[SENTINEL].boom, ())
    save_policy(tmp_path / "p", PlacementPolicy(PolicyConfig(hidden=8, layers=1)))
    trainer = Trainer(TrainConfig(graphs=["layered-n80-w6-s1"], clusters=["a100x8"],
                                  policy={"hidden": 8, "layers": 1}))
    trainer.save(tmp_path / "t")
    state = torch.load(tmp_path / "p.pt", weights_only=True)
    __import__(SENTINEL)           # pickling needs it; forgotten before loading
    torch.save({**state, "extra": Payload()}, tmp_path / "p.pt")
    torch.save({"optimizer": Payload(), "iteration": 0}, tmp_path / "t.train.pt")
    sys.modules.pop(SENTINEL)
    (tmp_path / "IMPORTED").unlink()

    with pytest.raises(FormatError, match=rf"p\.pt: holds pickled Python objects "
                                          rf"\({SENTINEL}\.boom\), not only tensors: refused"):
        load_policy(tmp_path / "p")
    with pytest.raises(FormatError, match="holds pickled Python objects"):
        Trainer.resume(tmp_path / "t")
    sentinel()

"""placer.executors: the local pool and Ray give the same plans.

The Ray tests start real Ray instances: one started by ``ray.init`` in this
process, and a two-node cluster (``ray start --head`` plus ``ray start
--address``, one CPU each) torn down afterwards, whatever happens.
"""

from __future__ import annotations

import faulthandler
import sys
from pathlib import Path

import numpy as np
import pytest

import placer
from placer.cli import main
from placer.executors import check_backend, make_executor, run_all, worker_identity


def _square(x):
    return x * x


def _plan(method: str, **options):
    """A deterministic search (an evaluation budget) on a small problem."""
    g = placer.datasets.layered(40, width=4, seed=0)
    c = placer.Cluster.preset("two-sites")
    plan = placer.optimize(g, c, method, seed=5, time_budget=None, evaluations=240,
                           **options)
    return plan.placement, plan.microbatches, plan.schedule, plan.predicted["step_time"]


# --- without Ray --------------------------------------------------------------------

def test_unknown_backend_is_one_line(capsys):
    with pytest.raises(placer.PlacerError, match="unknown backend 'spark'"):
        check_backend("spark")
    assert main(["plan", "layered-n60-w4-s0", "-c", "two-sites", "--backend", "spark",
                 "-o", "never.json"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--backend" in err and "ray://HOST:PORT" in err


def test_ray_missing_names_the_extra(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)       # import ray -> ImportError
    out = str(tmp_path / "p.json")
    assert main(["plan", "layered-n60-w4-s0", "-c", "two-sites", "--backend", "ray",
                 "-o", out]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("placer plan: error: --backend: the ray backend needs Ray, which is not "
                   "installed (fix: pip install 'placer[ray]')")
    assert main(["bench", "search", "--quick", "--backend", "ray://head:10001",
                 "-o", out]) == 2
    assert "pip install 'placer[ray]'" in capsys.readouterr().err
    with pytest.raises(placer.PlacerError, match=r"placer\[ray\]"):
        placer.optimize(placer.datasets.layered(20, width=2, seed=0),
                        placer.Cluster.preset("two-sites"), "dtfm", backend="auto")
    assert not Path(out).exists()


def test_backend_asked_of_a_method_that_runs_in_one_process(capsys):
    assert main(["plan", "layered-n60-w4-s0", "-c", "two-sites", "--method", "heft",
                 "--workers", "2", "-o", "never.json"]) == 2
    assert "heft runs in one process" in capsys.readouterr().err


def test_run_all_keeps_the_order_on_processes():
    assert run_all(_square, range(7), workers=3) == [x * x for x in range(7)]
    assert run_all(_square, range(3)) == [0, 1, 4]


@pytest.mark.parametrize("method", ["evolution", "dtfm"])
def test_local_pool_gives_the_in_process_plan(method):
    assert _plan(method, workers=2) == _plan(method, workers=0)


# --- Ray ----------------------------------------------------------------------------

@pytest.fixture
def local_ray():
    """Ray started in this process (``ray.init``), one CPU."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False,
             logging_level="WARNING")
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture
def ray_cluster(monkeypatch):
    """A head and a second node (``ray start``, one CPU each) on this machine;
    yields the head's address, stops both whatever happens."""
    ray = pytest.importorskip("ray")
    from placer.bench.raycluster import local_cluster
    if ray.is_initialized():
        ray.shutdown()
    with local_cluster(nodes=2, cpus=1) as address:
        monkeypatch.setenv("RAY_ADDRESS", address)
        yield address


def test_ray_in_process_gives_the_local_plan(local_ray):
    """The fast variant: evolution and dtfm on one Ray worker find the
    in-process plan; a local pool forked from a process holding a Ray
    connection does not hang (it uses forkserver)."""
    faulthandler.dump_traceback_later(240, exit=True)   # a hang fails, not blocks CI
    try:
        assert run_all(_square, range(5), workers=2) == [0, 1, 4, 9, 16]
        # Ray's workers import functions by name: a library's, not this file's
        assert run_all(abs, [-3, 2, -1], backend="ray") == [3, 2, 1]
        for method in ("evolution", "dtfm"):
            assert _plan(method, backend="ray", workers=1) == _plan(method, workers=0)
    finally:
        faulthandler.cancel_dump_traceback_later()


def test_ray_in_process_coarse_path_gives_the_local_plan(local_ray):
    """The coarse path's rankings and refinement on one Ray worker."""
    faulthandler.dump_traceback_later(240, exit=True)
    try:
        assert _coarse_plan(backend="ray", workers=1) == _coarse_plan(workers=0)
    finally:
        faulthandler.cancel_dump_traceback_later()


@pytest.mark.slow
def test_two_node_ray_cluster_gives_the_local_plan(ray_cluster):
    """A real two-node cluster: work lands on both nodes, and evolution and
    dtfm find the local pool's plan (assignment and score) on one Ray
    worker and on two."""
    faulthandler.dump_traceback_later(240, exit=True)   # a hang fails, not blocks CI
    try:
        _on_the_cluster()
    finally:
        faulthandler.cancel_dump_traceback_later()


def _on_the_cluster():
    expected = {m: _plan(m, workers=2) for m in ("evolution", "dtfm")}
    from placer.executors import connect
    ray = connect("auto")
    assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    with make_executor("auto", 2) as ex:
        nodes = {ex.submit(worker_identity).result(timeout=60)["node"] for _ in range(4)}
    assert len(nodes) == 2 and None not in nodes
    for method, plan in expected.items():
        assert _plan(method, backend="auto", workers=1) == plan
        assert _plan(method, backend="auto", workers=2) == plan
    assert _coarse_plan(backend="auto", workers=2) == _coarse_plan(workers=0)
    # the evaluator really scores on the cluster, in order
    from placer.search.evaluate import Evaluator
    from placer.space import LayoutGenome, Space, mutate
    from placer.cost import Problem, get_cost_model
    problem = Problem(placer.datasets.layered(40, width=4, seed=0),
                      placer.Cluster.preset("two-sites"))
    space = Space(problem, [1, 2], ["1f1b"])
    rng = np.random.default_rng(0)
    base = LayoutGenome.balanced(space, [(0,), (1,), (2,)], 2).decode(space)
    genomes = [mutate(space, base.copy(), rng, rate=3) for _ in range(24)]
    model = get_cost_model("analytical")
    with Evaluator(space, model, workers=0) as ev:
        here = ev(genomes)
    with Evaluator(space, model, workers=2, backend="auto", chunk=5) as ev:
        there = ev(genomes)
        assert type(ev._pool).__name__ == "RayExecutor"
    np.testing.assert_array_equal(here, there)


# --- one problem's work on workers (placer.search.parallel) ---------------------------

def _coarse_plan(**options):
    """Evolution through the coarse path (an evaluation budget)."""
    g = placer.datasets.graph("layered-n300-w8-s1")
    plan = placer.optimize(g, placer.Cluster.preset("two-sites"), "evolution", seed=3,
                           time_budget=None, evaluations=300, coarsen=40, **options)
    coarsened = dict(plan.extra["search"]["coarsened"])
    del coarsened["seconds"]            # the coarsening's wall time
    return (plan.placement, plan.microbatches, plan.schedule, plan.predicted["step_time"],
            coarsened)


def _counting(monkeypatch) -> list:
    """Names of the functions sent to a ProblemPool's workers, as they go."""
    from placer.search import parallel
    sent: list = []
    submit = parallel.ProblemPool.submit

    def counted(self, fn, *args):
        sent.append(fn.__name__)
        return submit(self, fn, *args)
    monkeypatch.setattr(parallel.ProblemPool, "submit", counted)
    return sent


def test_refine_on_a_pool_makes_the_in_process_moves(monkeypatch):
    from placer.cost import Problem, get_cost_model
    from placer.search.base import Budget
    from placer.search.parallel import ProblemPool
    from placer.search.refine import refine
    g = placer.datasets.graph("layered-n300-w8-s1")
    c = placer.Cluster.preset("two-sites")
    problem = Problem(g, c)
    start = placer.optimize(g, c, "m_topo", coarsen=None, time_budget=None)

    def run(pool):
        budget = Budget(None, 200)
        metered = budget.meter(get_cost_model("analytical"))
        plan, value, kept, first = refine(problem, start, metered, budget, pool=pool)
        best = metered.best_for(problem)[1].objective
        return plan.placement, value, kept, first, budget.used, best

    here = run(None)
    sent = _counting(monkeypatch)
    with ProblemPool(problem, "local", 2) as pool:
        assert run(pool) == here
    assert here[2] >= 3 and here[1] < here[3]           # moves were kept
    assert sent.count("step_times_held") > 2 * here[2]  # the batches went to the pool


def test_coarsened_search_on_a_pool_gives_the_in_process_plan(monkeypatch):
    """The coarse path forced: the finalists' and the starts' rankings and
    the refinement's batches on 2 workers give the in-process plan."""
    here = _coarse_plan(workers=0)
    sent = _counting(monkeypatch)
    assert _coarse_plan(workers=2) == here
    assert here[4]["ranked_by"] == "simulator"          # the starts' ranking decided
    assert sent.count("estimate_held") >= 8 and "step_times_held" in sent
    assert sent.count("seed_held") == 3                 # heft, pipeline_dp, even_pipeline


def test_rank_on_a_pool_under_a_time_limit():
    from placer.cost import Problem, get_cost_model
    from placer.search.base import Budget
    from placer.search.common import rank
    from placer.search.parallel import ProblemPool
    g = placer.datasets.graph("layered-n300-w8-s1")
    c = placer.Cluster.preset("two-sites")
    problem = Problem(g, c)
    plans = [placer.optimize(g, c, m, coarsen=None, time_budget=None)
             for m in ("m_topo", "even_pipeline", "heft")]
    sim = get_cost_model("simulator")
    best = int(np.argmin([sim.estimate(problem, p).objective for p in plans]))
    with ProblemPool(problem, "local", 2) as pool:
        for budget in (Budget(None, None), Budget(60.0, None)):
            metered = budget.meter(sim)
            assert rank(metered, problem, plans, budget, pool=pool) == best
            assert budget.used == len(plans)
            assert metered.best_for(problem)[1].objective == min(
                sim.estimate(problem, p).objective for p in plans)
        spent = Budget(1e-9, None)      # no time left: the first plan, unscored
        assert rank(spent.meter(sim), problem, plans, spent, pool=pool) == 0


@pytest.mark.slow
def test_ray_client_gives_the_local_plan(monkeypatch):
    """``ray://HOST:PORT``: a head started with a Ray Client server port; an
    evolution search through it finds the local pool's plan."""
    ray = pytest.importorskip("ray")
    pytest.importorskip("grpc", reason="Ray Client needs grpcio (placer[ray])")
    from placer.bench.raycluster import free_port, local_cluster
    if ray.is_initialized():
        ray.shutdown()
    expected = _plan("evolution", workers=2)
    port = free_port()
    faulthandler.dump_traceback_later(240, exit=True)   # a hang fails, not blocks CI
    try:
        with local_cluster(nodes=1, cpus=2,
                           head_args=("--ray-client-server-port", str(port))):
            monkeypatch.delenv("RAY_ADDRESS", raising=False)
            assert _plan("evolution", backend=f"ray://127.0.0.1:{port}", workers=2) \
                == expected
    finally:
        faulthandler.cancel_dump_traceback_later()

"""The plan space (``placer.space``) stands on its own below evolution and
the policy, and the modules it came from still import."""
import subprocess
import sys
from pathlib import Path

import numpy as np

import placer
import placer.space as space

ROOT = Path(__file__).resolve().parent.parent


def _fresh(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_plan_space_loads_no_search():
    loaded = _fresh("import sys, placer.space\n"
                    "print(sorted(m for m in sys.modules if m.split('.')[0] in "
                    "('evolution', 'gnn') or m.startswith('placer.search')))")
    assert loaded.strip() == "[]"


def test_the_old_homes_name_the_same_modules():
    import evolution
    import evolution.evaluate
    import evolution.genome
    import evolution.memetic
    import evolution.operators
    from placer.search import evaluate
    assert evolution.genome is space.genome and evolution.genome.OpGenome is space.OpGenome
    assert evolution.operators is space.moves and evolution.operators.mutate is space.mutate
    assert evolution.memetic is space.local and evolution.memetic.local_search is space.local_search
    assert evolution.evaluate is evaluate
    assert evolution.OpGenome is space.OpGenome


def test_a_descent_through_the_space_by_hand():
    """local_search with a scorer counting data-parallel groups: it walks to
    the plan with the fewest, and every neighbour it was shown was repaired."""
    graph = placer.datasets.layered(12, width=2, seed=0)
    problem = placer.cost.Problem(graph, placer.Cluster.preset("two-sites"))
    sp = space.Space(problem)
    rng = np.random.default_rng(0)
    start = space.OpGenome(sp.repair(np.arange(sp.n_ops, dtype=np.int64) % sp.n_devices))
    seen = []

    def score(genomes):
        seen.extend(genomes)
        return np.array([len(np.unique(g.assign)) for g in genomes], dtype=float)
    score.budget = None
    best, value = space.local_search(sp, score, start, float(len(np.unique(start.assign))), rng,
                                     rounds=200)
    assert value == len(np.unique(best.assign)) < len(np.unique(start.assign))
    assert all(np.array_equal(g.assign, sp.repair(g.assign)) for g in seen)
    # a local optimum: no neighbour uses fewer groups
    assert min(score(space.neighbourhood(sp, best, rng, limit=10 ** 6))) >= value

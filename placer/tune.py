"""``placer tune``: tune the evolutionary search's own hyperparameters.

An Optuna study (TPE) proposes a configuration of :class:`evolution.Evolution`
(population, offspring, tournament size, crossover probability, mutation
rate, memetic period and rounds, patience); each trial runs the search on
every benchmark case with a fixed evaluation budget and scores the mean, over
cases, of the plan's step time divided by the best heuristic's on that case
(lower is better; below 1 beats the heuristics). The best configuration so
far is written, atomically, to a JSON file after each trial.

The study lives in an RDB storage so it resumes where it stopped and so
several workers share it: SQLite by default (``sqlite:///placer-tune.db``),
or any SQLAlchemy URL such as ``postgresql://user@host/db`` once one machine
is not enough. Start the same command on several machines (or several
times on one) with the same ``--storage`` and ``--study`` and they split
the trials.

>>> parser = build_parser()
>>> parser.parse_args(["--trials", "3"]).trials
3
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from ._io import atomic_write_text
from .errors import PlacerError, StrategyError

#: default benchmark cases, ``GRAPH@CLUSTER`` (small, so a trial is quick)
DEFAULT_CASES = ("gpt-125m.module@hetero-lab", "layered-n80-w4-s0@two-sites",
                 "series_parallel-n60-s1@edge-wireless")
DEFAULT_STORAGE = "sqlite:///placer-tune.db"
DEFAULT_STUDY = "placer-evolution"
HEURISTICS = ("even_pipeline", "heft", "m_sct", "pipeline_dp")


def search_space(trial) -> dict:
    """The evolutionary search's hyperparameters proposed by ``trial``."""
    return {
        "population": trial.suggest_int("population", 8, 96, log=True),
        "offspring": trial.suggest_int("offspring", 8, 96, log=True),
        "tournament": trial.suggest_int("tournament", 2, 6),
        "crossover": trial.suggest_float("crossover", 0.0, 1.0),
        "mutation_rate": trial.suggest_float("mutation_rate", 1.0, 4.0),
        "memetic_every": trial.suggest_int("memetic_every", 0, 10),
        "memetic_rounds": trial.suggest_int("memetic_rounds", 1, 6),
        "patience": trial.suggest_int("patience", 5, 60, log=True),
    }


class Cases:
    """Benchmark cases (problems) and each one's best heuristic objective,
    computed once per worker."""

    def __init__(self, specs: Sequence[str], evaluations: int):
        from .cost import Problem, get_cost_model
        from .datasets import cluster as load_cluster
        from .datasets import graph as load_graph
        from .search import Budget, get_strategy
        self.evaluations = int(evaluations)
        self.items = []
        model = get_cost_model("analytical")
        for spec in specs:
            if "@" not in spec:
                raise StrategyError(f"bad case {spec!r}", field="--case",
                                    fix="write GRAPH@CLUSTER, e.g. gpt-125m.module@hetero-lab")
            gname, cname = spec.split("@", 1)
            problem = Problem(load_graph(gname), load_cluster(cname))
            best = float("inf")
            for name in HEURISTICS:
                plan = get_strategy(name).search(problem, model,
                                                 Budget(evaluations=self.evaluations), 0)
                best = min(best, model.estimate(problem, plan).objective)
            self.items.append((spec, problem, best))

    def score(self, config: dict, seed: int = 0) -> tuple[float, dict]:
        """Mean ratio to the best heuristic over the cases, and per case."""
        from evolution import Evolution

        from .cost import get_cost_model
        from .search import Budget
        model = get_cost_model("analytical")
        ratios = {}
        for spec, problem, best in self.items:
            strategy = Evolution(**config)
            budget = Budget(evaluations=self.evaluations)
            plan = strategy.search(problem, budget.meter(model), budget, seed)
            ratios[spec] = model.estimate(problem, plan).objective / best
        return sum(ratios.values()) / len(ratios), ratios


def storage_for(url: str):
    """An Optuna RDB storage for ``url`` (SQLite waits for locks held by
    other workers instead of failing)."""
    import optuna
    kwargs = {}
    if url.startswith("sqlite"):
        kwargs = {"connect_args": {"timeout": 60}}
    return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)


def tune(cases: Sequence[str] = DEFAULT_CASES, *, trials: int = 20,
         storage: str = DEFAULT_STORAGE, study: str = DEFAULT_STUDY,
         evaluations: int = 400, output: str | None = "placer-tune.json", seed: int | None = None,
         progress: bool = False, time_budget: float | None = None) -> dict:
    """Run ``trials`` trials of the shared study and return (and write to
    ``output``) the best configuration: ``{"config": ..., "value": ...,
    "trials": ..., "cases": ..., "study": ..., "storage": ...}``. With
    ``time_budget`` (seconds) no trial starts after the budget is spent."""
    import optuna
    if trials < 1:
        raise StrategyError(f"trials must be >= 1, got {trials!r}", field="--trials")
    if not progress:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
    bench = Cases(cases, evaluations)
    sampler = optuna.samplers.TPESampler(seed=seed)
    st = optuna.create_study(study_name=study, storage=storage_for(storage),
                             sampler=sampler, direction="minimize", load_if_exists=True)

    def objective(trial) -> float:
        config = search_space(trial)
        value, ratios = bench.score(config)
        trial.set_user_attr("ratios", ratios)
        return value

    def save(study_, _trial) -> None:
        if output:
            atomic_write_text(output, json.dumps(_best(study_, cases, study, storage),
                                                 indent=2) + "\n")

    st.optimize(objective, n_trials=int(trials), callbacks=[save], timeout=time_budget)
    result = _best(st, cases, study, storage)
    if output:
        atomic_write_text(output, json.dumps(result, indent=2) + "\n")
    return result


def _best(st, cases, study: str, storage: str) -> dict:
    import optuna
    done = [t for t in st.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if not done:
        return {"config": None, "value": None, "trials": 0, "cases": list(cases),
                "study": study, "storage": _safe_url(storage)}
    best = min(done, key=lambda t: (t.value, t.number))
    return {"config": dict(best.params), "value": best.value, "trials": len(done),
            "ratios": best.user_attrs.get("ratios"), "cases": list(cases), "study": study,
            "storage": _safe_url(storage)}


def _safe_url(url: str) -> str:
    """``url`` without a password."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        cred, host = rest.rsplit("@", 1)
        return f"{scheme}://{cred.split(':', 1)[0]}@{host}"
    return url


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The arguments of ``placer tune`` (added to ``parser`` if given)."""
    from ._cli import add_json, add_seed, add_time_budget, command_parser
    p = parser or command_parser(
        "placer tune", "Tune the evolutionary search's hyperparameters over benchmark cases "
        "(Optuna TPE; the study lives in an RDB so it resumes and several workers share it).",
        "placer tune --trials 20 --storage sqlite:///tune.db -o best.json",
        "placer tune --trials 20 --storage postgresql://user@db-host/placer   # on each machine")
    p.add_argument("--case", action="append", metavar="GRAPH@CLUSTER",
                   help="benchmark case (repeat); default: " + ", ".join(DEFAULT_CASES))
    p.add_argument("--trials", type=int, default=20, help="trials this worker runs")
    p.add_argument("--storage", default=DEFAULT_STORAGE,
                   help="Optuna storage URL: sqlite:///FILE or e.g. postgresql://user@host/db")
    p.add_argument("--study", default=DEFAULT_STUDY, help="study name shared by workers")
    p.add_argument("--evaluations", type=int, default=400,
                   help="evaluation budget of each search run")
    p.add_argument("-o", "--output", default="placer-tune.json",
                   help="JSON file for the best configuration")
    add_seed(p, "TPE sampler", default=None)
    add_time_budget(p, "tuning in this worker (stops after the running trial)")
    add_json(p)
    return p


def run_args(args: argparse.Namespace) -> int:
    """Run ``placer tune`` from parsed arguments (for the CLI)."""
    result = tune(args.case or DEFAULT_CASES, trials=args.trials, storage=args.storage,
                  study=args.study, evaluations=args.evaluations, output=args.output,
                  seed=args.seed, time_budget=args.time_budget)
    if getattr(args, "json", False):
        print(json.dumps(result, indent=2))
    else:
        print(f"best of {result['trials']} trial(s): mean ratio to the best heuristic "
              f"{result['value']:.4f}\nconfig: {json.dumps(result['config'])}"
              + (f"\nwrote {args.output}" if args.output else ""))
    return 0


def tune_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``placer tune``; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return run_args(args)
    except PlacerError as exc:
        print(f"placer tune: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(tune_main())

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
or ``postgresql://user:password@host/db`` once one machine is not enough
(:mod:`placer.studies`). Start the same command on several machines (or
several times on one) with the same ``--storage`` and ``--study`` and they
split the trials; ``--total-trials N`` stops every worker once the study
holds N completed trials, so a worker started again after one was killed
finishes the job (the killed worker's running trial is failed and its
parameters tried again once its heartbeat is ``2 * --heartbeat`` s old).

>>> parser = build_parser()
>>> parser.parse_args(["--trials", "3"]).trials
3
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from typing import Sequence

from ._io import atomic_write_text
from .errors import PlacerError, StrategyError
from .studies import HEARTBEAT, open_storage, safe_url

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
        from .cost import get_cost_model
        from .search import Budget, get_strategy
        model = get_cost_model("analytical")
        ratios = {}
        for spec, problem, best in self.items:
            strategy = get_strategy("evolution", **config)
            budget = Budget(evaluations=self.evaluations)
            plan = strategy.search(problem, budget.meter(model), budget, seed)
            ratios[spec] = model.estimate(problem, plan).objective / best
        return sum(ratios.values()) / len(ratios), ratios


def storage_for(url: str, heartbeat: int | None = HEARTBEAT):
    """An Optuna RDB storage for ``url`` (see :func:`placer.studies.open_storage`)."""
    return open_storage(url, heartbeat=heartbeat, field="--storage")


def tune(cases: Sequence[str] = DEFAULT_CASES, *, trials: int | None = 20,
         storage: str = DEFAULT_STORAGE, study: str = DEFAULT_STUDY,
         evaluations: int = 400, output: str | None = "placer-tune.json", seed: int | None = None,
         progress: bool = False, time_budget: float | None = None,
         total_trials: int | None = None, heartbeat: int | None = HEARTBEAT) -> dict:
    """Run ``trials`` trials of the shared study and return (and write to
    ``output``) the best configuration: ``{"config": ..., "value": ...,
    "trials": ..., "cases": ..., "study": ..., "storage": ...}``. With
    ``time_budget`` (seconds) no trial starts after the budget is spent;
    with ``total_trials`` this worker stops once the study (all workers)
    holds that many completed trials (``trials`` None: no cap of its own).
    ``heartbeat`` (seconds; 0: none) lets a later worker fail and retry the
    trials of a worker that died."""
    import optuna
    if trials is None and total_trials is None:
        raise StrategyError("give trials, total_trials or both", field="--trials")
    for name, value in (("--trials", trials), ("--total-trials", total_trials)):
        if value is not None and (int(value) != value or value < 1):
            raise StrategyError(f"{name[2:].replace('-', ' ')} must be >= 1, got {value!r}",
                                field=name)
    if not progress:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
    rdb = storage_for(storage, heartbeat)
    bench = Cases(cases, evaluations)
    sampler = optuna.samplers.TPESampler(seed=seed)
    st = optuna.create_study(study_name=study, storage=rdb,
                             sampler=sampler, direction="minimize", load_if_exists=True)

    worker = f"{socket.gethostname()}:{os.getpid()}"

    def objective(trial) -> float:
        trial.set_user_attr("worker", worker)     # which host and process ran it
        config = search_space(trial)
        value, ratios = bench.score(config)
        trial.set_user_attr("ratios", ratios)
        return value

    def save(study_, _trial) -> None:
        if output:
            atomic_write_text(output, json.dumps(_best(study_, cases, study, storage),
                                                 indent=2) + "\n")

    callbacks = [save]
    if total_trials is not None:
        complete = (optuna.trial.TrialState.COMPLETE,)
        callbacks.append(optuna.study.MaxTrialsCallback(int(total_trials), states=complete))
        if len(st.get_trials(deepcopy=False, states=complete)) >= total_trials:
            trials = 0      # the study is done already
    if trials != 0:
        st.optimize(objective, n_trials=None if trials is None else int(trials),
                    callbacks=callbacks, timeout=time_budget)
    result = _best(st, cases, study, storage)
    if output:
        atomic_write_text(output, json.dumps(result, indent=2) + "\n")
    return result


def _best(st, cases, study: str, storage: str) -> dict:
    import optuna
    done = [t for t in st.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if not done:
        return {"config": None, "value": None, "trials": 0, "cases": list(cases),
                "study": study, "storage": safe_url(storage)}
    best = min(done, key=lambda t: (t.value, t.number))
    return {"config": dict(best.params), "value": best.value, "trials": len(done),
            "ratios": best.user_attrs.get("ratios"), "cases": list(cases), "study": study,
            "storage": safe_url(storage)}


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The arguments of ``placer tune`` (added to ``parser`` if given)."""
    from ._cli import add_json, add_seed, add_time_budget, command_parser
    p = parser or command_parser(
        "placer tune", "Tune the evolutionary search's hyperparameters over benchmark cases "
        "(Optuna TPE; the study lives in an RDB so it resumes and several workers share it).",
        "placer tune --trials 20 --storage sqlite:///tune.db -o best.json",
        "placer tune --total-trials 40 --storage postgresql://tuner:PASSWORD@db-host/placer"
        "   # on each machine")
    p.add_argument("--case", action="append", metavar="GRAPH@CLUSTER",
                   help="benchmark case (repeat); default: " + ", ".join(DEFAULT_CASES))
    p.add_argument("--trials", type=int, default=None,
                   help="trials this worker runs (default 20, or no cap of its own with "
                        "--total-trials)")
    p.add_argument("--total-trials", type=int, default=None, metavar="N",
                   help="stop once the study holds N completed trials, all workers together "
                        "(start the same command again to finish a study a killed worker left)")
    p.add_argument("--storage", default=DEFAULT_STORAGE,
                   help="Optuna storage URL: sqlite:///FILE, or postgresql://USER:PASSWORD@HOST"
                        "[:PORT]/DB shared by hosts (pip install 'placer[postgres]')")
    p.add_argument("--study", default=DEFAULT_STUDY, help="study name shared by workers")
    p.add_argument("--heartbeat", type=int, default=HEARTBEAT, metavar="SECONDS",
                   help="a running trial's heartbeat; a later worker fails and retries the "
                        "trial of a worker silent for twice this (0: off)")
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
    trials = args.trials if args.trials is not None or args.total_trials else 20
    result = tune(args.case or DEFAULT_CASES, trials=trials, storage=args.storage,
                  study=args.study, evaluations=args.evaluations, output=args.output,
                  seed=args.seed, time_budget=args.time_budget, total_trials=args.total_trials,
                  heartbeat=args.heartbeat or None)
    if getattr(args, "json", False):
        print(json.dumps(result, indent=2))
    elif result["value"] is None:
        print("no completed trial in the study yet"
              + (f"\nwrote {args.output}" if args.output else ""))
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

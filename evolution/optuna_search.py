"""``method="optuna"``: TPE over the structured space of pipeline layouts.

Each trial picks the number of pipeline stages, the data-parallel degree,
the number of microbatches, the schedule and the heuristic that seeds a
short evolutionary search; the trial builds the balanced layout of that
shape (devices along the nearness chain), runs the GA from it and the
seeding heuristic's plan, and reports the screening model's objective.
The sampler is Optuna's TPE seeded by ``seed``; the trials run one after
another, so the same seed and evaluation budget give the same plan.

With ``storage`` (an RDB URL, e.g. ``postgresql://user:pw@host/db``; see
:mod:`placer.studies`) the study is shared: each trial's plan is kept in the
study, searches on several hosts with the same ``storage`` and ``study``
split the trials, and each returns the best plan any of them found (a run
started again resumes the study). The study is bound to its problem (graph,
cluster, options, screening model): another problem under the same study
name is refused. Shared runs depend on what the other workers did, so only
a lone worker on a fresh study is reproducible.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import TYPE_CHECKING, Sequence

import numpy as np

from placer.cost import get_cost_model
from placer.errors import PlacerError, StrategyError
from placer.plan import Plan
from placer.search.base import Budget, Progress, Strategy, get_strategy, register_strategy

from placer.search.ranker import reserve
from placer.space import LayoutGenome, Space, device_chain

from .search import Evolution

if TYPE_CHECKING:
    from placer.cost import CostModel, Problem

DEFAULT_HEURISTICS = ("even_pipeline", "heft", "m_sct", "pipeline_dp", "none")


class OptunaSearch(Strategy):
    """TPE over (stages, replicas, microbatches, schedule, seeding heuristic).

    Options: ``trials`` (cap; None: until the budget is spent),
    ``trial_share`` (fraction of the remaining budget one trial may use,
    0.1), ``generations`` of each trial's GA (8), ``heuristics`` to choose
    from, ``screen`` (``"analytical"``), ``storage`` (None: in memory; an RDB
    URL shares the study), ``study`` (its name; default: one per problem),
    ``heartbeat`` (seconds, for storages), plus :class:`Strategy`'s options.
    """

    name = "optuna"

    def __init__(self, *, trials: int | None = None, trial_share: float = 0.1,
                 generations: int = 8, heuristics: Sequence[str] = DEFAULT_HEURISTICS,
                 screen: str | None = "analytical", startup_trials: int = 8,
                 storage: str | None = None, study: str | None = None,
                 heartbeat: int | None = None, **common):
        super().__init__(**common)
        if trials is not None and (int(trials) != trials or trials < 1):
            raise StrategyError(f"trials must be a whole number >= 1, got {trials!r}",
                                field="trials")
        self.trials = None if trials is None else int(trials)
        self.trial_share = float(trial_share)
        self.generations = int(generations)
        self.heuristics = list(heuristics)
        self.screen = screen
        self.startup_trials = int(startup_trials)
        if storage is not None and not isinstance(storage, str):
            raise StrategyError(f"storage must be a URL string, got {storage!r}",
                                field="storage", fix="e.g. postgresql://user:pw@host/db")
        if study is not None and (not isinstance(study, str) or not study):
            raise StrategyError(f"study must be a name, got {study!r}", field="study")
        if storage is not None:
            from placer.studies import driver_url
            driver_url(storage, field="storage")    # a bad scheme or no driver: now
        self.storage = storage
        self.study = study
        self.heartbeat = heartbeat

    def search(self, problem: "Problem", cost_model: "CostModel", budget: Budget,
               seed: int = 0, progress=None) -> Plan:
        import optuna
        from placer.search.common import Coarse
        from .shared import sub_budget

        coarse = Coarse(problem, 400 if problem.n_ops > 1500 else None)
        inner = coarse.problem
        space = Space(inner, self.microbatch_choices(inner), self.schedule_choices())
        screen = cost_model if self.screen is None else get_cost_model(self.screen)
        D, n = space.n_devices, space.n_ops
        chain = device_chain(space)
        heuristic_plans: dict[str, Plan | None] = {}

        def heuristic(name: str) -> Plan | None:
            if name not in heuristic_plans:
                plan = None
                if name != "none":
                    try:
                        sub = sub_budget(budget, 0.05)
                        plan = get_strategy(name).search(inner, screen, sub, seed=seed)
                        budget.charge(sub.used)
                    except PlacerError:
                        plan = None
                heuristic_plans[name] = plan
            return heuristic_plans[name]

        results: dict[int, tuple[float, Plan]] = {}

        def objective(trial: "optuna.Trial") -> float:
            pp = trial.suggest_int("stages", 1, max(1, min(D, n)), log=True)
            dp = trial.suggest_int("replicas", 1, max(1, D // pp), log=True) \
                if D // pp > 1 else 1
            m = trial.suggest_categorical("microbatches", space.microbatch_choices)
            schedule = trial.suggest_categorical("schedule", space.schedule_choices)
            seed_name = trial.suggest_categorical("seed_heuristic", self.heuristics)
            stages = [tuple(chain[s * dp:(s + 1) * dp]) for s in range(pp)]
            layout = LayoutGenome.balanced(space, stages, m, schedule, "layout")
            starts = [layout.decode(space).to_plan(space, self.name)]
            h = heuristic(seed_name)
            if h is not None:
                starts.append(Plan(dict(h.placement), m, schedule, h.method))
            ga = Evolution(seeds=(), layouts=False, initial=starts, population=16,
                           generations=self.generations, patience=4, memetic_every=4,
                           screen=None, final_k=1, final=None, restarts=0,
                           microbatches=m, schedule=schedule,
                           coarsen_above=10 ** 9)
            sub = sub_budget(budget, self.trial_share)
            plan = ga.search(inner, screen, sub, seed=seed + trial.number)
            budget.charge(sub.used)
            value = float(plan.predicted.get("objective", plan.predicted["step_time"]))
            results[trial.number] = (value, plan)
            if self.storage is not None:
                trial.set_user_attr("plan", _plan_record(plan))
            if progress is not None:
                best = min(v for v, _ in results.values())
                progress(Progress(self.name, budget.used, budget.elapsed, best,
                                  best if best < 1e9 else None, best < 1e9,
                                  f"trial {trial.number}"))
            return value

        sampler = optuna.samplers.TPESampler(seed=int(seed),
                                             n_startup_trials=self.startup_trials)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = self._study(inner, screen, space, sampler)
        count = 0
        with reserve(budget, 3 + len(self.initial)):
            while not budget.exhausted() and (self.trials is None or count < self.trials):
                study.optimize(objective, n_trials=1)
                count += 1
        if not results:
            raise StrategyError("optuna ran no trial", fix="give a larger budget")
        if self.storage is not None:
            results.update(_shared_results(study, results))
        order = sorted(results, key=lambda k: (results[k][0], k))
        room = budget.remaining_evaluations - len(self.initial)
        keep = 3 if math.isinf(room) else max(1, min(3, int(room)))
        plans = [results[k][1] for k in order[:keep]]
        if coarse.members is not None:
            plans = [p.expand(coarse.graph) for p in plans]
        reports = cost_model.estimate_many(problem, plans)
        i = int(np.argmin([r.objective for r in reports]))
        plan = plans[i]
        plan.extra["optuna"] = {"trials": count, "best_params": study.best_params}
        if self.storage is not None:
            from placer.studies import safe_url
            plan.extra["optuna"].update(study=study.study_name, storage=safe_url(self.storage),
                                        study_trials=len(results))
        return self.finalize(problem, cost_model, budget, plan, reports[i], progress=progress)

    def _study(self, inner: "Problem", screen: "CostModel", space: Space, sampler):
        """The in-memory study, or the shared one bound to this problem."""
        import optuna
        if self.storage is None:
            return optuna.create_study(direction="minimize", sampler=sampler)
        from placer.studies import HEARTBEAT, open_storage
        key = problem_key(inner, screen, space)
        name = self.study or f"placer-optuna-{key[:16]}"
        storage = open_storage(self.storage, field="storage",
                               heartbeat=HEARTBEAT if self.heartbeat is None else self.heartbeat)
        study = optuna.create_study(study_name=name, storage=storage, sampler=sampler,
                                    direction="minimize", load_if_exists=True)
        bound = study.user_attrs.get("problem")
        if bound is None:
            study.set_user_attr("problem", key)
        elif bound != key:
            raise StrategyError(f"study {name!r} holds trials of another problem (graph, "
                                "cluster, options or screening model differ)", field="study",
                                fix="give this search its own study name, or leave study unset")
        return study


def problem_key(problem: "Problem", screen: "CostModel", space: Space) -> str:
    """sha256 of what a trial's value depends on: the (coarsened) graph, the
    cluster, the problem's options, the screening model and the space."""
    data = {"graph": problem.graph.fingerprint(), "cluster": problem.cluster.fingerprint(),
            "options": dict(problem.options), "screen": screen.name,
            "microbatches": list(space.microbatch_choices),
            "schedules": list(space.schedule_choices)}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=repr).encode()).hexdigest()


def _plan_record(plan: Plan) -> dict:
    """What a shared study keeps of a trial's plan."""
    record = {"format": "placer.plan/v1", "method": plan.method, "schedule": plan.schedule,
              "microbatches": plan.microbatches,
              "placement": {k: list(v) for k, v in plan.placement.items()}}
    if plan.allreduce:
        record["allreduce"] = dict(plan.allreduce)
    return record


def _shared_results(study, mine: dict) -> dict[int, tuple[float, Plan]]:
    """The completed trials of other workers (or earlier runs) in the study."""
    import optuna
    out = {}
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        if t.number not in mine and "plan" in t.user_attrs and t.value is not None:
            out[t.number] = (float(t.value), Plan.from_dict(t.user_attrs["plan"]))
    return out


register_strategy(OptunaSearch)

__all__ = ["OptunaSearch"]

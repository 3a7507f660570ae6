"""``method="evolution"``: a memetic genetic algorithm over op-level placements.

The population starts from the heuristics' plans (HEFT, m-SCT,
pipeline_dp, ...), balanced stage/replica layouts of several shapes and any
``initial`` plans (e.g. an RL policy's samples, as ``hybrid`` does), and is
filled with mutants of them. Each generation breeds offspring by tournament
selection, segment crossover and topology-aware mutation
(:mod:`placer.space.moves`), scores them in one batch with the *screening*
cost model (analytical by default; optionally on worker processes), keeps
the best distinct genomes (mu + lambda, elitist) and polishes the best with
a local search (:mod:`placer.space.local`). It stops when the budget is spent
or after ``patience`` generations without improvement. The best few
distinct plans and the best seed of each heuristic are then ranked by the
cost model the search was given (the simulator in ``placer.optimize``), so
the result is never worse than the heuristics that seeded it.

Graphs larger than ``coarsen_above`` ops are coarsened first and the plan
expanded back. The search uses deap's toolbox, fitness, hall of fame and
logbook, built inside :meth:`Evolution.search`; every random choice comes
from one ``numpy.random.Generator`` seeded by ``seed``.

Checkpoints: with ``checkpoint=PATH`` the search keeps a snapshot of its
state at the end of every generation (population, hall of fame, logbook,
random generator, score cache, data-parallel group table, budget spent) and
writes it atomically to PATH every ``checkpoint_every`` seconds and when it
is interrupted (KeyboardInterrupt, which the CLI also raises on SIGTERM);
it then raises :class:`placer.search.base.SearchInterrupted` carrying the
best plan so far. ``resume=True`` continues from PATH (or starts afresh if
there is none); with an evaluation budget (and no time limit reached) the
resumed search ends with exactly the plan of an uninterrupted run with the
same seed.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import os
import time as _time
from typing import TYPE_CHECKING, Sequence

import numpy as np
from deap import base, tools

from placer.cost import get_cost_model
from placer.errors import PlacerError, StrategyError
from placer.plan import Plan
from placer._io import atomic_write_text, load_document
from placer.search.base import (Budget, Progress, SearchInterrupted, Strategy, get_strategy,
                                register_strategy)
from placer.search.common import learn_seed_seconds, seed_seconds
from placer.search.ranker import RankPolicy, final_ranker, rank
from placer.search.parallel import ProblemPool, pool_workers

from placer.search.evaluate import Evaluator, resolve_workers
from placer.search.phases import EXACT_SCREEN_EVALS, SeedPool, polish_with, screen_exactly
from placer.space import OpGenome, Space, crossover, layout_seeds, local_search, mutate
from .config import DEFAULT_SEEDS, FIELDS, EvolutionConfig, with_config_keywords
from .shared import Fitness, ProgressBar, sub_budget, tournament

if TYPE_CHECKING:
    from placer.cost import CostModel, Problem


class Evolution(Strategy):
    """Memetic GA over op-level placements (see the module doc).

    Options: the fields of :class:`~evolution.config.EvolutionConfig`
    (population, operators, seeds, memetic steps, restarts, screening and
    final models, workers, coarsening, checkpoints), as keywords or whole
    as ``config=`` (keywords then change single fields); besides
    :class:`Strategy`'s ``initial``, ``microbatches`` and ``schedule``, the
    plans handed in:

    - ``initial_plans``: an alias of ``initial``;
    - ``candidates``: plans that join the first population like ``initial``
      (the best of them also competes in the final ranking) without
      ``initial``'s guarantee, so ``finalize`` neither re-scores them nor
      keeps evaluations for that (``hybrid`` hands its policy plans over so;
      ``given_slots`` bounds the descendants of both).

    >>> Evolution(population=16).config == Evolution(config=EvolutionConfig(population=16)).config
    True
    """

    name = "evolution"

    @with_config_keywords
    def __init__(self, *, config: EvolutionConfig | None = None,
                 initial_plans: Plan | Sequence[Plan] | None = None,
                 candidates: Plan | Sequence[Plan] | None = None, **options):
        own = {k: options.pop(k) for k in FIELDS if k in options}
        if initial_plans is not None:
            extra = [initial_plans] if isinstance(initial_plans, Plan) else list(initial_plans)
            init = options.pop("initial", None) or []
            options["initial"] = ([init] if isinstance(init, Plan) else list(init)) + extra
        super().__init__(**options)
        self.config = EvolutionConfig(**own) if config is None else config.replace(**own)
        self.candidates: list[Plan] = [candidates] if isinstance(candidates, Plan) \
            else list(candidates or [])
        self._run: dict | None = None   # the running search's state (checkpoints)

    def __getattr__(self, name: str):
        # the options read as attributes too (``strategy.final``, ``.workers``,
        # ``.backend``, as placer.search.multilevel reads any strategy's)
        config = self.__dict__.get("config")
        if config is not None and name in FIELDS:
            return getattr(config, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value) -> None:
        if name in FIELDS:
            raise AttributeError(f"{name} is an option of the frozen config: build the "
                                 f"strategy with it ({type(self).__name__}({name}=...))")
        super().__setattr__(name, value)

    # --- the search ---------------------------------------------------------------
    def search(self, problem: "Problem", cost_model: "CostModel", budget: Budget,
               seed: int = 0, progress=None) -> Plan:
        from placer.search.common import Coarse
        rng = np.random.default_rng([int(seed), 0x5EED, 7])
        coarse = Coarse(problem, self.config.coarsen_to if problem.n_ops > self.config.coarsen_above
                        else None)
        inner = coarse.problem
        space = Space(inner, self.microbatch_choices(inner), self.schedule_choices())
        screen = cost_model if self.config.screen is None else get_cost_model(self._screen_name)
        if getattr(screen, "name", None) == getattr(cost_model, "name", None) \
                and self.config.screen is not None:
            screen = cost_model
        metered = budget.meter(screen)
        bar = ProgressBar(self.config.progress_bar, budget)
        identity = self._identity(problem, budget, seed, space)
        state = self._load_state(identity) if self.config.resume else None
        # keep evaluations for the final ranking (at least one report) and
        # finalize's scoring of the initial plans
        try:
            with self._policy(cost_model, coarse).hold(budget), \
                    Evaluator(space, metered, budget, workers=self._workers(screen, budget),
                              backend=self.config.backend) as evaluate:
                self._run = {"identity": identity, "space": space, "coarse": coarse,
                             "evaluate": evaluate, "rng": rng, "budget": budget,
                             "snap": None, "written": _time.perf_counter()}
                if state is None:
                    seeds = self._seed_genomes(space, screen, budget, seed, coarse)
                    screen = self._screen_exactly(space, evaluate, screen, seeds, budget)
                    evaluate.workers = self._workers(screen, budget, evaluate)
                else:
                    seeds = self._restore(state, space, evaluate, rng, budget)
                self._run["seeds"] = seeds
                best, hof, logbook = self._evolve(space, evaluate, seeds, rng, budget,
                                                  progress, bar, state)
                if evaluate.switches:       # the simulator proved too slow to screen with
                    screen = evaluate.model
        except SearchInterrupted:
            raise
        except KeyboardInterrupt:
            raise self._interrupted() from None
        finally:
            bar.close()
        # final ranking of the best distinct plans and each origin's best seed,
        # in the order the ranking scores them while time lasts: the search's
        # best, the seeds' bests, then the other finalists
        finalists: list[OpGenome] = _unique(list(hof)[:1] + self._run.get("champions", []))
        by_origin: dict[str, OpGenome] = {}
        for g in seeds:
            if not np.isfinite(g.fitness.values[0]):
                continue
            cur = by_origin.get(g.origin)
            if cur is None or g.fitness.values[0] < cur.fitness.values[0]:
                by_origin[g.origin] = g
        # plans handed in first: they were chosen by someone else's search
        # and the ranking may run out of time before the last finalists
        if "initial" in by_origin:
            by_origin = {"initial": by_origin.pop("initial"), **by_origin}
        seen = {g.key() for g in finalists}
        for g in [*by_origin.values(), *self._run.get("own_best", []), *list(hof)[1:]]:
            if g.key() not in seen:
                seen.add(g.key())
                finalists.append(g)
        ranker = final_ranker(self.config.final, cost_model, budget)
        policy = self._policy(cost_model, coarse, ranker)
        finalists = finalists[:policy.room(budget, len(finalists))]
        if coarse.members is not None:
            finalists = self._affordable(space, coarse, finalists, budget)
        plans = [self._expand(space, coarse, g) for g in finalists]
        origins = [g.origin for g in finalists]
        if coarse.members is not None:
            # The seeds ran on the coarse graph; their full-graph plans can be
            # better than any expanded genome, so they compete too: the search
            # is then never worse than the heuristics it started from.
            ranked = sorted(by_origin.values(), key=lambda g: g.fitness.values[0])
            fine = list(self._fine_seeds(problem, screen, budget, seed,
                                         first=ranked[0].origin if ranked else None))
            plans[1:1] = [plan for _, plan in fine]
            origins[1:1] = [name for name, _ in fine]
            finalists[1:1] = [None] * len(fine)
            # the ranking scores while time lasts (a full-graph simulation
            # can take seconds): the screening model's best full-graph plans
            # first, not the coarse search's expanded winner by position
            unmetered = getattr(screen, "inner", screen)
            values = [o.objective for o in unmetered.estimate_many(problem, plans)]
            order = sorted(range(len(plans)), key=values.__getitem__)
            plans, origins, finalists = ([xs[k] for k in order]
                                         for xs in (plans, origins, finalists))
        if getattr(screen, "name", None) == getattr(ranker, "name", None) \
                and coarse.members is None:
            i = int(np.argmin([g.fitness.values[0] for g in finalists]))
        else:
            with ProblemPool(problem, self.config.backend,
                             pool_workers(self.config.workers, self.config.backend)) as pool:
                i = rank(ranker, problem, plans, budget, pool=pool, policy=policy)
        plan = plans[i]
        if self._final_share(cost_model, coarse) and finalists[i] is not None:
            # a stream of its own: the polish of a finalist does not depend on
            # how many generations drew from the search's (hybrid's evolution,
            # after the policy's evaluations, polishes evolution's own
            # finalist as evolution alone does)
            polished = self._final_polish(space, ranker, budget, finalists[i],
                                          np.random.default_rng([int(seed), 0x5EED, 8]))
            if polished is not None:
                plan = polished
        report = cost_model.estimate(problem, plan)
        plan.extra["search"] = {"generations": len(logbook), "origin": origins[i],
                                "screen": getattr(screen, "name", None),
                                "screen_fallbacks": evaluate.switches,
                                "coarsened": coarse.members is not None}
        return self.finalize(problem, cost_model, budget, plan, report, progress=progress)

    def _policy(self, cost_model, coarse, ranker=None) -> RankPolicy:
        """The ranking's policy (:mod:`placer.search.ranker`): evaluations
        for the ranking and finalize's scoring of the initial plans, a share
        for polishing the winner or ranking by a final model; after the
        search, those left for the initial plans (and the report, when the
        final model is another than ``cost_model``)."""
        return RankPolicy(reserve=len(self.initial) + 2,
                          share=self._final_share(cost_model, coarse)
                          or self._rank_share(cost_model, coarse),
                          keep=len(self.initial) + (ranker is not None
                                                    and ranker is not cost_model))

    def _final_share(self, cost_model, coarse) -> float:
        """Share of the budget kept for polishing the winner with the final
        ranking model (0 when that is the screening model or the graph was
        coarsened)."""
        if coarse.members is not None or self.config.final is None or \
                self.config.final == getattr(cost_model, "name", None) or self.config.final == self._screen_name:
            return 0.0
        return self.config.final_share

    def _workers(self, screen, budget: Budget, evaluate: Evaluator | None = None) -> int:
        return resolve_workers(self.config.workers, self.config.backend, screen, budget,
                               getattr(evaluate, "seconds_per_estimate", None))

    @property
    def _screen_name(self) -> str | None:
        return "analytical" if self.config.screen == "auto" else self.config.screen

    def _screen_exactly(self, space: Space, evaluate: Evaluator, screen, seeds: list,
                        budget: Budget):
        """See :func:`screen_exactly` (timed on the first seeds)."""
        if self.config.screen != "auto" or not seeds:
            return screen
        plans = [g.to_plan(space, self.name) for g in seeds[:3]]
        return screen_exactly(space.problem, evaluate, screen, plans, budget, self.config.final,
                              evals=EXACT_SCREEN_EVALS, fallback=True)

    def _rank_share(self, cost_model, coarse=None) -> float:
        """Share of the time kept for ranking the finalists by a final model
        other than the search's (when there is no polishing to keep it for);
        on a coarsened graph, where the finalists are expanded, the
        heuristics run on the whole graph and all scored there, at least
        :data:`COARSE_RANK_SHARE`."""
        floor = COARSE_RANK_SHARE if coarse is not None and coarse.members is not None else 0.0
        if self.config.final is None or self.config.final == getattr(cost_model, "name", None):
            return floor
        return max(RANK_SHARE, floor)

    def _affordable(self, space: Space, coarse, finalists: list, budget: Budget) -> list:
        """The first of ``finalists`` (in ranking order) whose expansion to
        the whole graph and scoring there fit 40% of the time left (timed
        on the first; at least one)."""
        if budget.time is None or len(finalists) < 2:
            return finalists
        start = _time.perf_counter()
        self._expand(space, coarse, finalists[0])
        # expanded, then scored on the whole graph (about twice the expansion)
        each = 3.0 * (_time.perf_counter() - start) + 1e-4
        return finalists[:max(1, int(0.4 * budget.remaining_time / each))]

    def _final_polish(self, space: Space, ranker, budget: Budget, g: OpGenome,
                      rng: np.random.Generator) -> Plan | None:
        """Steepest descent around ``g`` scored by the final ranking model
        (``ranker``, metered) in what is left of the budget; the improved
        plan, or None."""
        best = polish_with(space, ranker, budget, g, rng, len(self.initial) + 1)
        return None if best is None else best.to_plan(space, self.name)

    def _fine_seeds(self, problem: "Problem", screen, budget: Budget, seed: int,
                    first: str | None = None):
        """(name, plan) of the seed heuristics run on the full graph: ``first``
        (the heuristic whose coarse seed scored best) first, the others
        while the budget lasts, each only if predicted to finish in the
        time left (:func:`seed_seconds`) (on a 10,000-op graph they take seconds each,
        most of it coarsening, which once made a 10 s search take 60 s)."""
        names = [s for s in self.config.seeds if s != self.name]
        if first in names:
            names.remove(first)
            names.insert(0, first)
        for k, name in enumerate(names):
            if budget.remaining_evaluations <= len(self.initial) + 1 or (
                    k and budget.out_of_time()):
                break
            if 2 * seed_seconds(name, problem) > budget.remaining_time:
                continue            # predicted to overrun (a margin for the ranking)
            try:
                strategy = get_strategy(name, microbatches=self.microbatches,
                                        schedule=self.schedule)
                sub = sub_budget(budget, self.config.seed_share / max(len(self.config.seeds), 1))
                start = _time.perf_counter()
                try:
                    plan = strategy.search(problem, screen, sub, seed=seed)
                finally:
                    budget.charge(sub.used)
                    learn_seed_seconds(name, problem, _time.perf_counter() - start)
            except PlacerError:
                continue
            yield name, plan

    def _expand(self, space: Space, coarse, g: OpGenome) -> Plan:
        plan = g.to_plan(space, self.name)
        if coarse.members is not None:
            plan = plan.expand(coarse.graph)
            plan.method = self.name
        return plan

    # --- population ---------------------------------------------------------------
    def _seed_genomes(self, space: Space, screen, budget: Budget, seed: int,
                      coarse) -> list[OpGenome]:
        """Genomes of the heuristic plans, the balanced layouts and ``initial``."""
        out: list[OpGenome] = []
        inner = space.problem
        names = [s for s in self.config.seeds if s != self.name]
        pool = SeedPool(budget, self.config.seed_share, len(names))
        for name in names:
            if budget.exhausted():
                break
            plan = pool.run(name, inner, screen, seed, microbatches=self.microbatches,
                            schedule=self.schedule)
            if plan is None:
                continue
            try:
                out.append(OpGenome.from_plan(space, plan, origin=name))
            except (KeyError, PlacerError):
                continue
        if self.config.layouts or not (out or self.initial or self.candidates):
            out.extend(layout_seeds(space))
        # the plans handed in last: one equal to a seed of the search's own
        # counts as that seed (``_unique`` keeps the first)
        for plan in [*self.initial, *self.candidates]:
            try:
                if coarse.members is not None:
                    plan = _project(plan, coarse)
                out.append(OpGenome.from_plan(space, plan, origin="initial"))
            except (KeyError, PlacerError):
                continue
        if not out:
            out.extend(layout_seeds(space))
        return out

    def _evolve(self, space: Space, evaluate: Evaluator, seeds: list[OpGenome],
                rng: np.random.Generator, budget: Budget, progress, bar, state=None):
        """The generations, DEAP's (mu + lambda) with restarts; returns
        ``(best, hall of fame, logbook)``::

            pop = populate(seeds)                  (or the checkpoint's)
            while the budget lasts:
                if stale for `patience` generations: pop = restart(pop)
                children = vary(pop)               (tournament, crossover, mutation)
                pop = select(pop + scored children)
                every `memetic_every` generations: polish the best
                record; snapshot; report progress
                converged, restarts spent: start again from the seeds
                (time left) or stop
        """
        toolbox = base.Toolbox()
        toolbox.register("mate", crossover, space, rng=rng)
        toolbox.register("mutate", mutate, space, rng=rng, rate=self.config.mutation_rate,
                         weights=self.config.mutation_weights)
        toolbox.register("select", tournament, rng=rng, k=self.config.tournament)
        toolbox.register("evaluate", evaluate)
        hof = tools.HallOfFame(self.config.final_k, similar=lambda a, b: a.key() == b.key())
        logbook = tools.Logbook()
        logbook.header = ["gen", "evals", "best", "median"]

        def score(genomes):
            values = toolbox.evaluate(genomes)
            for g, v in zip(genomes, values.tolist()):
                g.fitness = Fitness((v,))
            return values

        epoch = evaluate.switches

        def resync(pop: list) -> list:
            """After the evaluator fell back to another model (the simulator
            proved too slow): every score kept re-taken by it; the population
            re-sorted, the hall of fame rebuilt, staleness reset."""
            nonlocal epoch, best, stale
            if evaluate.switches == epoch:
                return pop
            epoch = evaluate.switches
            held = list(hof) + self._run.get("champions", []) + self._run.get("own_best", [])
            _rescore(evaluate, pop + seeds + held)
            pop = self._select(pop)
            hof.clear()
            hof.update(pop + held)
            best, stale = pop[0].fitness.values[0], 0
            return pop

        if state is None:
            pop = self._populate(seeds, score, rng, toolbox)
            hof.update(pop)
            best = pop[0].fitness.values[0]
            stale = 0
            pop = resync(pop)
            gen = 0
            restarts = 0
            starts = 0
        else:
            pop, best, stale, gen, restarts, starts = _resumed(state, hof, logbook)
        self._run["restarts"] = restarts
        self._run["starts"] = starts
        champions = self._run.setdefault("champions", [])
        self._snapshot(pop, hof, logbook, best, stale, gen)
        self._emit(progress, budget, best, gen, bar)
        while not budget.exhausted() and not (state is not None and stale >= self.config.patience
                                              and restarts >= self.config.restarts):
            gen += 1
            if self.config.generations is not None and gen > self.config.generations:
                break
            if stale >= self.config.patience:      # converged: restart around the best
                restarts += 1
                self._run["restarts"] = restarts
                pop = self._restart(space, evaluate, pop, score, rng)
                hof.update(pop)
                stale = 0
                if pop[0].fitness.values[0] < best * (1 - 1e-6):
                    best = pop[0].fitness.values[0]
                pop = resync(pop)
            children = self._vary(pop, toolbox, rng)
            score(children)
            children = [c for c in children if np.isfinite(c.fitness.values[0])]
            pop = self._select(pop + children)
            if self.config.memetic_every and gen % self.config.memetic_every == 0 and not budget.exhausted():
                pop = self._polish_best(space, evaluate, pop, rng)
            self._keep_own_best(pop)
            hof.update(pop)
            pop = resync(pop)
            fits = [g.fitness.values[0] for g in pop]
            logbook.record(gen=gen, evals=budget.used, best=fits[0],
                           median=float(np.median(fits)))
            if fits[0] < best * (1 - 1e-6):
                best, stale = fits[0], 0
            else:
                stale += 1
            self._snapshot(pop, hof, logbook, best, stale, gen)
            self._emit(progress, budget, min(best, hof[0].fitness.values[0]), gen, bar)
            if stale >= self.config.patience and restarts >= self.config.restarts:
                if not self._fresh_start_fits(budget, starts):
                    break
                # converged with time to spare: another run from the seeds
                # (other mutants), the hall of fame kept across runs
                starts += 1
                self._run["starts"] = starts
                # each run's best goes to the final ranking: the screening
                # model may prefer the next run's plans that the final
                # model rates worse, and they could crowd it out of the hall
                champions.append(hof[0])
                pop = self._populate(seeds, score, rng, toolbox)
                hof.update(pop)
                restarts = stale = 0
                best = pop[0].fitness.values[0]     # this run's best, for staleness
                pop = resync(pop)
                self._run["restarts"] = restarts
        return hof[0] if len(hof) else pop[0], hof, logbook

    def _vary(self, pop: list[OpGenome], toolbox, rng: np.random.Generator
              ) -> list[OpGenome]:
        """``offspring`` children of ``pop`` (sorted, scored): two parents by
        tournament, crossed over with probability ``cx``, each mutated."""
        fits = np.array([g.fitness.values[0] for g in pop])
        children = []
        while len(children) < self.config.n_offspring:
            a = pop[toolbox.select(fits)].copy()
            b = pop[toolbox.select(fits)].copy()
            if rng.random() < self.config.crossover:
                a, b = toolbox.mate(a, b)
            children.append(toolbox.mutate(a))
            if len(children) < self.config.n_offspring:
                children.append(toolbox.mutate(b))
        for c in children:
            c.origin = c.origin or "evolution"
        return children

    def _polish_best(self, space: Space, evaluate: Evaluator, pop: list[OpGenome],
                     rng: np.random.Generator) -> list[OpGenome]:
        """``pop`` with its best polished by local search, if that found better."""
        top = pop[0]
        polished, s = local_search(space, evaluate, top, top.fitness.values[0], rng,
                                   rounds=self.config.memetic_rounds)
        if polished is top:
            return pop
        polished.fitness = Fitness((s,))
        return self._select([polished] + pop)

    def _fresh_start_fits(self, budget: Budget, starts: int) -> bool:
        """Whether a converged search starts again from its seeds: only
        under a time budget (an evaluation budget or none means "until
        converged"), at most ``fresh_starts`` times, and while at least a
        tenth of the time is left (a run cut short by the budget still
        explores; its best joins the final ranking)."""
        if budget.time is None or starts >= self.config.fresh_starts or budget.exhausted():
            return False
        return budget.remaining_time >= 0.1 * budget.time

    def _populate(self, seeds: list, score, rng: np.random.Generator, toolbox) -> list:
        """A population: the seeds and mutants of them to fill it, all
        scored (seeds scored before come from the evaluation cache). The
        ``initial`` plans join the best of the search's own seeds rather
        than displace them (the first generation may be that much larger):
        plans handed in (a policy's, hybrid's) add to the search, they do
        not narrow what it starts from."""
        epoch = self._switches()
        score(seeds)
        pop = _unique(seeds)
        # under ``given_slots`` the mutants come from the search's own seeds
        # alone: its own part of the population is the one it has without
        # the plans handed in
        parents = pop if self.config.given_slots is None else \
            [g for g in pop if g.origin != "initial"] or pop
        fill = []
        while len(parents) + len(fill) < self.config.population and parents:
            parent = parents[int(rng.integers(len(parents)))]
            fill.append(toolbox.mutate(parent.copy()))
        if fill:
            score(fill)
            pop = _unique(pop + fill)
        if self._switches() != epoch:       # the seeds were scored by the model replaced
            _rescore(self._run["evaluate"], pop)
        own = _best([g for g in pop if g.origin != "initial"], self.config.population)
        given = [g for g in pop if g.origin == "initial" and np.isfinite(g.fitness.values[0])]
        if self.config.given_slots is not None:
            given = _best(given, self.config.given_slots)
        return _best(own + given, len(own) + len(given))

    def _select(self, genomes: list, k: int | None = None) -> list:
        """The ``k`` (``population``) best distinct of ``genomes``; with
        ``given_slots`` the descendants of the plans handed in hold at most
        that many places besides the ``k`` best of the search's own."""
        k = self.config.population if k is None else k
        genomes = _unique(genomes)
        if self.config.given_slots is None:
            return _best(genomes, k)
        own = _best([g for g in genomes if g.origin != "initial"], k)
        given = _best([g for g in genomes if g.origin == "initial"], min(self.config.given_slots, k))
        return _best(own + given, len(own) + len(given))

    def _switches(self) -> int:
        """How often the running search's evaluator fell back to another model."""
        return self._run["evaluate"].switches if self._run else 0

    def _keep_own_best(self, pop: list) -> None:
        """With plans handed in under ``given_slots``, remember the best of the
        search's own descendants for the final ranking (the hall of fame may
        hold only the others' when the screening model prefers them)."""
        if self.config.given_slots is None or self._run is None:
            return
        own = [g for g in pop if g.origin != "initial"]
        if own:
            best = self._run.get("own_best")
            if not best or own[0].fitness.values[0] < best[0].fitness.values[0]:
                self._run["own_best"] = [own[0]]

    def _restart(self, space: Space, evaluate: Evaluator, pop: list, score,
                 rng: np.random.Generator) -> list:
        """A converged population -> the best polished to a local optimum,
        the best quarter, and heavy mutants of them (scored)."""
        epoch = evaluate.switches
        top = pop[0]
        polished, s = local_search(space, evaluate, top, top.fitness.values[0], rng,
                                   rounds=max(4 * self.config.memetic_rounds, 1))
        if polished is not top:
            polished.fitness = Fitness((s,))
        elite = self._select([polished] + pop, max(2, self.config.population // 4))
        fill = []
        while len(elite) + len(fill) < self.config.population:
            parent = elite[int(rng.integers(len(elite)))].copy()
            fill.append(mutate(space, parent, rng, rate=3 * self.config.mutation_rate,
                               weights=self.config.mutation_weights))
        score(fill)
        if evaluate.switches != epoch:      # the elite was scored by the model replaced
            _rescore(evaluate, elite)
        return self._select(elite + [g for g in fill if np.isfinite(g.fitness.values[0])])

    # --- checkpoints ----------------------------------------------------------------
    def _identity(self, problem: "Problem", budget: Budget, seed: int, space: Space) -> str:
        """What a checkpoint must match to be resumed: graph, cluster, seed,
        budget, options (a sha256)."""
        # named and typed as the options were before EvolutionConfig, so that
        # checkpoints written by earlier versions still resume
        options = {k: v for k, v in self.config.to_dict().items()
                   if k not in ("checkpoint", "checkpoint_every", "resume", "progress_bar",
                                "workers", "backend")}
        options.update(cx=options.pop("crossover"), offspring=self.config.n_offspring,
                       microbatches=self.microbatches, schedule=self.schedule)
        options = dict(sorted(options.items()))
        data = {"graph": problem.graph.fingerprint(), "cluster": problem.cluster.fingerprint(),
                "seed": int(seed), "evaluations": budget.evaluations, "time": budget.time,
                "options": repr(options),
                "initial": [sorted(p.placement.items()) for p in self.initial],
                "candidates": [sorted(p.placement.items()) for p in self.candidates],
                "microbatches": space.microbatch_choices, "schedules": space.schedule_choices}
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()

    def _snapshot(self, pop, hof, logbook, best, stale, gen) -> None:
        """Remember the state at the end of a generation (cheap: references
        and lengths of append-only tables); write it if it is time."""
        run = self._run
        if run is None or self.config.checkpoint is None:
            return
        run["snap"] = {"population": list(pop), "hall_of_fame": list(hof.items),
                       "restarts": run.get("restarts", 0), "starts": run.get("starts", 0),
                       "logbook": len(logbook), "logbook_ref": logbook, "best": best,
                       "stale": stale, "gen": gen, "rng": run["rng"].bit_generator.state,
                       "cache": len(run["evaluate"].cache),
                       "groups": len(run["space"].table), "used": run["budget"].used,
                       "elapsed": run["budget"].elapsed}
        if _time.perf_counter() - run["written"] >= self.config.checkpoint_every:
            self._write_state()

    def _write_state(self) -> bool:
        """Write the last snapshot to the checkpoint file (atomically)."""
        run = self._run
        if run is None or run.get("snap") is None or self.config.checkpoint is None:
            return False
        snap = run["snap"]
        cache = run["evaluate"].cache
        entries = [[k.hex(), v if math.isfinite(v) else None]
                   for k, v in zip(cache, cache.values())][:snap["cache"]]
        table = run["space"].table
        data = {"format": STATE_FORMAT, "strategy": self.name, "identity": run["identity"],
                "gen": snap["gen"], "best": _num_out(snap["best"]), "stale": snap["stale"],
                "restarts": snap["restarts"], "starts": snap["starts"],
                "used": snap["used"], "elapsed": snap["elapsed"], "rng": snap["rng"],
                "groups": [list(g) for g in table.extra()[:snap["groups"] - table.n_devices]],
                "seeds": [_genome_out(g) for g in run["seeds"]],
                "population": [_genome_out(g) for g in snap["population"]],
                "hall_of_fame": [_genome_out(g) for g in snap["hall_of_fame"]],
                "logbook": [dict(r) for r in snap["logbook_ref"][:snap["logbook"]]],
                "cache": entries,
                "best_plan": self._expand(run["space"], run["coarse"],
                                          snap["population"][0]).to_dict()}
        atomic_write_text(self.config.checkpoint, json.dumps(data, default=_json_default) + "\n")
        run["written"] = _time.perf_counter()
        return True

    def _interrupted(self) -> SearchInterrupted:
        """Save the state and build the exception carrying the best plan so far."""
        run = self._run
        snap = None if run is None else run.get("snap")
        if snap is None:
            return SearchInterrupted(None, None, "interrupted before the first generation")
        saved = self._write_state()
        plan = self._expand(run["space"], run["coarse"], snap["population"][0])
        plan.extra["search"] = {"generations": snap["gen"], "interrupted": True}
        return SearchInterrupted(plan, self.config.checkpoint if saved else None,
                                 f"interrupted after generation {snap['gen']}")

    def _load_state(self, identity: str) -> dict | None:
        """The checkpoint's state, None if there is no file yet."""
        from placer.errors import FormatError
        path = self.config.checkpoint
        if path is None or not os.path.exists(path):
            return None
        data = load_document(path, FormatError)
        if not isinstance(data, dict) or data.get("format") != STATE_FORMAT:
            raise StrategyError("not a search checkpoint", file=path, field="format",
                                fix=f"expected {STATE_FORMAT}; delete it or give another "
                                "--checkpoint file")
        if data.get("identity") != identity:
            raise StrategyError("checkpoint is of another search (graph, cluster, seed, "
                                "budget or options differ)", file=path, field="identity",
                                fix="resume with the same arguments, or delete the file "
                                "to start afresh")
        return data

    def _restore(self, state: dict, space: Space, evaluate: Evaluator,
                 rng: np.random.Generator, budget: Budget) -> list[OpGenome]:
        """Put the checkpointed tables back; returns the seed genomes."""
        _check_state(state, self.config.checkpoint, space)
        for devices in state["groups"]:
            space.table.id(devices)
        for key, value in state["cache"]:
            evaluate.cache[bytes.fromhex(key)] = _num_in(value)
        rng.bit_generator.state = state["rng"]
        budget.restore(state["used"], state["elapsed"])
        return [_genome_in(d) for d in state["seeds"]]

    def _emit(self, progress, budget: Budget, best: float, gen: int, bar) -> None:
        bar.update(best, gen)
        if progress is not None:
            model = getattr(self._run["evaluate"].model, "name", None) if self._run else None
            progress(Progress(self.name, budget.used, budget.elapsed, float(best),
                              float(best) if best < 1e9 else None, bool(best < 1e9),
                              f"generation {gen}", extra={"model": model}))


# --- helpers -------------------------------------------------------------------------

#: format tag of the checkpoint files of :class:`Evolution`
STATE_FORMAT = "placer.evolution-state/v1"


def _num_out(x: float):
    x = float(x)
    return x if math.isfinite(x) else None


def _num_in(x) -> float:
    return float("inf") if x is None else float(x)


def _json_default(x):
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    raise TypeError(f"cannot write {type(x).__name__} to a checkpoint")


def _genome_out(g: OpGenome) -> dict:
    return {"assign": g.assign.tolist(), "m": int(g.microbatches), "s": g.schedule,
            "o": g.origin, "f": _num_out(g.fitness.values[0])}


_STATE_FIX = "delete the checkpoint to start afresh"


def _check_state(state: dict, file, space: Space) -> None:
    """Check every field of a checkpoint that :meth:`Evolution._restore` and
    the resumed generation loop read, so a damaged file (whose identity still
    matches) is one line naming the field rather than a deep traceback."""
    from placer._io import MAX_MICROBATCHES, MAX_VALUES, Fields
    top = Fields(state, "", None if file is None else str(file), StrategyError)
    fix = _STATE_FIX
    for key in ("gen", "stale", "used"):
        top.number(key, integer=True)
    for key in ("restarts", "starts"):
        top.number(key, 0, integer=True)
    top.number("elapsed")
    if state.get("best") is not None:
        top.number("best", minimum=None, allow_inf=True)
    try:    # on a scratch generator of the same kind as the search's
        np.random.default_rng(0).bit_generator.state = state.get("rng")
    except (TypeError, ValueError, KeyError, OverflowError, AttributeError) as exc:
        top.fail("rng", f"malformed random state ({str(exc)[:60]})", fix=fix)
    n_groups = space.n_devices
    for k, devices in enumerate(top.sequence("groups")):
        where = f"groups[{k}]"
        if not isinstance(devices, list) or len(devices) < 2 or \
                len(set(map(repr, devices))) != len(devices) or not all(
                isinstance(d, int) and not isinstance(d, bool) and 0 <= d < space.n_devices
                for d in devices):
            top.fail(where, f"expected two or more distinct device indices below "
                     f"{space.n_devices}", fix=fix)
        n_groups += 1
    for k, entry in enumerate(top.sequence("cache")):
        ok = isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str) \
            and re.fullmatch(r"[0-9a-f]{2,128}", entry[0]) is not None and len(entry[0]) % 2 == 0
        if not ok:
            top.fail(f"cache[{k}]", "expected [hex key, step time or null]", fix=fix)
        if entry[1] is not None:
            top.check_number(entry[1], f"cache[{k}][1]", minimum=None, allow_inf=True)
    for key in ("seeds", "population", "hall_of_fame"):
        genomes = top.sequence(key)
        if len(genomes) * max(space.n_ops, 1) > MAX_VALUES:
            top.fail(key, "too many genomes", fix=fix)
        for k, raw in enumerate(genomes):
            g = top.child(raw, f"{key}[{k}]")
            assign = g.sequence("assign")
            if len(assign) != space.n_ops or not all(
                    isinstance(a, int) and not isinstance(a, bool) and 0 <= a < n_groups
                    for a in assign):
                g.fail("assign", f"expected {space.n_ops} group indices below {n_groups}",
                       fix=fix)
            g.count("m", MAX_MICROBATCHES)
            if g.data.get("s") not in space.schedule_choices:
                g.fail("s", f"expected one of {space.schedule_choices}", fix=fix)
            if not isinstance(g.data.get("o", ""), str):
                g.fail("o", "expected a string", fix=fix)
            if g.data.get("f") is not None:
                g.check_number(g.data["f"], "f", minimum=None, allow_inf=True)
    if not top.sequence("population"):
        top.fail("population", "is empty", fix=fix)
    for k, record in enumerate(top.sequence("logbook")):
        if not isinstance(record, dict) or not all(isinstance(x, str) and x.isidentifier()
                                                   for x in record):
            top.fail(f"logbook[{k}]", "expected a mapping of names to values", fix=fix)


def _genome_in(d: dict) -> OpGenome:
    g = OpGenome(np.asarray(d["assign"], dtype=np.int64), int(d["m"]), d["s"], d["o"])
    g.fitness = Fitness((_num_in(d["f"]),))
    return g


#: share of a time budget kept for the final ranking when nothing else keeps one
RANK_SHARE = 0.1
#: ... and when the graph was coarsened (expanding finalists, heuristics on
#: the whole graph; a 10,000-op search on 5 s overran by 70% with 10%)
COARSE_RANK_SHARE = 0.3


def _rescore(evaluate: Evaluator, genomes: list[OpGenome]) -> None:
    """Score ``genomes`` again by ``evaluate``'s model whatever the time left
    (see :meth:`~placer.search.evaluate.Evaluator.rescore`)."""
    for g, v in zip(genomes, evaluate.rescore(genomes).tolist()):
        g.fitness = Fitness((v,))


def _resumed(state: dict, hof, logbook) -> tuple:
    """``(population, best, stale, generation, restarts, starts)`` of a
    checkpoint's ``state``; its hall of fame and logbook go into ``hof``
    and ``logbook``."""
    pop = [_genome_in(d) for d in state["population"]]
    hof.items = [_genome_in(d) for d in state["hall_of_fame"]]
    hof.keys = [g.fitness for g in reversed(hof.items)]
    for record in state["logbook"]:
        logbook.record(**record)
    return (pop, _num_in(state["best"]), int(state["stale"]), int(state["gen"]),
            int(state.get("restarts", 0)), int(state.get("starts", 0)))


def _unique(genomes: list[OpGenome]) -> list[OpGenome]:
    seen = set()
    out = []
    for g in genomes:
        k = g.key()
        if k not in seen:
            seen.add(k)
            out.append(g)
    return out


def _best(genomes: list[OpGenome], k: int) -> list[OpGenome]:
    """The ``k`` best (stable: earlier genomes win ties)."""
    fits = np.array([g.fitness.values[0] for g in genomes])
    order = np.argsort(fits, kind="stable")[:k]
    return [genomes[i] for i in order.tolist()]


def _project(plan: Plan, coarse) -> Plan:
    """A plan over the fine graph -> over the coarse one (each group on the
    devices of its first member)."""
    groups = coarse.graph.subgraph_members()
    placement = {g: list(plan.placement[m[0]]) for g, m in groups.items()}
    return Plan(placement, plan.microbatches, plan.schedule, plan.method)


register_strategy(Evolution)

__all__ = ["DEFAULT_SEEDS", "STATE_FORMAT", "Evolution", "final_ranker", "rank"]

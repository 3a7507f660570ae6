"""Anytime ``rl``: what the policy does with the rest of a budget.

:class:`gnn.strategies.RL` finds its one-shot plans first (the zero-shot
result, reported at once); with a time or evaluation budget left,
:func:`refine` then keeps searching from them until the budget ends:

- a steepest descent from each of the best one-shot plans (evolution's
  memetic neighbourhood with :func:`gnn.candidates.replica_moves`, to a
  local optimum, not the one-shot polish's few rounds);
- then rounds of iterated local search from the best plan: a kick (a few
  of evolution's mutation operators) and a descent, kept when better;
- every :data:`RESAMPLE_EVERY` rounds, fresh decodings by the policy: samples
  at a temperature cycled over :data:`TEMPERATURES` and refinements of the
  best plan (each unit re-decided given the others); the best new row, when
  within :data:`gnn.candidates.POLISH_GAP` of the best, is descended from
  (a basin the kicks would not reach).

Everything is scored by the search model, or by the simulator itself when a
time budget (and no evaluation budget) leaves room for enough of its
estimates, as evolution screens (:func:`placer.search.phases.screen_exactly`).
Given a seed and an evaluation budget the result is deterministic.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from placer.cost import Problem
from placer.search.base import Budget

__all__ = ["refine", "TEMPERATURES", "RESAMPLE_EVERY", "KICK_RATE"]

#: sampling temperatures of the policy's fresh decodings, in turn
TEMPERATURES = (1.0, 1.6, 0.7, 2.5)
#: iterated-local-search rounds between two fresh decodings by the policy
RESAMPLE_EVERY = 4
#: mean mutation operators in one kick (evolution's children get 1.5)
KICK_RATE = 3.0
#: plans of different shapes descended from before the kicks start
STARTS = 3
#: kicks now and then start from one of this many best plans
ELITE = 8
#: op-rows one descent round may hand the cost model (neighbours x ops)
DESCENT_WORK = 40_000


def refine(problem: Problem, cost_model, budget: Budget, starts: list, *, policy,
           seed: int = 0, samples: int = 16, batch: int = 4, max_units: int = 96,
           microbatches: list[int], schedules: list[str], final: str | None = "simulator",
           first=None, first_value: float | None = None, report: Callable | None = None,
           fixed: dict | None = None):
    """Search from ``starts`` (the one-shot :class:`gnn.strategies.Candidate`
    s, best first) until ``budget`` ends; returns the best
    :class:`placer.Plan` and where it came from (``"anytime"`` or the
    start's source). ``first``: the plan already chosen (the one-shot
    result, ``first_value`` its objective by ``final``), which the result is
    never worse than by ``final``; ``report(objective, model, message)`` is
    called on each improvement. Graphs of more than :data:`COARSEN_ABOVE`
    ops are searched coarsened to :data:`COARSEN_TO` (as evolution does;
    the reports then name the model ``"NAME-coarse"``: its figures are the
    coarse graph's); the finalists are then ranked on the whole graph.
    ``fixed``: the strategy's fixed ``microbatches`` and ``schedule``, for
    the heuristics whose plans join the starts (:func:`_heuristics`)."""
    from placer.space import Space
    from placer.search.evaluate import Evaluator
    from placer.search.phases import EXACT_SCREEN_EVALS, polish_with, screen_exactly
    from placer.search.common import Coarse
    from placer.search.ranker import RankPolicy, final_ranker, hold_back, rank_finalists, reserve
    coarse = Coarse(problem, COARSEN_TO if problem.n_ops > COARSEN_ABOVE else None)
    inner = coarse.problem
    space = Space(inner, microbatches, schedules)
    rng = np.random.default_rng([int(seed), 0xA11, 26])
    genomes = [_genome(space, coarse, c.to_plan(problem, "rl"), c.source) for c in starts]
    if first is not None:
        genomes.append(_genome(space, coarse, first, "first"))
    with reserve(budget, RESERVE), \
            Evaluator(space, budget.meter(cost_model), budget) as evaluate:
        # the simulator screens where evolution's would, for the share of
        # its estimates that fits in what the first plan left of the budget
        evals = None if budget.time is None else \
            int(EXACT_SCREEN_EVALS * budget.remaining_time / budget.time)
        screen = screen_exactly(inner, evaluate, cost_model,
                                [g.to_plan(space) for g in genomes[:2]], budget, final,
                                evals=evals)
        exact = coarse.members is None and (getattr(screen, "name", None) == final
                                            or final is None)
        # the heuristics' plans on the whole graph: starts, and finalists of their own
        heuristics = _heuristics(problem, cost_model, budget, seed, fixed or {})
        found = [_genome(space, coarse, plan, name) for name, plan, _ in heuristics]
        genomes += found
        share = 0.0 if exact else FINAL_SHARE
        with hold_back(budget, share):
            label = "" if coarse.members is None else "-coarse"
            search = _Search(space, evaluate, budget, rng, report, label)
            search.add(genomes)
            search.add(_layouts(space))
            search.flush()
            search.run(policy, inner, samples=samples, batch=batch, max_units=max_units)
        pool = search.ranked()
    if not pool:
        return None, None

    def whole(g):
        plan = g.to_plan(space, "rl")
        return plan.expand(coarse.graph) if coarse.members is not None else plan
    if exact:
        best = pool[0][1]
        return whole(best), best.origin
    # the screening model's best few ranked by the final model on the whole
    # graph, against the first plan's figure by it; then the heuristics' own
    # plans (the best by the search model first) and the best of each other
    # shape: where the two models disagree (an expert-parallel stack on two
    # speed classes: the analytical model's four best all slower by the
    # simulator than the first plan, pipeline_dp's faster), the search
    # model's favourites alone can all lose to the first plan
    finalists = [g for _, g in pool[:FINAL_K]]
    plans = [whole(g) for g in finalists]
    keys = {g.key() for _, g in pool[:FINAL_K]}
    order = sorted(range(len(heuristics)), key=lambda k: heuristics[k][2])[:FINAL_K]
    for k in order[::-1]:
        name, plan, _ = heuristics[k]
        if coarse.members is not None:
            finalists.insert(1, _Origin(name))         # its whole-graph plan
            plans.insert(1, plan)
        elif found[k].key() not in keys:               # a genome: polished if it wins
            keys.add(found[k].key())
            finalists.insert(1, found[k])
            plans.insert(1, whole(found[k]))
    for _, g in search.starts():
        if g.key() not in keys:
            keys.add(g.key())
            finalists.append(g)
            plans.append(whole(g))
    if first is not None and first_value is None:     # not ranked by it yet
        finalists.append(None)
        plans.append(first)
    ranker = final_ranker(final, cost_model, budget)
    i, value = rank_finalists(ranker, problem, plans, budget, policy=RankPolicy(keep=1))
    if value is None:       # one finalist, or none the time allowed: the first scored
        i, value = 0, float(ranker.estimate(problem, plans[0]).objective)
    if finalists[i] is None or (first_value is not None and not value < first_value):
        return first, "first"
    best, plan = finalists[i], plans[i]
    if isinstance(best, _Origin):
        return plan, best.origin
    if coarse.members is None:
        polished = polish_with(space, ranker, budget, best, rng)
        if polished is not None:
            best, plan = polished, polished.to_plan(space, "rl")
    return plan, best.origin


class _Origin:
    """A finalist that is a whole-graph plan already (a heuristic's)."""

    def __init__(self, origin: str):
        self.origin = origin


#: share of the budget left after the first plan that the heuristics may use
HEURISTIC_SHARE = 0.2
#: evolution's seeding heuristics, in the order they run: the one most of
#: evolution's results on the benchmarks' cases start from first, the
#: slowest on big graphs (list scheduling) last; the one-device plans are
#: among the one-shot baselines already
HEURISTICS = ("pipeline_dp", "even_pipeline", "partition", "m_topo", "heft", "m_sct", "m_etf")


def _heuristics(problem, cost_model, budget: Budget, seed: int, fixed: dict) -> list:
    """``(name, plan, search objective)`` of evolution's seeding heuristics
    (HEFT, m-SCT, pipeline_dp, ...) on ``problem``, together within
    :data:`HEURISTIC_SHARE` of what is left of ``budget`` (as evolution
    shares its seeding time); evolution's results often start from one."""
    from placer.search.phases import SeedPool
    out = []
    pool = SeedPool(budget, HEURISTIC_SHARE, len(HEURISTICS))
    for name in HEURISTICS:
        # a heuristic cannot be stopped mid-run (list scheduling on 2,000
        # ops takes over a second): none starts after the share is spent
        if budget.exhausted() or (pool.deadline is not None
                                  and budget.elapsed >= pool.deadline):
            break
        # a strategy may score a plan or two past its own budget: none runs
        # that could eat into what the search keeps for its final ranking
        if budget.remaining_evaluations <= RESERVE + 4:
            break
        plan = pool.run(name, problem, cost_model, seed, **fixed)
        if plan is None:
            continue
        value = plan.predicted.get("objective", plan.predicted.get("step_time"))
        # a NaN from the model comes back as None: infinitely slow
        out.append((name, plan, math.inf if value is None else float(value)))
    return out


#: graphs of more ops than this are searched coarsened (evolution's default)
COARSEN_ABOVE = 1500
#: to this many ops
COARSEN_TO = 400


def _genome(space, coarse, plan, origin: str):
    """``plan`` (over the whole graph) as a genome of ``space`` (over the
    coarse graph: each coarse op on the devices most of its ops are on)."""
    from placer.space import OpGenome
    if coarse.members is None:
        return OpGenome.from_plan(space, plan, origin)
    problem = coarse.fine
    index = problem.device_index
    fine = [tuple(plan.placement[op]) for op in problem.ids]
    assign = np.empty(space.n_ops, dtype=np.int64)
    for j, idx in enumerate(coarse.members):
        devs = [fine[i] for i in idx.tolist()]
        most = max(set(devs), key=lambda d: (devs.count(d), -devs.index(d)))
        assign[j] = space.table.id([index[d] for d in most])
    return OpGenome(space.repair(assign), int(plan.microbatches), plan.schedule, origin)


def _layouts(space) -> list:
    """The simple reference plans and evolution's balanced layouts as
    genomes (one-shot ``rl`` scored them too, but kept only its best few):
    starts of other shapes for the descents."""
    from placer.space import OpGenome
    from .candidates import baseline_rows
    pipes, layouts, stages = baseline_rows(space.problem, space)
    ms = space.microbatch_choices
    pipes = np.concatenate([pipes, _pipelines(space.problem)])
    out = [OpGenome(space.repair(np.asarray(a, dtype=np.int64)), ms[-1],
                    space.schedule_choices[0], "baseline") for a in pipes]
    out += [OpGenome(np.asarray(a, dtype=np.int64), ms[-1] if s > 1 else ms[0],
                     space.schedule_choices[0], "baseline")
            for a, s in zip(layouts, stages.tolist())]
    return out


#: finalists ranked by the final model
FINAL_K = 4
#: evaluations kept for the final ranking and the report of the result
RESERVE = 2 * FINAL_K + STARTS + 3
#: share of the budget kept for the final model's descent from the winner
FINAL_SHARE = 0.1


def _pipelines(problem) -> np.ndarray:
    """Even pipelines over the first ``k`` devices for every ``k`` from 2 to
    :data:`MAX_PIPELINE` (:func:`gnn.problems.even_pipelines`); the one-shot
    baselines have only ``k`` a power of two (a site of three fast GPUs is
    a pipeline of three)."""
    from .problems import even_pipelines
    return even_pipelines(problem, range(2, min(problem.n_devices, MAX_PIPELINE) + 1))


#: the deepest of :func:`_pipelines`
MAX_PIPELINE = 16


class _Search:
    """The pool of scored genomes and the iterated local search over it."""

    def __init__(self, space, evaluate, budget: Budget, rng, report, label: str = ""):
        self.space, self.evaluate, self.budget, self.rng = space, evaluate, budget, rng
        self.report, self.label = report, label
        self.pool: dict[bytes, tuple[float, object]] = {}
        self.best = math.inf
        self.news = ""
        n = space.n_ops
        self.limit = max(8, min(64, DESCENT_WORK // max(n, 1)))

    def model_name(self) -> str | None:
        name = getattr(self.evaluate.model, "name", None)
        return None if name is None else name + self.label

    def add(self, genomes: list) -> np.ndarray:
        """Score ``genomes``, keep them; their scores (``inf``: not scored)."""
        if not genomes:
            return np.zeros(0)
        values = self.evaluate(genomes)
        for g, v in zip(genomes, values.tolist()):
            if not np.isfinite(v):
                continue
            k = g.key()
            if k not in self.pool or v < self.pool[k][0]:
                self.pool[k] = (float(v), g)
            if v < self.best * (1 - 1e-9):
                self.best = float(v)
                self.news = g.origin or "anytime"
        return values

    def flush(self) -> None:
        """Report the best so far if it improved since the last report (once
        per descent, not per step: a descent takes hundreds of small steps)."""
        if self.news and self.report is not None:
            self.report(self.best, self.model_name(), self.news)
        self.news = ""

    def ranked(self) -> list[tuple[float, object]]:
        return sorted(self.pool.values(), key=lambda v: v[0])

    def spent(self) -> bool:
        return self.budget.exhausted()

    def descend(self, g, value: float, origin: str = "anytime"):
        """Steepest descent from ``g`` (scored ``value``) to a local optimum
        or the end of the budget; returns ``(genome, value)``."""
        from placer.space import neighbourhood
        from .candidates import replica_moves
        while not self.spent():
            cands = neighbourhood(self.space, g, self.rng, self.limit)
            cands += replica_moves(self.space, g, self.rng, max(self.limit // 4, 4))
            if not cands:
                break
            for c in cands:
                c.origin = origin
            values = self.add(cands)
            i = int(np.argmin(values))
            if not values[i] < value * (1 - 1e-9):
                break
            g, value = cands[i], float(values[i])
        self.flush()
        return g, value

    def starts(self) -> list:
        """The best plan and the best of each other shape (how many groups
        and whether data-parallel), at most :data:`STARTS`, best first."""
        D = self.space.n_devices
        out, shapes = [], set()
        for value, g in self.ranked():
            shape = (len(np.unique(g.assign)), bool((g.assign >= D).any()))
            if shape not in shapes:
                shapes.add(shape)
                out.append((value, g))
            if len(out) >= STARTS:
                break
        return out

    def run(self, policy, problem, *, samples, batch, max_units) -> None:
        """Descend from the best starts, then kick and descend, with fresh
        decodings by the policy now and then, until the budget ends."""
        from placer.space import mutate
        for value, g in self.starts():
            if self.spent():
                return
            self.descend(g, value)
        decoder = None
        round_ = 0
        while not self.spent():
            round_ += 1
            ranked = self.ranked()
            value, current = ranked[0]
            if round_ % 3 == 0 and len(ranked) > 1:
                # now and then from another of the best: a second basin
                value, current = ranked[int(self.rng.integers(1, min(ELITE, len(ranked))))]
            if round_ % RESAMPLE_EVERY == 0:
                if decoder is None:
                    decoder = _Decoder(policy, problem, max_units)
                temperature = TEMPERATURES[(round_ // RESAMPLE_EVERY - 1) % len(TEMPERATURES)]
                fresh = decoder.rows(current, self.space, self.rng, samples, batch,
                                     temperature)
                values = self.add(fresh)
                if len(values) and np.isfinite(values).any():
                    i = int(np.argmin(values))
                    from .candidates import POLISH_GAP
                    if values[i] <= POLISH_GAP * value:
                        self.descend(fresh[i], float(values[i]), "anytime-policy")
                continue
            kick = mutate(self.space, current.copy(), self.rng, rate=KICK_RATE)
            kick.origin = "anytime"
            v = self.add([kick])
            if not len(v) or not np.isfinite(v[0]):
                continue
            self.descend(kick, float(v[0]))


class _Decoder:
    """The policy's decoder on one problem, rows as evolution genomes."""

    def __init__(self, policy, problem, max_units):
        import torch
        from .features import encode_problem
        from .model import FastDecoder
        from .candidates import OneThread
        self.pg = encode_problem(problem, max_units)
        with torch.no_grad(), OneThread():
            self.decoder = FastDecoder(policy, self.pg)

    def rows(self, current, space, rng, samples: int, batch: int, temperature: float) -> list:
        """``samples`` fresh samples at ``temperature`` and ``batch`` refinements
        of ``current`` (single-device ops only: the policy places each op on
        one device), at ``current``'s microbatches and schedule."""
        from placer.space import OpGenome
        from .candidates import OneThread, unit_row
        D = space.n_devices
        out = []
        with OneThread():
            if samples > 0:
                rows = self.decoder.decode(samples, greedy=0, rng=rng, temperature=temperature)
                out += list(self.pg.expand(rows))
            if batch > 0 and current.assign.max() < D:
                rows = self.decoder.decode(batch, greedy=0, rng=rng, temperature=temperature,
                                           context=unit_row(self.pg, current.assign))
                out += list(self.pg.expand(rows))
        return [OpGenome(space.repair(np.asarray(a, dtype=np.int64)), current.microbatches,
                         current.schedule, "anytime-policy") for a in out]

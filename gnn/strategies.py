"""The learned strategies ``rl`` and ``hybrid``, registered with placer.search.

- ``rl``: one encoder pass, then the greedy placement and samples decoded
  together (:class:`gnn.model.FastDecoder`), the simple reference plans and
  evolution's balanced stage/replica layouts (data-parallel ones included)
  beside them, optionally Placeto-style refinements of the best; all
  screened with the cost model's array path at each microbatch count (one
  schedule, one call), the best few settled at every count and schedule
  and re-ranked by the simulator's array path, with the steps of a short
  descent from the policy's own best plan (``polish``) and the last step
  of one that makes ops data-parallel over adjacent stages' devices from
  the best multi-device plan (``widen``); only the winner becomes a Plan.
  ``finetune`` seconds (or ``finetune_steps`` updates) of REINFORCE on the
  target problem follow when asked, and the tuned policy's candidates join
  the shipped policy's. That plan is reported at once (progress message
  ``"first plan"``); with a time or evaluation budget ``rl`` then searches
  on from its best plans until the budget ends (:mod:`gnn.anytime`: local
  descents, kicks, fresh decodings at other temperatures) and returns the
  best by the final model, never worse than the first plan; without a
  budget, or with ``anytime=False``, the first plan is the result.
- ``hybrid``: ``rl``'s candidates (the steps of its polish included) are
  reported as progress first and ranked by the simulator; the ``evolution``
  strategy spends the rest of the budget on its own search from its own
  seeds (its final ranking and polish included), and the result is the
  better by the simulator of evolution's plan and the policy's best
  (``policy_slots`` hands the policy's plans to evolution instead, into
  its population and final ranking).

>>> from placer.search import get_strategy
>>> type(get_strategy("rl")).__name__
'RL'
"""

from __future__ import annotations

import math

import numpy as np
import torch

from placer.cost import INFEASIBLE, Problem
from placer.errors import StrategyError
from placer.search.arrays import PlanArrays
from placer.search.base import (Budget, Progress, Strategy, get_strategy,
                                register_strategy)
from placer.search.ranker import RankPolicy, final_ranker, rank_finalists

from .candidates import (POLISH_GAP, OneThread, baseline_rows, heft_rows, replica_moves,
                         unit_row)
from .checkpoint import default_checkpoint, load_policy
from .features import encode_problem
from .model import FastDecoder
from .problems import best_times, reference, reward, times_at

__all__ = ["RL", "Hybrid", "Candidate", "policy_plans"]

_CACHE: dict = {}


def _policy(checkpoint):
    key = str(checkpoint if checkpoint is not None else default_checkpoint())
    policy = _CACHE.get(key)
    if policy is None:
        policy = _CACHE[key] = load_policy(checkpoint)
    return policy


def _finetune(policy, problem, cost_model, *, seconds, steps, samples, max_units, seed,
              lr=3e-4, budget: Budget | None = None):
    """REINFORCE on one problem; returns a fine-tuned copy of ``policy``."""
    import copy
    import time
    tuned = copy.deepcopy(policy).train()
    opt = torch.optim.Adam(tuned.parameters(), lr=lr)
    pg = encode_problem(problem, max_units)
    n_dec = max(int((pg.tie == np.arange(pg.n_units)).sum()), 1)
    ref, _ = reference(cost_model, problem)
    choices = _choices(problem)
    gen = torch.Generator().manual_seed(10_007 * seed + 1)
    t0 = time.perf_counter()
    step = 0
    while True:
        if steps is not None and step >= steps:
            break
        if seconds is not None and time.perf_counter() - t0 >= seconds:
            break
        if budget is not None and budget.exhausted():
            break
        out = tuned.sample(pg, max(samples, 2), generator=gen)
        t, _, _ = best_times(cost_model, problem, pg.expand(out.actions.numpy()), choices)
        r = reward(t, ref)
        adv = torch.as_tensor((r - r.mean()) / (r.std() + 0.1), dtype=torch.float32)
        loss = -(adv * out.log_prob).mean() / n_dec - 0.003 * out.entropy.mean() / n_dec
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(tuned.parameters(), 1.0)
        opt.step()
        step += 1
    return tuned.eval()


def _choices(problem) -> list[int]:
    from .problems import microbatch_choices
    return microbatch_choices(problem)


#: one scored plan of :func:`policy_plans` (``objective`` by the search
#: model, ``origin`` where it came from; also read as ``source``)
Candidate = PlanArrays


def _space(problem, choices, schedules):
    """The plan space's :class:`~placer.space.Space` of ``problem`` (its
    group table numbers data-parallel sets, its moves polish plans)."""
    from placer.space import Space
    return Space(problem, choices, schedules)


def policy_plans(policy, problem: Problem, cost_model, budget: Budget, *, seed: int = 0,
                 samples: int = 16, batch: int = 4, refine: int = 0, max_units: int = 96,
                 temperature: float = 1.0, microbatches=None, schedules=("1f1b",),
                 keep: int = 1, baselines: bool = True, polish: int = 0,
                 settle: int = 4, layout_devices: int = 16,
                 polish_limit: int = 48, polish_keep: int = 3,
                 widen: bool = True, cuts: bool = True,
                 every_schedule: bool = True, branches: bool = True) -> list[Candidate]:
    """Decode and score placements; returns the ``keep`` best distinct
    :class:`Candidate` s, best first. ``source`` says where the plan came from:
    ``"policy"`` (one-shot decoding), ``"refined"`` (a refinement round),
    ``"baseline"`` or ``"polished"`` (local search from the best).

    One encoder pass; one batched decoding of the greedy placement and
    ``samples`` sampled ones (:class:`gnn.model.FastDecoder`); with
    ``baselines`` the simple reference plans (one device, even pipelines)
    and evolution's balanced stage/replica layouts (data-parallel ones
    included: the policy itself places each op on one device) join them;
    then ``refine`` rounds re-decide every unit of the best single-device
    plan so far given the others (greedy plus ``batch`` samples, capped by
    ``samples``); then at most ``polish`` rounds of evolution's steepest
    descent (stage boundaries, boundary ops, microbatches) from the
    policy's own best plan (see :class:`RL`; its steps are kept besides the
    ``keep`` best) and, with ``widen``, as many rounds of a descent by
    :func:`replica_moves` alone (ops made data-parallel over their stage's
    and an adjacent stage's devices) from the best plan over several
    devices of any source (its last step kept; with ``every_schedule``
    also from its start at the other schedules); with ``cuts``, before the
    polish, :func:`_cut_descent` from the best plan over several devices
    (:data:`CUT_OPS`, :data:`CUT_RUNS`; at each schedule); with ``branches``
    (and ``baselines``) :func:`_branch_candidates`. Everything is scored with
    ``cost_model``'s array path at each microbatch count and schedule. Stops
    early when ``budget`` is spent, keeping one evaluation for the caller's
    report of the result (the greedy plan is always scored).
    """
    pg = encode_problem(problem, max_units)
    rng = np.random.default_rng(int(seed))
    choices = list(microbatches) if microbatches else _choices(problem)
    space = _space(problem, choices, schedules)
    D = problem.n_devices
    found: dict = {}

    def compacted(A: np.ndarray):
        """``A`` with its data-parallel sets renumbered to those it uses (the
        cost model's work grows with the group table it is given)."""
        A, used = space.table.compact(A)
        return A, tuple(used)

    done: dict = {}   # row -> the (microbatches, schedule) it was scored at

    def score(A: np.ndarray, sources: list[str], ms=choices, scheds=schedules[:1]) -> None:
        """Score op-level rows ``A`` at each of ``ms`` (microbatch counts, or
        one list of them per row) x ``scheds`` (as many rows as the budget
        allows; a row is scored once per combination), keeping each row's best."""
        per_row = list(ms) if len(ms) and not np.isscalar(ms[0]) else [ms] * len(A)
        combos = np.cumsum([max(len(m) * len(scheds), 1) for m in per_row])
        room = budget.allow(int(combos[-1]) if len(combos) else 0)
        if math.isfinite(budget.remaining_evaluations):   # one left for the caller's report
            room = min(room, max(int(budget.remaining_evaluations) - 1, 0))
        n = max(int(np.searchsorted(combos, room, side="right")), 1 if budget.used == 0 else 0)
        A = A[:n]
        if not len(A):
            return
        rows, used = compacted(A)
        keys = [row.tobytes() for row in A]
        table = tuple(space.table.extra())
        for sched in scheds:
            pick, counts = [], []
            for i, key in enumerate(keys):
                seen = done.setdefault(key, set())
                for m in per_row[i]:
                    if (m, sched) not in seen:
                        seen.add((m, sched))
                        pick.append(i)
                        counts.append(m)
            if not pick:
                continue
            # every row and count of a schedule in one call of the cost model
            t = times_at(cost_model, problem, rows[pick], counts, sched, used)
            for i, m, tt in zip(pick, counts, t.tolist()):
                key = keys[i]
                if key not in found or tt < found[key].objective:
                    found[key] = PlanArrays(A[i], table, int(m), sched, sources[i], tt)

    # Screening scores every row at the first schedule only, in one call of
    # the cost model: the policy's rows and the simple baselines at every
    # microbatch count, a layout at one count (the fewest for data
    # parallelism alone, the most for a pipeline: its bubble). The other
    # schedule rarely wins and each call costs; the best few rows are then
    # scored at every combination (``settle``).
    with torch.no_grad(), OneThread():
        decoder = FastDecoder(policy, pg)
        A = pg.expand(decoder.decode(1 + samples, greedy=1, rng=rng, temperature=temperature))
        score(*_screening_rows(problem, space, A, choices, baselines, layout_devices))
        for _ in range(max(refine, 0)):
            single = [v for v in found.values() if v.assign.max() < D]
            if budget.exhausted() or not single:
                break
            best = min(single, key=_objective)
            k = 1 + min(batch, samples)
            rows = decoder.decode(k, greedy=1, rng=rng, temperature=temperature,
                                  context=unit_row(pg, best.assign))
            # near the plan they refine: scored at its microbatch count (settled below)
            score(pg.expand(rows), ["refined"] * k, ms=[best.microbatches])
    top = sorted(found.values(), key=_objective)[:max(settle, keep)]
    if top and not budget.exhausted():
        score(np.stack([v.assign for v in top]), [v.origin for v in top], choices, schedules)
    if branches and baselines and not budget.exhausted():
        _branch_candidates(problem, space, score, done, found, choices)
    if cuts and not budget.exhausted():
        _cut_descents(space, cost_model, problem, budget, found, schedules)
    out = _distinct(sorted(found.values(), key=_objective), keep)
    if polish > 0 and not budget.exhausted():
        out = _descents(space, cost_model, problem, budget, found, out, rng, schedules,
                        polish, polish_limit, polish_keep, widen, every_schedule)
    # all over the table as it ended (each was made over the part of it
    # numbered by then)
    table = tuple(space.table.extra())
    return [c.replace(groups=table) for c in out]


def _objective(c: Candidate) -> float:
    """A candidate's objective (the sort key of the candidates)."""
    return c.objective


def _candidate(space, objective: float, row: np.ndarray, microbatches: int, schedule: str,
               origin: str) -> Candidate:
    """A :class:`Candidate` of :func:`policy_plans` over ``space``'s group
    table as it is now."""
    return PlanArrays(row, tuple(space.table.extra()), microbatches, schedule, origin,
                      objective)


def _descents(space, cost_model, problem, budget: Budget, found: dict, out: list, rng,
              schedules, polish: int, polish_limit: int, polish_keep: int, widen: bool,
              every_schedule: bool) -> list:
    """:func:`policy_plans`' descents: ``polish`` rounds of :func:`_polish`
    from the policy's own best plan and, with ``widen``, of the widening
    descent from the best plan over several devices (also at the other
    ``schedules`` with ``every_schedule``); returns ``out`` (the kept
    candidates, best first) with their steps joined."""
    # The policy's own best plan is the one local search can mend (baselines
    # are balanced already, or cut where it is cheap); one op-level plan
    # over a single device has only microbatch counts to change, which
    # settling covered. Each step of the descent joins the kept plans rather
    # than displacing one: along it the search model keeps improving where
    # the final model often does not.
    own = [v for v in found.values() if v.origin in ("policy", "refined")]
    starts = []            # (start, widen)
    if own:
        start = min(own, key=_objective)
        # a few rounds of descent gain a few percent to ~15% (measured on
        # the benchmark's cases): a start further behind the best is skipped
        if start.objective <= POLISH_GAP * out[0].objective:
            starts.append((start, False))
    if widen:
        # the best plan over several devices, whatever its source (a
        # baseline pipeline is balanced or cut where it is cheap, but
        # one of its ops may gain from being data-parallel), descended
        # from with the replica moves as well
        multi = [v for v in found.values() if len(np.unique(v.assign)) > 1
                 and v.origin != "branches"]
        best = min(multi, key=_objective) if multi else None
        if best is not None and best.objective <= POLISH_GAP * out[0].objective:
            starts.append((best, True))
    # an infeasible start is descended from only when nothing found
    # fits: the descent then lowers the memory excess first (widening,
    # which copies parameters, is left out then)
    fits = out[0].objective < INFEASIBLE
    # the widening start also at the other schedules: a descent keeps its
    # schedule, and the two models disagree on which schedule a plan
    # prefers (experts-e8-l4@classes-d8: 1F1B's descent 20.71 ms by the
    # simulator, GPipe's 22.00); the policy's own start at its schedule
    # only (at both, no one-shot plan of the 27 benchmark cases was better,
    # and it is a descent more)
    starts = [(v, wide) for start, wide in starts
              for v in _at_schedules(cost_model, problem, space, start,
                                     schedules if every_schedule and wide else [start.schedule])]
    for start, wide in starts:
        if start.objective >= INFEASIBLE and (fits or wide):
            continue
        if len(np.unique(start.assign)) < 2 or budget.exhausted():
            continue
        # the widening descent's last step only: its earlier ones are
        # its start with fewer ops widened (each a simulation to rank)
        steps = _polish(space, cost_model, problem, budget, start, rng, polish,
                        polish_limit, widen=wide)[:1 if wide else polish_keep]
        keys = {v.assign.tobytes() for v in steps}
        out = sorted([v for v in out if v.assign.tobytes() not in keys] + steps,
                     key=_objective)
    return out


def _branch_candidates(problem, space, score, done: dict, found: dict, choices) -> None:
    """The branch-spread plans of :func:`gnn.branches.branch_rows` not scored
    yet (source ``"branches"``), scored by :func:`policy_plans`' ``score``
    at the :data:`BRANCH_COUNTS` largest microbatch counts (the first
    schedule), the best
    :data:`BRANCH_KEEP` of them kept in ``found``."""
    from .branches import branch_rows
    rows = [r for r in branch_rows(problem, space) if r.tobytes() not in done]
    if rows:
        score(np.stack(rows), ["branches"] * len(rows), choices[-BRANCH_COUNTS:])
    _prune_source(found, "branches", BRANCH_KEEP)


#: branch-spread plans (:func:`gnn.branches.branch_rows`) kept among the
#: finalists: the analytical model prices them 1.2-1.4x the simulator's
#: figure and the chains ~1.05x, so more of them would push the chains'
#: descents out of the final ranking (experts-e8-l4 on regions-d8-r4: 28.99
#: -> 31.17 ms with all of them kept)
BRANCH_KEEP = 2
#: the largest microbatch counts the branch-spread plans are screened at
#: (each winner of the benchmark's cases is at the largest)
BRANCH_COUNTS = 1


def _prune_source(found: dict, source: str, keep: int) -> None:
    """Drop from ``found`` all but the ``keep`` best plans of ``source``
    (distinct by objective, as the finalists are)."""
    mine = sorted((v for v in found.values() if v.origin == source), key=_objective)
    kept = {id(v) for v in _distinct(mine, keep)}
    for key in [k for k, v in found.items() if v.origin == source and id(v) not in kept]:
        del found[key]


def _screening_rows(problem, space, A: np.ndarray, choices: list[int], baselines: bool,
                    layout_devices: int) -> tuple:
    """``(rows, sources, counts)`` that :func:`policy_plans` screens: the
    policy's decoded rows ``A`` and, with ``baselines``, the baseline rows
    (:func:`gnn.candidates.baseline_rows`, HEFT's), each with the
    microbatch counts it is screened at."""
    sources = ["policy"] * len(A)
    counts = [choices] * len(A)
    heft = A[:0]
    if baselines:
        pipes, layouts, stages = baseline_rows(problem, space, layout_devices)
        A = np.concatenate([A, pipes, layouts]) if len(layouts) else np.concatenate([A, pipes])
        sources += ["baseline"] * (len(pipes) + len(layouts))
        counts += [choices] * len(pipes)
        counts += [[choices[-1]] if s > 1 else [choices[0]] for s in stages.tolist()]
        heft = heft_rows(problem)
        A = np.concatenate([A, heft])
        sources += ["baseline"] * len(heft)
        counts += [choices] * len(heft)
    # a scattered row (its ops switching devices hundreds of times, as an
    # even pipeline of an interleaved graph does) costs the cost model in
    # proportion to its runs at every count: it is screened at the most
    # microbatches (which hide the most transfers), settled at every
    # count if it leads
    runs = 1 + np.count_nonzero(A[:, 1:] != A[:, :-1], axis=1)
    if len(heft):       # HEFT's plan interleaves by design: every count
        runs[len(A) - len(heft):] = 0
    counts = [c if r <= SCATTERED_RUNS else c[-1:] for c, r in zip(counts, runs.tolist())]
    return A, sources, counts


#: graphs of at most this many ops get :func:`_cut_descents` (its work
#: grows with ops x positions tried)
CUT_OPS = 256
#: rounds of :func:`_cut_descent` (each moves one boundary; 2 since the
#: branch-spread plans: no one-shot plan of the 27 benchmark cases changed
#: from 4, and each round is a cost-model call of up to :data:`CUT_ROWS` rows)
CUT_ROUNDS = 2
#: rows one round of :func:`_cut_descent` scores (positions spread evenly
#: over the boundaries)
CUT_ROWS = 128
#: plans of at most this many runs get :func:`_cut_descents` (a cost-model
#: call per boundary: HEFT's interleaved plan has hundreds)
CUT_RUNS = 16


def _runs(row: np.ndarray) -> int:
    """Stretches of the order on one device (or group) in ``row``."""
    return 1 + int(np.count_nonzero(row[1:] != row[:-1]))


def _cut_descents(space, cost_model, problem, budget: Budget, found: dict, schedules) -> None:
    """A :func:`_cut_descent` from the best plan over several devices
    (any source; at each schedule) on graphs of at most :data:`CUT_OPS`
    ops; improved plans join ``found`` (row bytes -> candidate) as
    ``"polished"``."""
    if problem.n_ops > CUT_OPS:
        return
    # not from a branch-spread plan: the analytical model prices them
    # apart from the simulator (see :data:`BRANCH_KEEP`)
    multi = [v for v in found.values() if 1 < _runs(v.assign) <= CUT_RUNS
             and v.objective < INFEASIBLE and v.origin != "branches"]
    if not multi:
        return
    best = min(multi, key=_objective)
    for start in _at_schedules(cost_model, problem, space, best, schedules):
        if budget.exhausted():
            break
        v = _cut_descent(space, cost_model, problem, budget, start, CUT_ROUNDS)
        key = v.assign.tobytes()
        if v is not start and (key not in found or v.objective < found[key].objective):
            found[key] = v


def _cut_descent(space, cost_model, problem, budget: Budget, start: Candidate,
                 rounds: int = 3) -> Candidate:
    """Steepest descent over the positions of the boundaries between runs
    of ``start``'s row (a candidate of :func:`policy_plans`): each round moves the one boundary
    whose move to a position between its neighbours improves most (at most
    :data:`CUT_ROWS` rows a round, spread evenly over the boundaries and
    their ranges; one cost-model call); the result (source
    ``"polished"``), or ``start`` when nothing improved. The memetic
    neighbourhood moves a boundary by a few ops a step; where the two
    stages' sizes are far from the best cut (a 2-stage pipeline of an
    expert stack on a pair of GPUs: the even split's 31.8 ms, the best
    cut's 29.0 ms by the simulator) three rounds of it do not get there."""
    from placer.space import compact
    row, m, sched = start.assign, start.microbatches, start.schedule
    best, improved = start.objective, False
    for _ in range(rounds):
        bounds = np.r_[np.flatnonzero(np.r_[True, row[1:] != row[:-1]]), len(row)]
        B = len(bounds) - 2                        # boundaries between runs
        per = max(CUT_ROWS // max(B, 1), 4)
        rows = []
        for j in range(1, B + 1):
            lo, pos, hi = int(bounds[j - 1]), int(bounds[j]), int(bounds[j + 1])
            cand = np.unique(np.linspace(lo + 1, hi - 1, per).round().astype(int))
            cand = cand[cand != pos]
            span = np.arange(lo, hi)
            block = np.repeat(row[None], len(cand), axis=0)
            block[:, lo:hi] = np.where(span[None] < cand[:, None], row[lo], row[pos])
            rows.append(block)
        rows = np.concatenate(rows) if rows else row[None, :0]
        room = budget.allow(len(rows))
        if math.isfinite(budget.remaining_evaluations):
            # at most a quarter of what is left a round: the polish, the
            # final ranking and the caller's report come after
            room = min(room, int(budget.remaining_evaluations) // 4)
        rows = rows[:room]
        if not len(rows):
            break
        if space.has_colocation:        # every row at once (a row's repair is rows[rep])
            rows = rows[:, space.rep]
        A, used = compact(rows, space)
        v = times_at(cost_model, problem, A, [m] * len(A), sched, tuple(used))
        i = int(np.argmin(v))
        if not v[i] < best * (1 - 1e-9):
            break
        best, row, improved = float(v[i]), rows[i], True
    return _candidate(space, best, row, m, sched, "polished") if improved else start


def _at_schedules(cost_model, problem, space, start: Candidate,
                  schedules) -> list[Candidate]:
    """``start`` (a candidate of :func:`policy_plans`) and the same row and
    count at each other of ``schedules``, scored by ``cost_model``."""
    from placer.space import compact
    out = [start]
    for sched in schedules:
        if sched != start.schedule:
            rows, used = compact(start.assign[None], space)
            t = times_at(cost_model, problem, rows, [start.microbatches], sched, tuple(used))
            out.append(start.replace(objective=float(t[0]), schedule=sched))
    return out


def _distinct(ranked: list, keep: int) -> list:
    """The first ``keep`` of ``ranked`` (candidates, best first) with
    objectives apart by over a billionth: equal figures are
    nearly always one plan on interchangeable devices (the one-device plan on
    each of four equal GPUs), which would fill every finalist's place."""
    out: list = []
    for v in ranked:
        if len(out) >= keep:
            break
        if not any(abs(v.objective - u.objective) <= 1e-9 * abs(u.objective) for u in out):
            out.append(v)
    return out


#: runs (stretches of the topological order on one device) above which a
#: decoded row is screened at one microbatch count, not every one
SCATTERED_RUNS = 64
#: op-rows one polish round may hand the cost model (neighbours x ops)
POLISH_WORK = 40_000
def _polish(space, cost_model, problem, budget: Budget, start: Candidate, rng, rounds: int,
            limit: int = 48, widen: bool = False) -> list[Candidate]:
    """Steepest descent from ``start`` (a candidate of :func:`policy_plans`) over evolution's memetic
    neighbourhood (stage boundaries, boundary ops, neighbouring microbatch
    counts; the schedule kept, the finalists are settled at each), at most
    ``limit`` neighbours a round (fewer on graphs of more than
    :data:`POLISH_WORK` / ``limit`` ops), each round one cost-model call; returns the
    plan of each improving round (one per distinct row) as a candidate,
    source ``"polished"``, last (best by ``cost_model``) first."""
    from placer.space import compact
    from placer.space import OpGenome, neighbourhood
    sched = start.schedule
    # the model's cost grows with rows x ops: big graphs get fewer neighbours
    limit = max(8, min(limit, POLISH_WORK // max(problem.n_ops, 1)))
    g, best = OpGenome(start.assign.copy(), start.microbatches, sched), start.objective
    steps: list = []
    for _ in range(rounds):
        if widen:
            # only the moves evolution's memetic neighbourhood lacks (it
            # never widens a group; the policy's own descent has it)
            cands = replica_moves(space, g, rng, max(limit // 2, 8))
        else:
            cands = [c for c in neighbourhood(space, g, rng, limit) if c.schedule == sched]
        room = budget.allow(len(cands))
        if math.isfinite(budget.remaining_evaluations):   # one left for the caller's report
            room = min(room, max(int(budget.remaining_evaluations) - 1, 0))
        cands = cands[:room]
        if not cands:
            break
        rows, used = compact(np.stack([c.assign for c in cands]), space)
        v = times_at(cost_model, problem, rows, [c.microbatches for c in cands], sched,
                     tuple(used))
        i = int(np.argmin(v))
        if not v[i] < best * (1 - 1e-9):
            break
        if steps and np.array_equal(cands[i].assign, g.assign):
            steps.pop()                  # a new microbatch count: one step per row
        g, best = cands[i], float(v[i])
        steps.append(_candidate(space, best, g.assign, int(g.microbatches), sched,
                                "polished"))
    return steps[::-1]


def _merge(first: list[Candidate], second: list[Candidate], D: int) -> list[Candidate]:
    """The distinct candidates of both lists (a plan in both keeps its
    better entry), best first; ``D`` the device count. Plans are compared
    by the devices of each op: each candidate numbers its data-parallel
    sets in its own group table."""
    seen, out = set(), []
    for c in sorted(first + second, key=lambda c: c.objective):
        key = c.key(D)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


class _Learned(Strategy):
    """Options shared by the learned strategies."""

    def __init__(self, *, checkpoint=None, samples: int = 16, batch: int = 4,
                 refine: int = 0, max_units: int = 96, temperature: float = 1.0,
                 finetune: float = 0.0, finetune_steps: int | None = None,
                 baselines: bool = True, polish: int = 0, polish_limit: int = 48,
                 polish_keep: int = 3, widen: bool = True, cuts: bool = True,
                 every_schedule: bool = True, branches: bool = True, **base):
        super().__init__(**base)
        for label, value, low in (("samples", samples, 0), ("batch", batch, 1),
                                  ("max_units", max_units, 1), ("polish", polish, 0),
                                  ("polish_limit", polish_limit, 1),
                                  ("polish_keep", polish_keep, 1)):
            if int(value) != value or value < low:
                raise StrategyError(f"{label} must be a whole number >= {low}, got {value!r}",
                                    field=label)
        if not temperature > 0:
            raise StrategyError(f"temperature must be > 0, got {temperature!r}",
                                field="temperature")
        if not finetune >= 0:
            raise StrategyError(f"finetune must be >= 0 seconds, got {finetune!r}",
                                field="finetune")
        self.checkpoint = checkpoint
        self.samples, self.batch, self.refine = int(samples), int(batch), int(refine)
        self.max_units, self.temperature = int(max_units), float(temperature)
        self.finetune, self.finetune_steps = float(finetune), finetune_steps
        self.baselines = bool(baselines)
        self.polish, self.polish_limit = int(polish), int(polish_limit)
        self.polish_keep = int(polish_keep)
        self.widen, self.cuts = bool(widen), bool(cuts)
        self.every_schedule = bool(every_schedule)
        self.branches = bool(branches)

    def _candidates(self, problem, cost_model, budget, seed, keep) -> list[Candidate]:
        """The ``keep`` best distinct :class:`Candidate` s and the polish's
        steps, best first (with fine-tuning, those of the shipped and of
        the tuned policy together)."""
        policy = _policy(self.checkpoint)
        schedules = tuple(self.schedule_choices())

        def plans(policy):
            return policy_plans(policy, problem, cost_model, budget, seed=seed,
                                samples=self.samples, batch=self.batch, refine=self.refine,
                                max_units=self.max_units, temperature=self.temperature,
                                microbatches=self.microbatch_choices(problem)
                                if self.microbatches is not None else None,
                                schedules=schedules, keep=keep, baselines=self.baselines,
                                polish=self.polish, polish_limit=self.polish_limit,
                                polish_keep=self.polish_keep, widen=self.widen,
                                cuts=self.cuts, every_schedule=self.every_schedule,
                                branches=self.branches)
        if not (self.finetune > 0 or self.finetune_steps):
            return plans(policy)
        # The shipped policy's plans first: fine-tuning can end in a worse
        # basin (by the simulator) than zero-shot decoding found, and they
        # cost a fraction of its time. Both sets are returned whole: the
        # tuned policy's plans may all lead by the search model and still
        # lose by the final one.
        found = plans(policy)
        seconds = self.finetune if self.finetune > 0 else None
        if seconds is not None and budget.time is not None:
            seconds = min(seconds, 0.8 * budget.remaining_time)
        with OneThread():
            policy = _finetune(policy, problem, cost_model, seconds=seconds,
                               steps=self.finetune_steps, samples=min(max(self.samples, 2), 16),
                               max_units=self.max_units, seed=seed, budget=budget)
        if budget.exhausted():
            return found
        return _merge(found, plans(policy), problem.n_devices)

    def _plans(self, problem, cost_model, budget, seed, keep):
        """``[(search objective, Plan)]``, the ``keep`` best distinct, best first."""
        return [(c.objective, c.to_plan(problem, self.name, extra={"source": c.origin}))
                for c in self._candidates(problem, cost_model, budget, seed, keep)]


@register_strategy
class RL(_Learned):
    """Best of the policy's placements under the cost model (see the module doc).

    Options: ``checkpoint`` (stem; default the shipped policy), ``samples``
    (placements drawn besides the greedy one, 16; 0: greedy only), ``batch``
    (samples per refinement round), ``refine`` (refinement rounds, 0: on the
    benchmark's cases one round costs a quarter of the planning time and
    brings no case within 10% of evolution), ``polish`` (3: rounds of
    steepest descent over evolution's memetic neighbourhood from the
    policy's own best plan, when it spans several devices and is within
    :data:`POLISH_GAP` of the best plan; every improving step is an extra
    finalist; 0: none), ``polish_limit`` (48 neighbours a round) and
    ``polish_keep`` (how many of the descent's last steps join the
    finalists, 3), ``widen`` (True: a second descent, by
    :func:`replica_moves` only, from the best plan over several devices
    of any source within :data:`POLISH_GAP` of the best; its last step is
    a finalist), ``cuts`` (True: the boundaries of the best plan over
    several devices moved to their best positions, :func:`_cut_descent`),
    ``every_schedule`` (True: the widening descent also from its start at
    the other schedules), ``branches`` (True: plans whose parallel branches,
    experts or towers, are spread over several devices,
    :func:`gnn.branches.branch_rows`),
    ``max_units`` (decision units; larger graphs are cut into runs; the
    shipped policy was trained with 96), ``temperature``, ``baselines``
    (also score the simple reference plans and evolution's layouts, default
    True), ``finetune`` (seconds of REINFORCE on the target after the
    shipped policy's candidates are found; they are ranked with the tuned
    policy's, so fine-tuning never loses a plan zero-shot would have
    returned) or ``finetune_steps``; ``final_k`` (4) best distinct plans
    re-ranked by ``final`` (cost model name, ``"simulator"``; None: keep the search
    model's best), as evolution ranks its finalists, and more of the search
    model's best (up to ``final_pool``, 8) while their simulations stay
    within :data:`FINAL_TASKS` op replicas x microbatches in all. The plan's
    ``extra["source"]`` says whether the policy's one-shot decoding, a
    refinement round, the polish or a baseline won (``"anytime"`` or
    ``"anytime-policy"``: the anytime search, from a kick or from a fresh
    decoding; ``extra["first_source"]``: the first plan's source).

    ``anytime`` (True): with a time or evaluation budget, report the first
    plan through ``progress`` (message ``"first plan"``, by the ``final``
    model) and search on until the budget ends (:func:`gnn.anytime.refine`);
    deterministic given the seed and an evaluation budget. Without a
    budget, or False: the first plan is the result (the zero-shot figure).
    """

    name = "rl"

    def __init__(self, *, final_k: int = 4, final: str | None = "simulator", polish: int = 3,
                 anytime: bool = True, final_pool: int = 8, **options):
        super().__init__(polish=polish, **options)
        for label, value in (("final_k", final_k), ("final_pool", final_pool)):
            if int(value) != value or value < 1:
                raise StrategyError(f"{label} must be a whole number >= 1, got {value!r}",
                                    field=label)
        self.final_k, self.final = int(final_k), final
        self.final_pool = max(int(final_pool), self.final_k)
        self.anytime = bool(anytime)

    def search(self, problem, cost_model, budget, seed=0, progress=None):
        """Decode, score, keep the best; with a budget, search on from there
        until it ends (see the class doc)."""
        cost_model = budget.meter(cost_model)
        anytime = self.anytime and (budget.time is not None or budget.evaluations is not None)
        keep = self.final_pool if self.final is not None else self.final_k
        # under an evaluation budget the descents stop short of the final
        # ranking's first ``final_k`` simulations
        policy = RankPolicy(reserve=self.final_k + 1 if self.final is not None else 0,
                            at_least=self.final_k, max_tasks=FINAL_TASKS)
        with policy.hold(budget):
            found = self._candidates(problem, cost_model, budget, seed, keep=keep)
        ranker = None if self.final in (None, getattr(cost_model, "name", None)) else \
            final_ranker(self.final, cost_model, budget)
        i, value = rank_finalists(ranker, problem, found, budget, policy=policy)
        best = found[i].to_plan(problem, self.name, extra={"source": found[i].origin})
        if not anytime or _space(problem, [1], ["1f1b"]) is None:
            return self.finalize(problem, cost_model, budget, best, progress=progress)
        model = self.final if value is not None else cost_model.name
        value = found[i].objective if value is None else value
        _report(progress, self.name, budget, value, model, "first plan")
        from .anytime import refine
        choices = self.microbatch_choices(problem)
        # as many starts as before the pool (the best few and the polish's
        # steps), the first plan's among them
        starts = found[:self.final_k + self.polish_keep + 1]
        if i >= len(starts):
            starts.append(found[i])
        plan, source = refine(
            problem, cost_model, budget, starts, policy=_policy(self.checkpoint), seed=seed,
            samples=self.samples, batch=self.batch, max_units=self.max_units,
            microbatches=choices, schedules=self.schedule_choices(), final=self.final,
            first=best, first_value=value if model == self.final else None,
            fixed={"microbatches": self.microbatches, "schedule": self.schedule},
            report=lambda v, m, msg: _report(progress, self.name, budget, v, m, msg))
        if plan is None:          # nothing scored after the first plan
            plan, source = best, "first"
        plan.method = self.name
        plan.extra = dict(plan.extra or {}, source=source if source != "first"
                          else found[i].source, first_source=found[i].source)
        return self.finalize(problem, cost_model, budget, plan, progress=progress)


def _report(progress, name: str, budget: Budget, value: float, model: str | None,
            message: str) -> None:
    """A :class:`Progress` of objective ``value`` by cost model ``model``."""
    if progress is None:
        return
    feasible = bool(value < INFEASIBLE)
    progress(Progress(name, budget.used, budget.elapsed, float(value),
                      float(value) if feasible else None, feasible, message,
                      extra={"model": model}))


#: op replicas x microbatches the final model may simulate in all beyond
#: the first ``final_k`` finalists (the simulator takes about a microsecond
#: each: ~16 ms; a 114-op plan at 8 microbatches is ~900)
FINAL_TASKS = 16_000


#: the most of a budget :class:`Hybrid` spends on the policy's plans
POLICY_SHARE = 0.2


def _by_final(problem, cost_model, budget: Budget, found: list, final: str | None):
    """``(plans, values)``: the plans of ``found`` (``(search objective,
    Plan)``, best first) ranked by the ``final`` model (metered on
    ``budget``; those of them the ranking scores, within
    :data:`FINAL_TASKS`, first; None or the search model: the search's
    order), and each plan's objective by that model (the search model's
    for the plans not scored)."""
    plans = [plan for _, plan in found]
    values = [value for value, _ in found]
    ranker = final_ranker(final, cost_model, budget)
    if not plans or ranker is cost_model:
        return plans, values
    from placer.search.ranker import score_finalists
    scored = score_finalists(ranker, problem, plans, budget,
                             policy=RankPolicy(keep=0, at_least=1, max_tasks=FINAL_TASKS))
    order = sorted(range(len(scored)), key=scored.__getitem__) + list(range(len(scored),
                                                                          len(plans)))
    values = scored + values[len(scored):]
    return [plans[k] for k in order], [values[k] for k in order]


@register_strategy
class Hybrid(_Learned):
    """The policy's plans, then the ``evolution`` strategy (see the module doc).

    Options: those of ``rl`` (the same defaults but ``cuts=False``,
    ``every_schedule=False`` and ``branches=False``: the plans are ``rl``'s
    candidates, the steps of its ``polish`` descent included), ``seeds``
    (how many of the best distinct policy plans to hand over, besides the
    polished ones), ``share`` (at most this share of the budget for the
    policy, :data:`POLICY_SHARE`), ``policy_slots`` (places in evolution's
    population for the policy's plans and their descendants, besides its
    own ``population``; 0, the default: none, evolution's result is
    compared with the policy's best) and ``evolution`` (options for the evolution strategy).

    With ``policy_slots=0`` the policy's plans are ranked by evolution's
    ``final`` model (the simulator) within the policy's share, evolution
    runs without them and its result stands unless the policy's best is
    better by that model. Handed to evolution as candidates, the best by the
    search model competed in evolution's final ranking before its polish by
    the simulator, and could win it from a basin that polish leaves worse
    (dlrm.op on hetero-lab, 4,000 evaluations, seed 5: the policy's plan
    polished to 1.013 ms against evolution's partition seed's 0.980); and
    the polish drew from the generations' random stream, so the policy's
    few hundred evaluations changed it (seeds 2 and 4: 1.021x and 1.017x
    evolution). Evolution's polish now has a stream of its own.

    Why ``policy_slots=0``: with the policy's plans in its population,
    evolution's trajectory changes whether or not they help. Measured on 6
    benchmark cases (dlrm and moe on hetero-lab and edge-wireless, inception,
    unet) x 5 seeds at 4,000 evaluations, screening by either model: hybrid
    / evolution (simulator objective) was at worst 1.188 with 8 policy
    slots (no worse in 45/60 runs), 1.111 with 2 (49/60, gmean 0.992) and
    1.014 with none (55/60, gmean 1.000; the losses are the evaluations the
    policy spent). The hybrid of 2026-12-03 (the 8 plans free to fill the
    population) was 1.03-1.05x on dlrm@hetero-lab in 4 of 5 seeds: the
    policy's basin is as good by the analytical model, worse by the
    simulator. Without them hybrid's evolution is evolution's own search on
    what the policy left (a few hundred evaluations, ~1% of a time budget).
    """

    name = "hybrid"

    def __init__(self, *, seeds: int = 8, evolution: dict | None = None,
                 share: float | None = None, polish: int = 3, policy_slots: int = 0,
                 cuts: bool = False, every_schedule: bool = False, branches: bool = False,
                 **options):
        # no cut descent nor descents at every schedule by default:
        # evolution's own search moves boundaries and schedules, and the
        # evaluations they would spend are evolution's (dlrm.op on
        # hetero-lab at 4,000 evaluations, seed 2: 1.030 ms with them
        # against evolution's 0.988, 0.988 without)
        super().__init__(polish=polish, cuts=cuts, every_schedule=every_schedule,
                         branches=branches, **options)
        if int(seeds) != seeds or seeds < 1:
            raise StrategyError(f"seeds must be a whole number >= 1, got {seeds!r}",
                                field="seeds")
        share = POLICY_SHARE if share is None else share
        if not 0 < share <= 0.5:
            raise StrategyError(f"share must be in (0, 0.5], got {share!r}", field="share")
        self.seeds = int(seeds)
        self.share = float(share)
        if int(policy_slots) != policy_slots or policy_slots < 0:
            raise StrategyError(f"policy_slots must be a whole number >= 0, got "
                                f"{policy_slots!r}", field="policy_slots")
        self.policy_slots = int(policy_slots)
        self.evolution_options = dict(evolution or {})

    def search(self, problem, cost_model, budget, seed=0, progress=None):
        """The policy's plans first, then evolution within the same budget."""
        from placer.search.ranker import reserve
        metered = budget.meter(cost_model)
        evo = self._evolution()
        final = evo.config.final
        # The policy gets a small share of what is left (it needs a fraction
        # of a second, a few hundred evaluations): evolution keeps the rest.
        share = Budget(time=None if math.isinf(budget.remaining_time)
                       else budget.remaining_time * self.share,
                       evaluations=None if math.isinf(budget.remaining_evaluations)
                       else max(1, int(budget.remaining_evaluations * self.share)))
        try:
            found = self._plans(problem, share.meter(metered.inner), share, seed,
                                keep=self.seeds)
            plans, values = _by_final(problem, metered.inner, share, found, final)
        finally:
            budget.charge(share.used)
        if progress is not None and found:
            # the policy's best is the search's best so far: report it before
            # evolution spends its seeding time
            best = found[0][0]
            progress(Progress(self.name, budget.used, budget.elapsed, best, best,
                              best < INFEASIBLE, "policy", extra={"model": metered.name}))
        if self.policy_slots or not plans:
            evo.candidates = plans
            plan = evo.search(problem, metered, budget, seed=seed, progress=progress)
        else:
            # evolution's own search and final ranking (and its polish of
            # the winner by the final model), then its result against the
            # policy's best by that model: kept for the comparison, an
            # evaluation for its score and one (and the initial plans') for
            # the report of a policy plan that wins
            with reserve(budget, 2 + len(self.initial)):
                plan = evo.search(problem, metered, budget, seed=seed, progress=progress)
            plan = self._better(problem, metered, budget, plan, plans[0], values[0], final,
                                progress)
        plan.extra = dict(plan.extra or {}, policy_seeds=len(plans))
        plan.method = self.name
        return plan

    def _evolution(self):
        """The ``evolution`` strategy hybrid runs (its options, the plans
        handed in set later)."""
        options = dict(self.evolution_options)
        if self.microbatches is not None:
            options.setdefault("microbatches", self.microbatches)
        if self.schedule is not None:
            options.setdefault("schedule", self.schedule)
        options.setdefault("given_slots", self.policy_slots)
        try:
            return get_strategy("evolution", initial=list(self.initial), **options)
        except StrategyError as exc:
            raise StrategyError(f"hybrid needs the evolution strategy: {exc.message}",
                                fix="install the evolution package (deap) or use method='rl'"
                                ) from None

    def _better(self, problem, metered, budget, plan, policy_plan, policy_value, final,
                progress):
        """Evolution's ``plan`` unless ``policy_plan`` (objective
        ``policy_value`` by ``final``, or by the search model when
        ``final`` is None or the same) is better by over a billionth; a
        policy plan that wins is reported as the result."""
        ranker = final_ranker(final, metered, budget)
        if ranker is metered:
            value = plan.predicted["objective"]
        else:
            from placer.search.ranker import score_finalists
            scored = score_finalists(ranker, problem, [plan], budget,
                                     policy=RankPolicy(keep=0))
            # no time left to score it by the final model: the two cannot be
            # compared by one model, and evolution's plan stands
            value = scored[0] if scored else -math.inf
        if not policy_value < value - 1e-9 * abs(value):
            plan.predicted.update(evaluations=budget.used, search_seconds=budget.elapsed)
            return plan
        return self.finalize(problem, metered, budget, policy_plan, progress=progress)

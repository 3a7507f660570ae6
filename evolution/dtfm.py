"""``method="dtfm"``: the decentralized bi-level scheduler of Yuan et al.,
"Decentralized Training of Foundation Models in Heterogeneous Environments"
(NeurIPS 2022).

The model is split into ``D_pp`` pipeline stages, each replicated on a
data-parallel group of devices. The scheduler decides

1. a *partition* of the devices into ``D_pp`` data-parallel groups (each
   group all-reduces one stage's gradients, so groups joined by fast links
   are cheap), and
2. the *pipeline order* of the groups: an open-loop travelling-salesman
   path over the groups whose edge cost is the time to send a stage's
   activations between them (each replica sends its slice of the batch to
   the replicas that need it; the slowest pair of links counts),

and searches (1) with a genetic algorithm (:mod:`evolution.dtfm_partition`:
topology-aware swaps of devices between groups, a crossover that
transplants whole groups, a local search of swaps) while (2) is solved
exactly (Held-Karp) for up to 9 groups and by nearest neighbour + 2-opt
beyond. Unlike the paper's closed-form cost the fitness is the screening
cost model's step time of the resulting plan (layers split in proportion to
each group's speed, each cut moved to the point nearby where the fewest
bytes cross), and the shape, the number of microbatches and the schedule
are genes too.

Extensions for heterogeneous clusters, each kept because it measured
better on the hetero bench (``docs/BENCHMARKS.md``): groups may differ in
size and slow devices may stay unused (the paper's ``D_pp x D_dp`` equal
replicas are the special case, ``uniform=True``; unequal groups are used
only when the screening model is the final one, since the analytical model
misprices transfers between groups of unequal size); among pipeline orders
of equal (cheapest) link cost, which flat networks produce by the dozen and
whose step times differ by up to 30%, the GA chooses (group moves in the
order are a mutation); and the pipeline may pass its groups several times
(``chunks``: interleaved virtual stages, as in Megatron-LM). The even,
Megatron-style allocation (devices in rank order) is kept as a reference
in the plan's ``extra["dtfm"]``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np
from deap import base, tools

from placer.cost import get_cost_model
from placer.errors import PlacerError, StrategyError
from placer.executors import check_backend
from placer.plan import Plan
from placer.search.base import (Budget, Progress, Strategy, get_strategy,
                                register_strategy)

from .dtfm_partition import (MAX_CHUNKS, Partition, by_model, islands, mutate, neighbours,
                             partition_of, transplant)
from placer.search.evaluate import Evaluator, check_workers, resolve_workers
from placer.graph import scale_batch
from placer.space import (LayoutGenome, OpGenome, Space, device_chain, even_allocation,
                           local_search, shapes_for)
from placer.search.ranker import RankPolicy, final_ranker, rank
from placer.search.parallel import ProblemPool, pool_workers
from placer.search.phases import polish_with, screen_exactly
from .shared import Fitness, ProgressBar, tournament

if TYPE_CHECKING:
    from placer.cost import CostModel, Problem


#: dtfm screens with the simulator when this many of its estimates fit in the
#: time left: its structured space needs fewer than evolution's op-level one,
#: and on the hetero suite even a few hundred simulator-scored partitions beat
#: thousands scored analytically
EXACT_SCREEN_EVALS = 250


class Scheduler:
    """The bi-level cost pieces of one problem: data-parallel cost of a group
    and the pipeline path over groups."""

    def __init__(self, space: Space, slack: float = 0.0):
        self.space = space
        self.slack = float(slack)
        p = space.problem
        self.p = p
        speed = np.minimum(p.bandwidth, np.minimum(p.nic_bandwidth[:, None],
                                                   p.nic_bandwidth[None, :]))
        self.inv_bw = 1.0 / speed
        np.fill_diagonal(self.inv_bw, 0.0)
        # bytes crossing a stage boundary: the largest tensor of the graph
        self.act = float(p.edge_bytes.max()) if p.n_edges else float(p.output_bytes.max())
        self.phases = 2.0 if p.training else 1.0
        self._paths: dict = {}
        self._links: dict = {}
        self._shares: dict = {}

    def link_cost(self, a: tuple, b: tuple, m: int) -> float:
        """Seconds to move one step's activations (and gradients) from group
        ``a`` to ``b``: replica i of ``a`` holds the i-th slice of the batch
        and sends the part of it that replica j of ``b`` needs (by device
        index, like the cost model); the slowest pair counts."""
        key = (a, b, m)
        hit = self._links.get(key)
        if hit is None:
            share = self._share(len(a), len(b))
            ia, ib = np.asarray(a), np.asarray(b)
            t = m * self.p.latency[np.ix_(ia, ib)] + share * self.act * self.inv_bw[np.ix_(ia, ib)]
            t = np.where((share > 1e-12) & (ia[:, None] != ib[None, :]), t, 0.0)
            hit = self._links[key] = self.phases * float(t.max())
        return hit

    def _share(self, p: int, q: int) -> np.ndarray:
        """(p, q) fractions of the batch replica i of a p-group sends to
        replica j of a q-group."""
        hit = self._shares.get((p, q))
        if hit is None:
            i = np.arange(p)[:, None]
            j = np.arange(q)[None, :]
            hit = np.minimum((i + 1) / p, (j + 1) / q) - np.maximum(i / p, j / q)
            hit = self._shares[(p, q)] = np.maximum(hit, 0.0)
        return hit

    def dp_cost(self, group: tuple, nbytes: float) -> float:
        """Ring all-reduce of ``nbytes`` over the group, in the group's order."""
        k = len(group)
        if k < 2:
            return 0.0
        worst = 0.0
        for i in range(k):
            x, y = group[i], group[(i + 1) % k]
            worst = max(worst, self.p.latency[x, y] + nbytes / k * self.inv_bw[x, y])
        return 2 * (k - 1) * worst

    def order(self, groups: list[tuple], m: int) -> list[int]:
        """The pipeline order of ``groups``: an open TSP path."""
        return list(self._path(groups, m)[1])

    def _path(self, groups: list[tuple], m: int):
        """(cost matrix over ``sorted(groups)``, the cheapest path as indices
        into ``groups``, its cost, each of ``groups``' row in the matrix)."""
        key = (tuple(sorted(groups)), m)
        hit = self._paths.get(key)
        if hit is None:
            nodes = key[0]
            C = np.array([[self.link_cost(a, b, m) if a != b else 0.0 for b in nodes]
                          for a in nodes])
            C = np.maximum(C, C.T)
            path = tsp_path(C) if len(nodes) > 2 else list(range(len(nodes)))
            cost = sum(C[path[k], path[k + 1]] for k in range(len(path) - 1))
            hit = self._paths[key] = (C, nodes, path, cost)
        C, nodes, path, cost = hit
        where = {g: i for i, g in enumerate(nodes)}
        back = [groups.index(nodes[i]) for i in path]
        return C, back, cost, [where[g] for g in groups]

    def settle(self, x: Partition, slack: float | None = None) -> Partition:
        """Put ``x``'s groups in a TSP pipeline order: its own order when that
        costs at most ``1 + slack`` times the cheapest path (the GA then
        chooses among near-optimal paths, which the link costs alone cannot
        rank: on flat networks many orders tie), else the cheapest path."""
        groups = x.groups()
        if len(groups) <= 2:
            return x
        C, path, best, idx = self._path(groups, x.microbatches)
        cost = sum(C[idx[k], idx[k + 1]] for k in range(len(idx) - 1))
        slack = self.slack if slack is None else slack
        if cost > best * (1 + slack) + 1e-15:
            x.set_groups([groups[i] for i in path])
        return x


def tsp_path(C: np.ndarray) -> list[int]:
    """A cheapest Hamiltonian path (any ends) over cost matrix ``C``: exact
    (Held-Karp) up to 12 nodes, else nearest neighbour from every start plus
    2-opt."""
    S = len(C)
    if S <= 2:
        return list(range(S))
    if S <= 9:
        full = 1 << S
        dp = np.full((full, S), np.inf)
        parent = np.full((full, S), -1, dtype=np.int64)
        for i in range(S):
            dp[1 << i, i] = 0.0
        for mask in range(1, full):
            row = dp[mask]
            ends = [i for i in range(S) if mask >> i & 1 and np.isfinite(row[i])]
            for i in ends:
                base_cost = row[i]
                for j in range(S):
                    if mask >> j & 1:
                        continue
                    nm = mask | 1 << j
                    c = base_cost + C[i, j]
                    if c < dp[nm, j]:
                        dp[nm, j] = c
                        parent[nm, j] = i
        mask = full - 1
        j = int(np.argmin(dp[mask]))
        path = [j]
        while parent[mask, j] >= 0:
            i = int(parent[mask, j])
            mask ^= 1 << j
            j = i
            path.append(j)
        return path[::-1]
    best, best_cost = None, np.inf
    for start in range(S):
        path = [start]
        left = set(range(S)) - {start}
        while left:
            nxt = min(left, key=lambda j: (C[path[-1], j], j))
            path.append(nxt)
            left.remove(nxt)
        path = _two_opt(path, C)
        cost = sum(C[path[k], path[k + 1]] for k in range(S - 1))
        if cost < best_cost - 1e-15:
            best, best_cost = path, cost
    return best


def _two_opt(path: list[int], C: np.ndarray) -> list[int]:
    S = len(path)
    improved = True
    while improved:
        improved = False
        for i in range(S - 1):
            for j in range(i + 2, S + 1):
                # reverse path[i+1:j]: edges (i, i+1) and (j-1, j) change
                a, b = path[i], path[i + 1]
                c = path[j - 1]
                d = path[j] if j < S else None
                old = C[a, b] + (C[c, d] if d is not None else 0.0)
                new = C[a, c] + (C[b, d] if d is not None else 0.0)
                if new < old - 1e-15:
                    path[i + 1:j] = path[i + 1:j][::-1]
                    improved = True
    return path


class DTFM(Strategy):
    """Bi-level scheduler of Yuan et al. 2022 (see the module doc).

    Options: ``shapes`` (list of ``(D_pp, D_dp)`` seeding the GA; None:
    :func:`shapes_for`), ``uniform`` (False: groups may differ in size and
    devices may stay unused; True: only the paper's ``D_pp x D_dp``
    shapes), ``order_slack`` (0: a pipeline order is kept when its link
    cost is within this fraction of the cheapest TSP path, see
    :meth:`Scheduler.settle`), ``cut_window`` (0.15: a stage cut may move
    by this fraction of the smaller neighbouring stage's work to where the
    fewest bytes cross; 0: cuts by speed alone), ``population`` (32), ``tournament`` (3),
    ``crossover`` (0.7), ``patience`` (30 generations), ``restarts`` (4:
    after ``patience`` stale generations, while budget is left, keep the
    best quarter and refill with partitions three mutations away; under a
    time budget alone the search restarts while time is left),
    ``generations`` (cap), ``polish_top`` (3 best distinct partitions
    polished, and the best with one and two more chunks), ``polish_share``
    (0.2: under a time budget the GA stops with this share of its time left
    for that polish), ``final_k`` (6 best distinct partitions ranked by
    ``final`` when the screening model is another), ``local_every`` (5), ``screen`` (``"auto"``: as in evolution),
    ``coarsen_above`` (1500) / ``coarsen_to`` (400), ``progress_bar``,
    ``seeds`` (heuristics whose plans compete in the final ranking, so the
    result is never worse than them, and whose groupings seed the GA:
    ``even_pipeline``, ``pipeline_dp``, ``partition``, ``heft``, ``m_sct``),
    ``polish_rounds`` (8: local search of stage boundaries on the winner),
    ``workers`` (0) and ``backend`` (``"local"``): processes scoring the
    GA's batches and where they run, as in evolution (plans never depend
    on them),
    ``final`` (``"simulator"``: the cost model ranking the winner against
    those plans; None: the given one), ``final_share`` (0.15 of the budget
    kept for a local search of the bi-level plan scored by ``final``, as
    evolution ends), ``seed_share`` (0.3 of the budget for those heuristics
    together);
    plus :class:`Strategy`'s ``initial``, ``microbatches``, ``schedule``.
    """

    name = "dtfm"

    def __init__(self, *, shapes: Sequence[Sequence[int]] | None = None, population: int = 32,
                 tournament: int = 3, crossover: float = 0.7, patience: int = 30,
                 generations: int | None = None, local_every: int = 5,
                 screen: str | None = "auto", coarsen_above: int = 1500,
                 coarsen_to: int = 400, progress_bar: bool = False,
                 seeds: Sequence[str] | None = ("even_pipeline", "pipeline_dp", "partition",
                                                 "heft", "m_sct"),
                 polish_rounds: int = 8, final: str | None = "simulator", restarts: int = 4,
                 polish_top: int = 3, seed_share: float = 0.3, final_share: float = 0.15,
                 uniform: bool = False, order_slack: float = 0.0, cut_window: float = 0.15,
                 polish_share: float = 0.2, final_k: int = 6, workers: int | str = 0,
                 backend: str = "local", **common):
        super().__init__(**common)
        self.workers = check_workers(workers)
        self.backend = check_backend(backend)
        self.final_share = float(final_share)
        self.seed_share = float(seed_share)
        self.restarts = int(restarts)
        self.polish_top = max(1, int(polish_top))
        self.final = final
        self.seeds = list(seeds or [])
        self.polish_rounds = int(polish_rounds)
        if population < 2 or int(population) != population:
            raise StrategyError(f"population must be a whole number >= 2, got {population!r}",
                                field="population")
        if not order_slack >= 0:
            raise StrategyError(f"order_slack must be >= 0, got {order_slack!r}",
                                field="order_slack")
        self.shapes = None if shapes is None else [(int(a), int(b)) for a, b in shapes]
        self.uniform = bool(uniform)
        self.order_slack = float(order_slack)
        self.cut_window = float(cut_window)
        self.polish_share = float(polish_share)
        self.final_k = max(1, int(final_k))
        self.population = int(population)
        self.tournament = int(tournament)
        self.cx = float(crossover)
        self.patience = int(patience)
        self.generations = generations
        self.local_every = int(local_every)
        self.screen = screen
        self.coarsen_above = int(coarsen_above)
        self.coarsen_to = int(coarsen_to)
        self.progress_bar = bool(progress_bar)

    def search(self, problem: "Problem", cost_model: "CostModel", budget: Budget,
               seed: int = 0, progress=None) -> Plan:
        from placer.search.common import Coarse
        rng = np.random.default_rng([int(seed), 0xD7F, 5])
        coarse = Coarse(problem, self.coarsen_to if problem.n_ops > self.coarsen_above
                        else None)
        inner = coarse.problem
        space = Space(inner, self.microbatch_choices(inner), self.schedule_choices())
        D = space.n_devices
        shapes = self.shapes or shapes_for(D, space.n_ops)
        shapes = [(pp, dp) for pp, dp in shapes if 1 <= pp <= space.n_ops and pp * dp <= D]
        if not shapes:
            raise StrategyError(f"no (D_pp, D_dp) shape fits {D} devices and "
                                f"{space.n_ops} ops", field="shapes")
        screen = cost_model if self.screen is None else get_cost_model(
            "analytical" if self.screen == "auto" else self.screen)
        sched = Scheduler(space, self.order_slack)
        self._space = space
        bar = ProgressBar(self.progress_bar, budget)
        n_final = 1 + len(self.seeds) + len(self.initial)
        ranker = final_ranker(self.final, cost_model, budget)
        share = self.final_share if ranker is not cost_model and coarse.members is None \
            and self.final != self.screen else 0.0
        policy = RankPolicy(reserve=n_final, share=share, keep=n_final)
        with policy.hold(budget), \
                Evaluator(space, budget.meter(screen), budget, backend=self.backend,
                          workers=resolve_workers(self.workers, self.backend, screen,
                                                  budget)) as evaluate:
            rivals = inner_rivals = self._rivals(inner, screen, budget, seed, space)
            # the final model's figures of the rivals now: the search below
            # may use all the time, and the ranking must still see them
            if coarse.members is not None:
                rivals = [c.expand(coarse.graph) for c in rivals]
            rival_values = [ranker.estimate(problem, plan).objective for plan in rivals]
            if self.screen == "auto":
                screen = screen_exactly(inner, evaluate, screen, inner_rivals[:3], budget,
                                        self.final, evals=EXACT_SCREEN_EVALS, repeats=3)

            def score(parts: list[Partition]) -> np.ndarray:
                for x in parts:
                    sched.settle(x)
                values = evaluate([self.decode(space, x) for x in parts])
                for x, v in zip(parts, values.tolist()):
                    x.fitness = Fitness((v,))
                return values

            # groups of unequal size only when screened by the final model: the
            # analytical model misprices transfers between them (a 5-group
            # partition of 5-8 devices on dtfm-worldwide: 34 s analytical,
            # 48 s simulated)
            self._uniform = self.uniform or getattr(screen, "name", None) != (
                self.final or getattr(cost_model, "name", None))
            seeds = self._seeds(space, sched, shapes, rng)
            seeds += [x for x in (partition_of(space, plan) for plan in inner_rivals)
                      if x is not None and (not self._uniform or x.dp is not None)]
            score(seeds)
            baseline = {f"{x.pp}x{x.dp}": x.fitness.values[0] for x in seeds
                        if x.origin == "even"}
            pop = _best(_unique(seeds), self.population)
            pop = self._evolve(space, pop, shapes, score, rng, budget, progress, bar)
            # the GA's best few, each polished (stage boundaries, boundary ops,
            # microbatches): the best after polishing need not be the first
            # and the best with more chunks: interleaving pays once the cuts
            # are polished, which the GA's balanced cuts do not show
            more = []
            for v in (1, 2):
                x = pop[0].copy()
                x.chunks += v
                if x.chunks <= MAX_CHUNKS and x.chunks * x.pp <= space.n_ops:
                    more.append(x)
            more = more if more and not budget.exhausted() else []
            if more:
                score(more)
            polish = _unique(pop[:1] + more + pop[1:self.polish_top])
            rest = [x for x in pop[:self.final_k] if x.key() not in {y.key() for y in polish}]
            finalists = []
            for i, part in enumerate(polish + rest):
                g, v = self.decode(space, part), part.fitness.values[0]
                if i < len(polish) and self.polish_rounds and not budget.exhausted():
                    g, v = local_search(space, evaluate, g, v, rng, rounds=self.polish_rounds)
                finalists.append((v, i, g, part))
            finalists.sort(key=lambda f: (f[0], f[1]))
        bar.close()
        _, _, genome, best_part = finalists[0]
        if share and getattr(screen, "name", None) != getattr(ranker, "name", None) \
                and len(finalists) > 1:
            # the screening model's order is not the final model's: it ranks
            # the finalists (in the screen's order while time lasts)
            with ProblemPool(inner, self.backend,
                             pool_workers(self.workers, self.backend)) as pool:
                k = rank(ranker, inner, [f[2].to_plan(space, self.name) for f in finalists],
                         budget, pool=pool, policy=policy)
            _, _, genome, best_part = finalists[k]
        if share:
            # the same finish as evolution: local search scored by the final model
            genome = polish_with(space, ranker, budget, genome, rng, n_final) or genome
        ours = genome.to_plan(space, self.name)
        if coarse.members is not None:
            ours = ours.expand(coarse.graph)
        candidates = [ours] + rivals
        values = [ranker.estimate(problem, ours).objective] + rival_values
        k = int(np.argmin(values))
        plan = candidates[k]
        report = cost_model.estimate(problem, plan)
        plan.method = self.name
        even = min(baseline.values()) if baseline else None
        plan.extra["dtfm"] = {
            "winner": "bi-level" if k == 0 else candidates[k].extra.get("from"),
            "stages": best_part.pp, "replicas": list(best_part.sizes),
            "chunks": best_part.chunks,
            "groups": [[space.problem.devices[d] for d in g] for g in best_part.groups()],
            "even_allocation_step_time": even if even is None or even < 1e9 else None,
            "screen_step_time": float(best_part.fitness.values[0]),
            "screen": getattr(screen, "name", None)}
        return self.finalize(problem, cost_model, budget, plan, report, progress=progress)

    def _rivals(self, inner, screen, budget: Budget, seed: int, space: Space) -> list[Plan]:
        """Plans of the ``seeds`` heuristics (on the inner problem)."""
        from placer.search.phases import SeedPool
        out = []
        pool = SeedPool(budget, self.seed_share, len(self.seeds))
        for name in self.seeds:
            try:
                strategy = get_strategy(name, microbatches=self.microbatches,
                                        schedule=self.schedule)
                sub = pool.next()
                plan = strategy.search(inner, screen, sub, seed=seed)
                budget.charge(sub.used)
            except PlacerError:
                continue
            plan.extra["from"] = name
            out.append(plan)
        return out

    def decode(self, space: Space, x: Partition) -> OpGenome:
        """The plan of a partition: its groups in order, layers balanced by
        speed, each cut moved to the cheapest nearby point (:func:`cut_near`)."""
        stages = x.stages()
        layout = LayoutGenome.balanced(space, stages, x.microbatches, x.schedule, x.origin)
        if self.cut_window > 0:
            layout.cuts = cut_near(space, layout.cuts, self._crossing(space), self.cut_window)
        return layout.decode(space)

    def _crossing(self, space: Space) -> np.ndarray:
        hit = getattr(self, "_cross", None)
        if hit is None or hit[0] is not space:
            hit = self._cross = (space, crossing_bytes(space))
        return hit[1]

    # --- population ---------------------------------------------------------------
    def _seeds(self, space: Space, sched: Scheduler, shapes, rng) -> list[Partition]:
        D = space.n_devices
        chain = np.array(device_chain(space), dtype=np.int64)
        ident = np.arange(D, dtype=np.int64)
        ms = space.microbatch_choices
        sch = space.schedule_choices[0]

        def m_for(pp: int) -> int:
            return max([v for v in ms if v <= max(4 * pp, 1)] or [ms[0]])
        meta = space.problem.graph.meta or {}
        batch = meta.get("batch") if isinstance(meta.get("batch"), (int, float)) else ms[-1]
        out = []
        for pp, dp in shapes:
            m = m_for(pp)
            used = pp * dp
            # rank order: the even, Megatron-style allocation, also at the
            # larger counts a large batch needs to fit (at least one row per
            # replica), so the reference is the even plan at its best count
            out.append(Partition.uniform(ident.copy(), pp, dp, m, sch, "even"))
            if used == D:
                out += [Partition.uniform(ident.copy(), pp, dp, v, sch, "even")
                        for v in ms if v > m and v * dp <= batch]
            # groups of nearby devices (data parallelism on fast links)
            out.append(Partition.uniform(chain.copy(), pp, dp, m, sch, "near-groups"))
            # groups strided across the chain (pipelines on fast links)
            strided = np.r_[chain[:used].reshape(dp, pp).T.ravel(), chain[used:]]
            out.append(Partition.uniform(strided, pp, dp, m, sch, "near-pipelines"))
            out.append(Partition.uniform(rng.permutation(D), pp, dp, m, sch, "random"))
        if not self._uniform:
            # the cluster's islands of fast links as data-parallel groups,
            # whole or split by device model
            isl = islands(space)
            kinds = [k for g in isl for k in by_model(space, g)]
            for groups, tag in ((isl, "islands"), (kinds, "models")):
                if len(groups) <= space.n_ops:
                    out.append(Partition.of_groups(groups, D, m_for(len(groups)), sch, tag))
        # each also in its cheapest TSP order
        for x in list(out):
            y = sched.settle(x.copy(), slack=0.0)
            if y.key() != x.key():
                out.append(y)
        return out

    def _evolve(self, space, pop, shapes, score, rng, budget, progress, bar):
        max_groups = min(space.n_ops, space.n_devices)
        toolbox = base.Toolbox()
        toolbox.register("mate", transplant, rng=rng, max_groups=max_groups)
        toolbox.register("mutate", lambda x: mutate(space, x, rng, shapes, max_groups,
                                                    self._uniform))
        toolbox.register("select", tournament, rng=rng, k=self.tournament)
        logbook = tools.Logbook()
        best = pop[0].fitness.values[0]
        stale = gen = restarts = 0
        timed = budget.time is not None and budget.evaluations is None
        # under a time budget the GA leaves time to polish its finalists
        keep = self.polish_share * budget.remaining_time if timed else 0.0
        self._emit(progress, budget, best, gen, bar)
        while not budget.exhausted() and (not timed or budget.remaining_time > keep):
            gen += 1
            if self.generations is not None and gen > self.generations:
                break
            if stale >= self.patience:          # converged: restart around the best
                restarts += 1
                elite = pop[:max(2, self.population // 4)]
                fresh = []
                while len(elite) + len(fresh) < self.population:
                    x = elite[int(rng.integers(len(elite)))].copy()
                    for _ in range(3):
                        x = toolbox.mutate(x)
                    fresh.append(x)
                score(fresh)
                pop = _best(_unique(elite + fresh), self.population)
                stale = 0
            fits = np.array([x.fitness.values[0] for x in pop])
            children = []
            while len(children) < self.population:
                a = pop[toolbox.select(fits)].copy()
                if rng.random() < self.cx:
                    b = pop[toolbox.select(fits)]
                    if not self._uniform or a.sizes == b.sizes:
                        a = toolbox.mate(a, b)
                children.append(toolbox.mutate(a))
            score(children)
            pop = _best(_unique(pop + children), self.population)
            if self.local_every and gen % self.local_every == 0 and not budget.exhausted():
                polished = self._local(pop[0], score, rng)
                if polished is not None:
                    pop = _best(_unique([polished] + pop), self.population)
            logbook.record(gen=gen, best=pop[0].fitness.values[0])
            if pop[0].fitness.values[0] < best * (1 - 1e-6):
                best, stale = pop[0].fitness.values[0], 0
            else:
                stale += 1
            self._emit(progress, budget, best, gen, bar)
            if stale >= self.patience and restarts >= self.restarts and not timed:
                break
        return pop

    def _emit(self, progress, budget, best, gen, bar):
        bar.update(best, gen)
        if progress is not None:
            progress(Progress(self.name, budget.used, budget.elapsed, float(best),
                              float(best) if best < 1e9 else None, bool(best < 1e9),
                              f"generation {gen}"))

    def _local(self, x: Partition, score, rng, tries: int = 64) -> Partition | None:
        """One batch of neighbours of ``x`` (device swaps and moves between
        groups, group swaps in the order); the best if it improves ``x``."""
        cands = neighbours(self._space, x, rng, tries)
        if self._uniform:
            cands = [c for c in cands if c.sizes == x.sizes]
        if not cands:
            return None
        values = score(cands)
        k = int(np.argmin(values))
        return cands[k] if values[k] < x.fitness.values[0] * (1 - 1e-9) else None


def crossing_bytes(space: Space) -> np.ndarray:
    """``out[k]``: bytes of the tensors crossing a cut before position ``k``
    of the topological order (colocated ops counted where they are placed)."""
    p = space.problem
    n = space.n_ops
    a, b = space.rep[p.edge_src], space.rep[p.edge_dst]
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    diff = np.zeros(n + 1)
    np.add.at(diff, lo + 1, p.edge_bytes)
    np.add.at(diff, hi + 1, -p.edge_bytes)
    return np.cumsum(diff)[:n]


def cut_near(space: Space, cuts: Sequence[int], crossing: np.ndarray,
             window: float) -> list[int]:
    """Each cut moved to where the fewest bytes cross, among the positions
    whose work before it differs from the cut's by at most ``window`` times
    the smaller neighbouring stage's work (the nearest on ties)."""
    n = space.n_ops
    cum = np.r_[0.0, space.cum_work]           # cum[k]: work before position k
    bounds = [0] + [int(c) for c in cuts] + [n]
    out = []
    prev = 0
    S = len(bounds) - 1
    for s in range(1, S):
        c = bounds[s]
        room = window * min(cum[c] - cum[bounds[s - 1]], cum[bounds[s + 1]] - cum[c])
        lo, hi = prev + 1, n - (S - s)
        ks = np.arange(lo, hi + 1)
        ks = ks[np.abs(cum[ks] - cum[c]) <= room]
        if len(ks):
            c = int(ks[np.lexsort((np.abs(ks - c), crossing[ks]))[0]])
        c = min(max(c, lo), hi)
        out.append(c)
        prev = c
    return out


def _unique(parts: list) -> list:
    seen = set()
    out = []
    for x in parts:
        k = x.key()
        if k not in seen:
            seen.add(k)
            out.append(x)
    return out


def _best(parts: list, k: int) -> list:
    fits = np.array([x.fitness.values[0] for x in parts])
    return [parts[i] for i in np.argsort(fits, kind="stable")[:k].tolist()]


register_strategy(DTFM)

__all__ = ["DTFM", "Partition", "Scheduler", "crossing_bytes", "cut_near", "even_allocation",
           "partition_of", "scale_batch", "tsp_path"]

"""The strategy interface, the search budget and the registry of names.

A search method is one class with a ``name``, registered like an Optuna
sampler; :func:`get_strategy` builds it by name with its options:

>>> from placer.search import Strategy, register_strategy, get_strategy
>>> @register_strategy
... class FirstDevice(Strategy):
...     name = "doc-first-device"
...     def search(self, problem, cost_model, budget, seed=0, progress=None):
...         plan = Plan({op: [problem.devices[0]] for op in problem.ids})
...         return self.finalize(problem, cost_model, budget, plan)
>>> type(get_strategy("doc-first-device")).__name__
'FirstDevice'
>>> unregister_strategy("doc-first-device")

Built-in and sibling-package strategies are listed in a table of
``name -> "module"`` or ``"module:Class"`` and imported on first use, so
``import placer`` stays light and ``evolution``/``gnn`` register themselves
when imported (see :data:`LAZY`). Third-party packages can also advertise
strategies under the entry-point group ``placer.strategies``.
"""

from __future__ import annotations

import importlib
import math
import sys
import time as _time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

import numpy as np

from ..cost.base import CostModel
from ..errors import PlanError, StrategyError
from ..plan import SCHEDULES, Plan

if TYPE_CHECKING:
    from ..cost import Problem, Report

_REGISTRY: dict[str, type] = {}

#: Strategies known by name but imported on first use: ``name -> "module"``
#: (importing the module registers the name) or ``"module:Class"``.
LAZY: dict[str, str] = {
    "single": "placer.search.heuristics:Single",
    "round_robin": "placer.search.heuristics:RoundRobin",
    "even_pipeline": "placer.search.heuristics:EvenPipeline",
    "m_topo": "placer.search.heuristics:MTopo",
    "heft": "placer.search.listsched:HEFT",
    "m_etf": "placer.search.listsched:METF",
    "m_sct": "placer.search.listsched:MSCT",
    "partition": "placer.search.partition:Partition",
    "pipeline_dp": "placer.search.pipeline_dp:PipelineDP",
    # sibling packages of the project; they register these names on import
    "evolution": "evolution",
    "dtfm": "evolution",
    "optuna": "evolution",
    "rl": "gnn",
    "hybrid": "gnn",
}

_BROKEN: dict[str, str] = {}     # lazy name -> why its import failed


# --- budget and progress ------------------------------------------------------

class Budget:
    """How much a search may spend: wall-clock ``time`` (seconds) and/or a
    number of ``evaluations`` (plans scored by the cost model); None means
    unlimited. The clock starts at construction (or :meth:`start`).

    Evaluations are counted by the cost model returned by :meth:`meter`, so
    a strategy only has to ask :meth:`exhausted` (or :meth:`allow`) before
    it scores more plans. A strategy may always score one plan, so even a
    spent budget yields a plan.

    >>> b = Budget(evaluations=10)
    >>> b.charge(8); b.allow(5), b.exhausted()
    (2, False)
    >>> b.charge(2); b.exhausted()
    True
    """

    def __init__(self, time: float | None = None, evaluations: int | None = None):
        if time is not None and not time > 0:
            raise StrategyError(f"time budget must be > 0 seconds, got {time!r}",
                                field="time_budget")
        if evaluations is not None and (int(evaluations) != evaluations or evaluations < 1):
            raise StrategyError(f"evaluations must be a whole number >= 1, got "
                                f"{evaluations!r}", field="evaluations")
        self.time = None if time is None else float(time)
        self.evaluations = None if evaluations is None else int(evaluations)
        self.used = 0
        self._stopped = False
        self.start()

    def __repr__(self) -> str:
        return (f"Budget(time={self.time}, evaluations={self.evaluations}, used={self.used}, "
                f"elapsed={self.elapsed:.3g})")

    def start(self) -> "Budget":
        """Restart the clock (evaluations counted so far are kept)."""
        self._t0 = _time.perf_counter()
        return self

    @property
    def elapsed(self) -> float:
        """Seconds since the clock started."""
        return _time.perf_counter() - self._t0

    @property
    def remaining_time(self) -> float:
        """Seconds left (``inf`` without a time budget)."""
        return float("inf") if self.time is None else max(0.0, self.time - self.elapsed)

    @property
    def remaining_evaluations(self) -> float:
        """Evaluations left (``inf`` without an evaluation budget)."""
        if self.evaluations is None:
            return float("inf")
        return max(0, self.evaluations - self.used)

    def charge(self, n: int = 1) -> None:
        """Count ``n`` more evaluations (the metered cost model does this)."""
        self.used += int(n)

    def allow(self, n: int) -> int:
        """How many of ``n`` further evaluations fit: ``n`` within the budget,
        0 once spent, but 1 while nothing has been scored yet."""
        if self.out_of_time():
            return 1 if self.used == 0 and n > 0 else 0
        left = self.remaining_evaluations
        k = int(min(n, left))
        return max(k, 1 if self.used == 0 and n > 0 else 0)

    def exhausted(self) -> bool:
        """True once the time or the evaluations are spent, or after :meth:`stop`."""
        return self.out_of_time() or self.remaining_evaluations <= 0

    def out_of_time(self) -> bool:
        """True once the time is spent or after :meth:`stop` (whatever the
        evaluations left): a search scoring a batch stops there."""
        return self._stopped or self.remaining_time <= 0

    def stop(self) -> None:
        """Ask the search to stop at its next check (e.g. from a progress callback)."""
        self._stopped = True

    def restore(self, used: int, elapsed: float = 0.0) -> "Budget":
        """Continue a checkpointed search: ``used`` evaluations and
        ``elapsed`` seconds were spent before (the clock is moved back)."""
        self.used = int(used)
        self._t0 = _time.perf_counter() - max(0.0, float(elapsed))
        return self

    def meter(self, cost_model: CostModel) -> "MeteredCostModel":
        """``cost_model`` wrapped so every plan it scores is charged here."""
        if isinstance(cost_model, MeteredCostModel) and cost_model.budget is self:
            return cost_model
        return MeteredCostModel(cost_model, self)


class MeteredCostModel(CostModel):
    """A cost model that charges a :class:`Budget` one evaluation per plan
    scored (``estimate``: 1, ``estimate_many``/``step_times``: one per plan).

    It also guards the search against an erratic model: a NaN objective
    reads as an infeasible plan of infinite cost, and the best plan scored
    through :meth:`estimate`/:meth:`estimate_many` (the seed heuristics,
    warm starts, finalists) or as the best row of a :meth:`step_times`
    batch (reported again by the model) is remembered per problem
    (:meth:`best_for`), so
    :func:`placer.search.optimize` never returns a plan this model scored
    worse than one it had seen."""

    def __init__(self, inner: CostModel, budget: Budget):
        self.inner = inner.inner if isinstance(inner, MeteredCostModel) else inner
        self.budget = budget
        self.name = self.inner.name
        self.batched = getattr(self.inner, "batched", False)
        #: problem id -> ``(problem, plan, report)`` of the lowest objective
        #: scored as a Plan of that problem (a search may score coarsened ones)
        self._best: dict[int, tuple] = {}

    def best_for(self, problem) -> tuple | None:
        """``(plan, report)`` of the best plan of ``problem`` scored, or None."""
        found = self._best.get(id(problem))
        return None if found is None or found[0] is not problem else found[1:]

    def _seen(self, problem, plan, report):
        objective = report.objective
        if objective is None or not math.isfinite(objective) or not math.isfinite(
                report.step_time):
            if objective is None or math.isnan(objective) or math.isnan(report.step_time):
                report.objective = float("inf")
                report.feasible = False
            return report
        best = self.best_for(problem)
        if best is None or (not best[1].feasible, best[1].objective) > \
                (not report.feasible, objective):
            self._best[id(problem)] = (problem, plan, report)
        return report

    def estimate(self, problem, plan):
        self.budget.charge(1)
        return self._seen(problem, plan, self.inner.estimate(problem, plan))

    def estimate_many(self, problem, plans):
        return self.record(problem, plans, self.inner.estimate_many(problem, plans))

    def record(self, problem, plans, reports) -> list:
        """``reports`` of ``plans`` by this model, made elsewhere (on worker
        processes): charged and remembered as :meth:`estimate_many` would."""
        self.budget.charge(len(plans))
        return [self._seen(problem, plan, report) for plan, report in zip(plans, reports)]

    def step_times(self, problem, assignments, **kwargs):
        rows = np.atleast_2d(np.asarray(assignments))
        if self.budget.time is not None and \
                type(self.inner).step_times is CostModel.step_times:
            return self._rows_in_time(problem, rows, kwargs)
        return self.record_rows(problem, rows, self.inner.step_times(problem, rows, **kwargs),
                                **kwargs)

    def _rows_in_time(self, problem, rows, kwargs) -> np.ndarray:
        """:meth:`step_times` of a model without an array path (it scores a
        batch plan by plan) under a time budget: rows are scored one at a
        time until the time is spent, the rest read as
        ``inf`` and are not charged; a slow model's batch would otherwise
        run past the budget's end. As :meth:`Budget.allow`, one row is
        scored when nothing has been yet."""
        counts = np.broadcast_to(np.asarray(kwargs.get("microbatches", 1)), (len(rows),))
        out = np.full(len(rows), np.inf)
        done = 0
        while done < len(rows) and (not self.budget.out_of_time()
                                     or (done == 0 and self.budget.used == 0)):
            out[done] = self.inner.step_times(
                problem, rows[done:done + 1], **{**kwargs, "microbatches": int(counts[done])})[0]
            done += 1
        scored = {**kwargs, "microbatches": counts[:done]}
        out[:done] = self.record_rows(problem, rows[:done], out[:done], **scored)
        return out

    def record_rows(self, problem, rows, values, **kwargs) -> np.ndarray:
        """:meth:`step_times`'s answer from ``values`` of ``rows`` made by
        this model elsewhere (on worker processes): charged and remembered
        the same way (NaN reads as ``inf``)."""
        self.budget.charge(len(rows))
        out = np.asarray(values, dtype=float)
        out = np.where(np.isnan(out), np.inf, out)
        self._seen_row(problem, rows, out, kwargs)
        return out

    def _seen_row(self, problem, rows, out, kwargs) -> None:
        """Remember the best row of a batch as a plan (with the model's own
        report of it) when it beats the best plan seen: a search that ranks
        by arrays must not return worse than what they showed it."""
        if not len(out) or not np.isfinite(out).any():
            return
        j = int(np.argmin(out))
        best = self.best_for(problem)
        if best is not None and best[1].feasible and not out[j] < best[1].objective:
            return
        counts = np.broadcast_to(np.asarray(kwargs.get("microbatches", 1)), (len(rows),))
        try:
            compiled = problem.compile_array(rows[j], kwargs.get("groups", ()),
                                             microbatches=int(counts[j]),
                                             schedule=kwargs.get("schedule", "1f1b"))
            plan = problem.to_plan(compiled)
            self._seen(problem, plan, self.inner.estimate(problem, plan))
        except Exception:       # noqa: BLE001 - a row this model cannot report: not kept
            return

    def __getattr__(self, name):
        # reached only for attributes the wrapper lacks (e.g. estimate_compiled)
        if name in ("inner", "budget"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"Metered({self.inner!r})"


@dataclass
class Progress:
    """What a strategy reports while it searches (passed to the callback).

    ``best`` is the best objective so far (lower is better), ``step_time``
    and ``feasible`` describe that plan; ``done`` is True on the last call.
    ``extra["model"]``, where a strategy sets it, names the cost model whose
    objective ``best`` is (a search may screen with one model and report
    with another: compare ``best`` only with figures of that model).
    """

    strategy: str
    evaluations: int
    elapsed: float
    best: float
    step_time: float | None = None
    feasible: bool | None = None
    message: str = ""
    done: bool = False
    extra: dict = field(default_factory=dict)

    def line(self) -> str:
        """One line for people."""
        step = "" if self.step_time is None else f" step {self.step_time * 1e3:.4g} ms"
        feas = "" if self.feasible is None else (" feasible" if self.feasible else " INFEASIBLE")
        msg = f" {self.message}" if self.message else ""
        return (f"[{self.strategy}] {self.evaluations} evals {self.elapsed:.2f}s"
                f"{step}{feas}{msg}")


ProgressCallback = Callable[[Progress], None]


class SearchInterrupted(KeyboardInterrupt):
    """A search stopped by Ctrl-C or SIGTERM that saved what it had.

    ``plan`` is the best plan found so far (None if the search had none
    yet; :func:`placer.search.optimize` scores and binds it) and
    ``checkpoint`` the file holding the search state (None if not saved),
    from which the strategy can resume. A subclass of KeyboardInterrupt,
    so code unaware of it still sees an interrupt.
    """

    def __init__(self, plan: "Plan | None" = None, checkpoint: str | None = None,
                 message: str = ""):
        super().__init__(message or "search interrupted")
        self.plan = plan
        self.checkpoint = checkpoint
        self.message = message


def _no_progress(event: Progress) -> None:
    return None


def print_progress(event: Progress) -> None:
    """A progress callback that prints one line per report to stderr."""
    print(event.line(), file=sys.stderr, flush=True)


def progress_callback(progress) -> ProgressCallback:
    """None -> silent, True -> :func:`print_progress`, a callable as is."""
    if progress is None or progress is False:
        return _no_progress
    if progress is True:
        return print_progress
    if callable(progress):
        return progress
    raise StrategyError(f"progress must be None, True or a callable, got {progress!r}",
                        field="progress")


# --- microbatch counts ----------------------------------------------------------

def traced_batch(graph) -> int | None:
    """The batch a graph's costs are for: ``meta['batch']`` when set, else
    dim 0 of the first traced input with a dimension (the rows the runtime
    splits into microbatches, see :func:`placer.runtime.run.first_batch`);
    None when unknown."""
    meta = graph.meta or {}
    batch = meta.get("batch")
    if isinstance(batch, (int, float)) and not isinstance(batch, bool) and batch >= 1:
        return int(batch)
    for shape in (meta.get("batch_inputs") or {}).values():
        # one input: its shape; an input of several tensors: their shapes
        first = shape[0] if shape and isinstance(shape[0], (list, tuple)) else shape
        if first and isinstance(first[0], (int, float)) and first[0] >= 1:
            return int(first[0])
    return None


def microbatch_candidates(graph, limit: int | None = None) -> list[int]:
    """The microbatch counts a search may choose for ``graph``, the one rule
    every strategy draws from: :func:`batch_microbatches` of its batch
    (:func:`traced_batch`; every microbatch then has the same rows, as the
    cost models assume, and the runtime accepts the count) up to ``limit``
    (None: up to the batch), leaving at least two rows per microbatch when
    a training graph normalises over the batch (BatchNorm cannot train on
    one row). Unknown batch: powers of two up to ``limit`` (or 32)."""
    batch = traced_batch(graph)
    if batch is None:
        return [m for m in (1, 2, 4, 8, 16, 32) if m <= (limit or 32)]
    rows = 2 if graph.training and batch >= 2 and _batch_statistics(graph) else 1
    top = batch // rows if limit is None else min(limit, batch // rows)
    return batch_microbatches(batch, max(1, top))


#: microbatch counts a training search tries when memory does not ask for more
COMMON_MICROBATCHES = 32


def microbatch_cap(graph, cluster) -> int | None:
    """How far up the batch's microbatch counts a training search goes:
    :data:`COMMON_MICROBATCHES`, or the whole batch (None) when memory asks
    for more, i.e. when one microbatch of ``1/COMMON_MICROBATCHES`` of the
    batch would hold activations over half the smallest device's memory (a
    1F1B pipeline keeps about one whole-model microbatch in flight over its
    devices). Peer-scale batches (a million tokens of GPT-1.3B) reach the
    batch; ordinary ones keep the search space of 1-32 microbatches."""
    acts = sum(float(op.output_bytes or 0.0) for op in graph)
    smallest = min((float(d.memory) for d in cluster.devices), default=float("inf"))
    return None if acts / COMMON_MICROBATCHES > smallest / 2 else COMMON_MICROBATCHES


def _batch_statistics(graph) -> bool:
    """Whether an op of ``graph`` normalises over the batch (BatchNorm)."""
    return any(op.op.replace("_", "").startswith(("batchnorm", "syncbatchnorm"))
               for op in graph)


# --- strategies ---------------------------------------------------------------

def batch_microbatches(batch: int, limit: int | None = None) -> list[int]:
    """Microbatch counts for a batch of ``batch`` rows: divisors of the batch
    (equal microbatches, as the runtime splits them) from 1 up to the batch
    itself (or ``limit``), thinned to a ladder where each count is at least
    twice the one before; a plan's memory then decides how far up it goes.

    >>> batch_microbatches(976)          # 8 x 122 sequences
    [1, 2, 4, 8, 16, 61, 122, 244, 488, 976]
    >>> batch_microbatches(8), batch_microbatches(12, limit=8)
    ([1, 2, 4, 8], [1, 2, 4])
    """
    top = batch if limit is None else min(batch, limit)
    small = [d for d in range(1, int(batch ** 0.5) + 1) if batch % d == 0]
    out = [1]
    for m in sorted(set(small + [batch // d for d in small])):
        if m <= top and m >= 2 * out[-1]:
            out.append(m)
    return out


class Strategy(ABC):
    """A search method: ``search(problem, cost_model, budget, seed, progress)``
    returns a :class:`placer.Plan` over ``problem.graph`` whose ``predicted``
    block holds ``cost_model``'s figures for it (see :meth:`finalize`).

    Options every strategy accepts (keywords of the constructor):

    - ``initial``: plans to start from (warm start, like Optuna's
      ``enqueue_trial``); the result is never worse than the best of them
      under the search's cost model.
    - ``microbatches`` / ``schedule``: fix these instead of choosing them
      (None: the strategy chooses; ``microbatches`` may also be a list of
      candidates).

    Contract (checked for every registered name by the shared tests): a
    valid plan (every op once, known devices, colocation kept), the same
    plan for the same seed and evaluation budget, within memory when the
    strategy can find a feasible plan, the budget respected (one plan may
    always be scored) and no worse than ``initial``.

    A strategy of one's own, registered by name and used like the shipped ones
    (it tries each device alone and keeps the fastest):

    >>> import placer
    >>> from placer.search import Strategy, register_strategy, unregister_strategy
    >>> @register_strategy
    ... class BestSingle(Strategy):
    ...     name = "best_single"
    ...     def search(self, problem, cost_model, budget, seed=0, progress=None):
    ...         plans = [placer.Plan({op: [d.name] for op in problem.graph.ids})
    ...                  for d in problem.cluster.devices]
    ...         reports = cost_model.estimate_many(problem, plans)
    ...         best = min(range(len(plans)), key=lambda i: reports[i].objective)
    ...         return self.finalize(problem, cost_model, budget, plans[best], reports[best],
    ...                              progress=progress)
    >>> g = placer.datasets.graph("gpt-125m.module")
    >>> plan = placer.optimize(g, placer.Cluster.preset("two-sites"), "best_single")
    >>> plan.method, sorted({d for ds in plan.placement.values() for d in ds})
    ('best_single', ['a0'])
    >>> unregister_strategy("best_single")
    """

    name: str = ""

    def __init__(self, *, initial: Plan | Sequence[Plan] | None = None,
                 microbatches: int | Sequence[int] | None = None,
                 schedule: str | None = None):
        if isinstance(initial, Plan):
            initial = [initial]
        self.initial: list[Plan] = list(initial or [])
        if microbatches is not None:
            values = [microbatches] if isinstance(microbatches, (int, np.integer)) \
                else list(microbatches)
            if not values or any(int(v) != v or v < 1 for v in values):
                raise StrategyError(f"microbatches must be whole numbers >= 1, got "
                                    f"{microbatches!r}", field="microbatches")
            microbatches = [int(v) for v in values]
        if schedule is not None and schedule not in SCHEDULES:
            raise StrategyError(f"unknown schedule {schedule!r}", field="schedule",
                                fix=f"use one of: {', '.join(SCHEDULES)}")
        self.microbatches: list[int] | None = microbatches
        self.schedule: str | None = schedule

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    @abstractmethod
    def search(self, problem: "Problem", cost_model: CostModel, budget: Budget,
               seed: int = 0, progress: ProgressCallback | None = None) -> Plan:
        """Search a plan for ``problem`` within ``budget``."""

    # --- helpers for implementations ------------------------------------------
    def microbatch_choices(self, problem: "Problem") -> list[int]:
        """Microbatch counts to try: the fixed ones, else
        :func:`microbatch_candidates` of the graph up to
        :func:`microbatch_cap` (up to 8 for inference)."""
        if self.microbatches is not None:
            return list(self.microbatches)
        if problem.training is False:
            return microbatch_candidates(problem.graph, 8)
        return microbatch_candidates(problem.graph, microbatch_cap(problem.graph,
                                                                   problem.cluster))

    def schedule_choices(self) -> list[str]:
        """Schedules to try: the fixed one, else ``1f1b`` then ``gpipe``."""
        return [self.schedule] if self.schedule is not None else ["1f1b", "gpipe"]

    def report(self, progress: ProgressCallback | None, budget: Budget, report: "Report",
               message: str = "", done: bool = False) -> None:
        """Send a :class:`Progress` about ``report`` (the best so far)."""
        if progress is None:
            return
        progress(Progress(self.name, budget.used, budget.elapsed, float(report.objective),
                          float(report.step_time), bool(report.feasible), message, done,
                          extra={"model": report.model or None}))

    def finalize(self, problem: "Problem", cost_model: CostModel, budget: Budget,
                 plan: Plan, report: "Report | None" = None, *,
                 progress: ProgressCallback | None = None) -> Plan:
        """Score ``plan`` (unless its ``report`` is given) and the
        ``initial`` plans, keep the best, fill its ``predicted`` block and
        ``method``; returns that plan."""
        if report is None:
            report = cost_model.estimate(problem, plan)
        best, best_report = plan, report
        starts = [p for p in self.initial]
        if starts:
            for start in starts:
                start.validate(problem.graph, problem.cluster, check_fingerprints=False)
            for start, rep in zip(starts, cost_model.estimate_many(problem, starts)):
                if rep.objective < best_report.objective:
                    best = Plan({k: list(v) for k, v in start.placement.items()},
                                start.microbatches, start.schedule)
                    best_report = rep
        best.method = self.name
        best.predicted = predicted_figures(best_report)
        best.predicted["evaluations"] = budget.used
        best.predicted["search_seconds"] = budget.elapsed
        self.report(progress, budget, best_report, "done", done=True)
        return best


def predicted_figures(report: "Report") -> dict:
    """The ``predicted`` block of a plan from a cost-model report."""
    data = report.to_dict()
    keep = ("step_time", "feasible", "objective", "peak_memory", "memory_excess", "busy",
            "bottleneck", "model", "microbatches", "schedule")
    return {k: data[k] for k in keep if k in data}


def register_strategy(cls: type) -> type:
    """Class decorator: make strategy ``cls`` available as ``cls.name``."""
    name = getattr(cls, "name", "")
    if not name or not isinstance(name, str):
        raise StrategyError(f"strategy {cls.__name__} has no name",
                            fix="set a class attribute name = '...'")
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        raise StrategyError(f"{cls!r} is not a placer.search.Strategy subclass")
    _REGISTRY[name] = cls
    return cls


def unregister_strategy(name: str) -> None:
    """Forget a registered strategy (tests, plugins replacing one)."""
    _REGISTRY.pop(name, None)


def register_lazy(name: str, target: str) -> None:
    """Know strategy ``name`` without importing it: ``target`` is
    ``"module"`` (importing it registers ``name``) or ``"module:Class"``."""
    LAZY[name] = target


def strategy_class(name: str) -> type | None:
    """The class of ``name``, importing its module if needed; None if unknown
    or not importable (the reason is kept in ``_BROKEN``)."""
    cls = _REGISTRY.get(name)
    if cls is not None:
        return cls
    target = LAZY.get(name) or _entry_points().get(name)
    if target is None:
        return None
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        _BROKEN[name] = f"cannot import {module_name!r}: {exc}"
        return None
    if attr:
        cls = getattr(module, attr, None)
        if cls is None:
            _BROKEN[name] = f"{module_name!r} has no {attr!r}"
            return None
        if name not in _REGISTRY:
            register_strategy(cls)
    cls = _REGISTRY.get(name)
    if cls is None:
        _BROKEN[name] = f"importing {module_name!r} did not register {name!r}"
    return cls


def _entry_points() -> dict[str, str]:
    try:
        from importlib.metadata import entry_points
        return {ep.name: ep.value for ep in entry_points(group="placer.strategies")}
    except Exception:  # metadata problems must not break the registry
        return {}


def strategies() -> list[str]:
    """Names of the usable strategies (registered, or known and importable).

    >>> {"heft", "m_sct", "pipeline_dp"} <= set(strategies())
    True
    """
    names = set(_REGISTRY) | set(LAZY) | set(_entry_points())
    return sorted(n for n in names if strategy_class(n) is not None)


def get_strategy(name: "str | Strategy", **options) -> Strategy:
    """A new strategy by name with ``options`` (an instance passes through).

    >>> get_strategy("evolution", population=16, microbatches=[4, 8]).microbatches
    [4, 8]
    """
    if isinstance(name, Strategy):
        if options:
            raise StrategyError("options given with a strategy instance",
                                fix="pass the options when building the instance")
        return name
    cls = strategy_class(name) if isinstance(name, str) else None
    if cls is None:
        why = _BROKEN.get(name) if isinstance(name, str) else None
        known = ", ".join(strategies())
        if why:
            raise StrategyError(f"strategy {name!r} is not available ({why})",
                                field="method", fix=f"install what it needs or use one "
                                f"of: {known}")
        raise StrategyError(f"unknown strategy {name!r}", field="method",
                            fix=f"use one of: {known}")
    try:
        return cls(**options)
    except TypeError as exc:
        raise StrategyError(f"bad options for strategy {name!r}: {exc}",
                            field="options") from None


def check_plan(problem: "Problem", plan: Plan) -> Plan:
    """Raise :class:`StrategyError` if a strategy returned an invalid plan."""
    try:
        plan.validate(problem.graph, problem.cluster, check_fingerprints=False)
    except PlanError as exc:
        raise StrategyError(f"strategy returned an invalid plan: {exc}") from None
    return plan


def iter_registered() -> Iterable[tuple[str, type]]:
    """(name, class) of the strategies registered so far (no imports)."""
    return sorted(_REGISTRY.items())

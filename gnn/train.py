"""Training a placement policy with REINFORCE and a per-problem baseline.

Each iteration draws a few problems (a training graph on a training cluster
preset or on a perturbed random subset of one), samples ``samples``
placements per problem from the policy, scores them with the analytical cost
model at their best microbatch count and rewards ``log(reference / time)``,
the reference being the best simple heuristic plan
(:func:`gnn.problems.reference_time`). The advantage of a sample is its
reward minus the mean of the problem's samples. Now and then the best sample
is refined (Placeto-style) and the refinements are trained the same way.

A curriculum admits larger graphs stage by stage. Everything random is drawn
from generators seeded by ``(seed, iteration)``, so a run resumed from a
checkpoint continues exactly like an uninterrupted one. Ctrl-C and SIGTERM
stop a run between updates, saving the last completed one (exit status 130
and 143 on the command line); ``--resume`` continues it bit for bit.

:func:`train` is the library entry; :func:`main` the command line
(``train_policy.py`` and ``placer train``).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import io
import json
import math
import random
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from placer import datasets
from placer._cli import check_backend_arg
from placer._io import atomic_write_text, dump_json, load_document
from placer.cost import Problem, get_cost_model
from placer.errors import FormatError, PlacerError, StrategyError
from placer.executors import run_all

from .checkpoint import checkpoint_paths, load_policy, load_tensors, save_policy, save_tensors
from .features import encode_problem
from .model import PlacementPolicy, PolicyConfig
from .problems import (TRAIN_CLUSTERS, best_times, microbatch_choices, random_cluster,
                       random_graph, reference, reference_time, reward)

__all__ = ["TrainConfig", "Trainer", "TrainingInterrupted", "train", "main",
           "evaluate_policy", "VAL_GRAPHS"]

VAL_GRAPHS = ("utransformer.module", "utransformer.op", "random_dag-n100-w4-s0",
              "random_dag-n200-w8-s1")
VAL_CLUSTERS = ("two-sites", "dtfm-regional")


@dataclass
class TrainConfig:
    """Hyperparameters of a training run (saved in the checkpoint's JSON)."""

    seed: int = 0
    iterations: int = 1000
    problems: int = 4               # problems per update
    samples: int = 16               # placements sampled per problem
    lr: float = 1e-3
    entropy: float = 0.03           # bonus on the mean per-decision entropy
    max_units: int = 96             # decision units per graph in training
    curriculum: tuple = (60, 250, 1_000_000)   # largest graph (ops) per stage
    stages: tuple = (0.2, 0.5, 1.0)            # where each stage ends (fraction)
    random_clusters: float = 0.5    # share of problems on perturbed random clusters
    randomize: float = 0.0          # of those, the share randomised wider (speed classes,
                                    # slow site links: gnn.problems.random_cluster(wide=True))
    graph_randomize: float = 0.0    # share of problems on randomised graphs (skewed op
                                    # costs, shared weights: gnn.problems.random_graph)
    init: str | None = None         # start from this checkpoint's weights (stem)
    max_random_devices: int = 16
    refine: float = 0.2             # share of problems also trained in refinement
    imitation: float = 0.15         # first share of the run also imitates the reference plan
    grad_clip: float = 1.0
    checkpoint_every: int = 100
    val_every: int = 200            # and at the end; 0: never
    graphs: list | None = None      # default: the training split
    clusters: list = field(default_factory=lambda: list(TRAIN_CLUSTERS))
    policy: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["curriculum"] = list(self.curriculum)
        data["stages"] = list(self.stages)
        return data

    #: whole-number fields and their largest values
    COUNTS = {"iterations": 10**9, "problems": 4096, "samples": 4096, "max_units": 10**6,
              "max_random_devices": 8192, "checkpoint_every": 10**9}
    #: fractions in [0, 1]
    SHARES = ("random_clusters", "randomize", "graph_randomize", "refine", "imitation")

    @classmethod
    def from_dict(cls, data: dict, file: str | None = None,
                  where: str = "train") -> "TrainConfig":
        """The config in ``data`` (missing fields keep their defaults); a bad
        field is a :class:`placer.errors.FormatError` naming it."""
        from placer._io import Fields
        fields = Fields(data, where, file, FormatError)
        defaults = cls()
        values: dict = {"seed": fields.number("seed", 0, minimum=None, integer=True),
                        "val_every": fields.number("val_every", defaults.val_every,
                                                   integer=True)}
        if abs(values["seed"]) >= 2**63:
            fields.fail("seed", "must be below 2**63")
        for key, limit in cls.COUNTS.items():
            values[key] = fields.count(key, limit, getattr(defaults, key))
        for key in ("lr", "grad_clip"):
            values[key] = fields.number(key, getattr(defaults, key), positive=True)
        values["entropy"] = fields.number("entropy", defaults.entropy)
        for key in cls.SHARES:
            values[key] = fields.number(key, getattr(defaults, key))
            if values[key] > 1:
                fields.fail(key, f"must be at most 1, got {values[key]!r}")
        for key, integer in (("curriculum", True), ("stages", False)):
            items = fields.sequence(key, list(getattr(defaults, key)))
            if not items or len(items) > 64:
                fields.fail(key, "expected 1 to 64 numbers")
            values[key] = tuple(fields.check_number(v, f"{key}[{i}]", integer=integer)
                                for i, v in enumerate(items))
        for key in ("graphs", "clusters"):
            items = fields.sequence(key, None if key == "graphs" else list(defaults.clusters))
            if items is not None and (len(items) > 100_000
                                      or not all(isinstance(x, str) for x in items)):
                fields.fail(key, "expected a list of names")
            values[key] = items
        init = fields.get("init", None)
        if init is not None and (not isinstance(init, str) or not init or len(init) > 4096):
            fields.fail("init", f"expected a checkpoint path, got {init!r}")
        values["init"] = init
        policy = fields.get("policy", {})
        PolicyConfig.from_dict(policy, file, f"{where}.policy")     # checks it
        values["policy"] = dict(policy)
        return cls(**values)


class Trainer:
    """One training run: the policy, its optimizer and the problem stream."""

    def __init__(self, config: TrainConfig):
        self.config = config
        seed_everything(config.seed)
        if config.init:
            # the architecture is the checkpoint's; training starts from its weights
            self.policy = load_policy(config.init)
            config.policy = self.policy.config.to_dict()
        else:
            self.policy = PlacementPolicy(PolicyConfig.from_dict(config.policy))
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=config.lr)
        self.iteration = 0
        self.cost = get_cost_model("analytical")
        names = list(config.graphs) if config.graphs is not None else datasets.split("train")
        self.graph_names = names
        self._graphs: dict = {}
        self._sizes: dict = {}
        self._clusters = {name: datasets.cluster(name) for name in config.clusters}
        self._refs: dict = {}
        self.history: list[dict] = []
        self.elapsed_before = 0.0       # training seconds of the runs this one continues
        self.saved_iteration: int | None = None

    # --- problems -------------------------------------------------------------
    def graph(self, name: str):
        g = self._graphs.get(name)
        if g is None:
            g = self._graphs[name] = datasets.graph(name)
        return g

    def size(self, name: str) -> int:
        if name not in self._sizes:
            self._sizes[name] = len(self.graph(name))
        return self._sizes[name]

    def stage(self, iteration: int) -> int:
        frac = iteration / max(self.config.iterations, 1)
        for i, end in enumerate(self.config.stages):
            if frac < end:
                return i
        return len(self.config.stages) - 1

    def draw(self, rng: np.random.Generator, stage: int):
        """A (problem, reference time) of the curriculum's ``stage``."""
        limit = self.config.curriculum[min(stage, len(self.config.curriculum) - 1)]
        names = [n for n in self.graph_names if self.size(n) <= limit] or \
            [min(self.graph_names, key=self.size)]
        name = names[int(rng.integers(len(names)))]
        if rng.random() < self.config.random_clusters:
            cluster = random_cluster(rng, list(self._clusters.values()),
                                     self.config.max_random_devices,
                                     wide=bool(rng.random() < self.config.randomize))
            key = None
        else:
            cname = self.config.clusters[int(rng.integers(len(self.config.clusters)))]
            cluster = self._clusters[cname]
            key = (name, cname)
        graph = self.graph(name)
        # drawn only when asked for: runs without it keep their random stream
        if self.config.graph_randomize > 0 and rng.random() < self.config.graph_randomize:
            graph, key = random_graph(rng, graph), None
        problem = Problem(graph, cluster)
        ref = self._refs.get(key) if key else None
        if ref is None:
            ref = reference(self.cost, problem)
            if key:
                self._refs[key] = ref
        return problem, ref

    # --- one update ---------------------------------------------------------------
    def _loss(self, problem, ref_plan, done: dict, imitate: float
              ) -> tuple[torch.Tensor, dict]:
        """The loss of one problem's rollout ``done`` (:func:`rollout`): the
        log-probabilities of its placements, taken again here with
        gradients."""
        cfg = self.config
        ref, ref_row = ref_plan
        pg = encode_problem(problem, cfg.max_units)
        n_dec = max(int((pg.tie == np.arange(pg.n_units)).sum()), 1)
        encoded = self.policy.static_scores(pg)
        # copies: arrays from Ray arrive read-only
        out = self.policy.sample(pg, cfg.samples, actions=np.array(done["actions"]),
                                 encoded=encoded)
        times = done["times"]
        terms = [(out, reward(times, ref))]
        if "context" in done:
            ref_out = self.policy.sample(pg, cfg.samples, context=done["context"],
                                         actions=np.array(done["refined"]), encoded=encoded)
            terms.append((ref_out, reward(done["refined_times"], ref)))
            times = np.concatenate([times, done["refined_times"]])
        loss = torch.zeros(())
        for dec, rr in terms:
            adv = torch.as_tensor((rr - rr.mean()) / (rr.std() + 0.1), dtype=torch.float32)
            loss = loss - (adv * dec.log_prob).mean() / n_dec \
                - cfg.entropy * dec.entropy.mean() / n_dec
        if imitate > 0:
            first = np.zeros(pg.n_units, dtype=np.int64)
            first[pg.unit_of[::-1]] = np.arange(len(pg.unit_of))[::-1]
            teacher = self.policy.sample(pg, 1, actions=ref_row[first][None], encoded=encoded)
            loss = loss - imitate * teacher.log_prob.mean() / n_dec
        best_r = float(reward(np.array([times.min()]), ref)[0])
        return loss, {"reward": float(terms[0][1].mean()), "best": best_r,
                      "entropy": float(out.entropy.detach().mean()) / n_dec}

    def step(self) -> dict:
        """One update; returns its log row."""
        return self.apply(self.gradients())

    def gradients(self) -> dict:
        """The losses and gradients of the next update; changes nothing a
        checkpoint holds, so it may be abandoned half way (see :meth:`apply`).

        Problem ``i`` of iteration ``it`` draws from its own streams
        (:func:`problem_streams`); its sampled rollout runs on the workers
        when :attr:`backend`/:attr:`workers` ask for them, the gradients
        here: the update is the same wherever the rollouts ran."""
        cfg = self.config
        it = self.iteration
        stage = self.stage(it)
        self.policy.train()
        self.optimizer.zero_grad()
        imitate = max(0.0, 1.0 - it / max(cfg.imitation * cfg.iterations, 1e-9)) \
            if cfg.imitation > 0 else 0.0
        drawn = [self.draw(problem_streams(cfg.seed, it, i)[0], stage)
                 for i in range(cfg.problems)]
        jobs = [(problem, cfg.seed, it, i) for i, (problem, _) in enumerate(drawn)]
        rows = []
        total = torch.zeros(())
        for (problem, ref), done in zip(drawn, self._rollouts(jobs)):
            loss, row = self._loss(problem, ref, done, imitate)
            total = total + loss / cfg.problems
            row.update(graph=problem.graph.name, cluster=problem.cluster.name)
            rows.append(row)
        total.backward()
        torch.nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.grad_clip)
        return {"iteration": it + 1, "stage": stage, "loss": float(total.detach()),
                "reward": float(np.mean([r["reward"] for r in rows])),
                "best": float(np.mean([r["best"] for r in rows])),
                "entropy": float(np.mean([r["entropy"] for r in rows])),
                "graphs": " ".join(sorted({r["graph"] for r in rows}))}

    #: where the sampled rollouts run (see :mod:`placer.executors`): set by :func:`train`
    backend: str = "local"
    workers: int = 0

    def _rollouts(self, jobs: list) -> list[dict]:
        """:func:`rollout` of each ``(problem, seed, iteration, index)``, in
        order: on the executor, else here."""
        cfg = self.config
        run = functools.partial(rollout, self.policy, samples=cfg.samples, refine=cfg.refine,
                                max_units=cfg.max_units)
        remote = self.workers > 1 or self.backend != "local"
        if not remote:
            # one torch thread, as on the workers: the same sums, the same samples
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                return [run(job) for job in jobs]
            finally:
                torch.set_num_threads(threads)
        if getattr(self, "_executor", None) is None:
            from placer.executors import make_executor
            # not forked: this process ran torch, whose threads a fork can hang
            from placer.executors import cluster_cpus
            self._executor = make_executor(self.backend,
                                           self.workers or cluster_cpus(self.backend),
                                           _one_thread, fork=False)
        futures = [self._executor.submit(run, job) for job in jobs]
        return [f.result() for f in futures]

    def close(self) -> None:
        """Stop the rollouts' workers, if any."""
        executor = getattr(self, "_executor", None)
        if executor is not None:
            executor.shutdown()
            self._executor = None

    def apply(self, row: dict) -> dict:
        """Take the optimizer step :meth:`gradients` prepared; returns ``row``."""
        self.optimizer.step()
        self.iteration += 1
        return row

    # --- checkpoints ----------------------------------------------------------------
    def save(self, stem, *, elapsed: float = 0.0) -> None:
        """Policy (``stem.pt`` + ``stem.json``) and the optimizer state for
        resuming (``stem.train.pt``)."""
        weights, _ = checkpoint_paths(stem)
        # written first, the policy's JSON last: resume checks they agree
        save_tensors(weights.with_name(weights.stem + ".train.pt"),
                     {"optimizer": self.optimizer.state_dict(),
                      "iteration": torch.tensor(self.iteration),
                      "rng": rng_states()})
        save_policy(stem, self.policy, {"train": self.config.to_dict(),
                                        "iteration": self.iteration,
                                        "train_seconds": round(elapsed, 1)})

    @classmethod
    def resume(cls, stem, config: TrainConfig | None = None) -> "Trainer":
        """A trainer continuing the run saved at ``stem``."""
        weights, cfg_path = checkpoint_paths(stem)
        if not cfg_path.is_file():
            raise FormatError("no checkpoint to resume", file=str(cfg_path),
                              fix="restart without --resume, or give the -o of the run")
        data = load_document(cfg_path, FormatError)
        if not isinstance(data, dict):
            raise FormatError(f"expected a mapping, got {type(data).__name__}",
                              file=str(cfg_path), fix="restart without --resume")
        saved = TrainConfig.from_dict(data.get("train") or {}, str(cfg_path))
        if config is not None:
            saved.iterations = config.iterations
        trainer = cls(saved)
        trainer.policy.load_state_dict(load_policy(stem).state_dict())
        train_path = weights.with_name(weights.stem + ".train.pt")
        state = load_tensors(train_path)
        if not isinstance(state, dict) or not {"optimizer", "iteration"} <= set(state):
            raise FormatError("not a training state (optimizer, iteration)",
                              file=str(train_path), fix="restart without --resume")
        try:
            trainer.iteration = int(state["iteration"])
        except (TypeError, ValueError, RuntimeError) as exc:
            raise FormatError(f"malformed iteration ({exc})", file=str(train_path),
                              field="iteration", fix="restart without --resume") from None
        if trainer.iteration != data.get("iteration"):
            raise FormatError(f"training state is at iteration {trainer.iteration} but the "
                              f"policy at {data.get('iteration')} (a save was cut short)",
                              file=str(train_path), fix="restart without --resume")
        try:
            trainer.optimizer.load_state_dict(state["optimizer"])
        except (ValueError, KeyError, TypeError) as exc:
            raise FormatError(f"optimizer state does not fit the policy: {exc}",
                              file=str(train_path), fix="restart without --resume") from None
        if "rng" in state:
            try:
                set_rng_states(state["rng"])
            except (TypeError, ValueError, KeyError, IndexError, AttributeError,
                    RuntimeError, OverflowError) as exc:
                raise FormatError(f"malformed random states ({str(exc)[:80]})",
                                  file=str(train_path), field="rng",
                                  fix="restart without --resume") from None
        from placer._io import Fields
        trainer.elapsed_before = Fields(data, "", str(cfg_path), FormatError).number(
            "train_seconds", 0.0)
        trainer.saved_iteration = trainer.iteration
        return trainer


def seed_everything(seed: int) -> None:
    """Seed the global generators of torch, numpy and Python (the policy's
    initial weights come from torch's)."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def rng_states() -> dict:
    """The global random states of torch, numpy and Python as tensors and
    numbers (so ``torch.load(weights_only=True)`` reads them back).

    Training draws from generators seeded by ``(seed, iteration)``; these are
    saved too so that code relying on the global generators also resumes
    where it stopped."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, py_gauss = random.getstate()
    return {"torch": torch.get_rng_state(),
            "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)),
                      "pos": int(pos), "has_gauss": int(has_gauss), "gauss": float(gauss)},
            "python": {"version": version, "internal": torch.tensor(internal, dtype=torch.int64),
                       "gauss": py_gauss}}


def set_rng_states(states: dict) -> None:
    """Restore what :func:`rng_states` returned."""
    torch.set_rng_state(states["torch"])
    n = states["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"],
                         n["has_gauss"], n["gauss"]))
    p = states["python"]
    random.setstate((p["version"], tuple(int(x) for x in p["internal"].tolist()), p["gauss"]))


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped by Ctrl-C or SIGTERM after saving the last completed
    iteration. ``signum`` is the signal, ``iteration`` that iteration and
    ``checkpoint`` the stem saved (None when training had no ``out``). A
    KeyboardInterrupt, so code unaware of it still sees an interrupt."""

    def __init__(self, signum: int, iteration: int, checkpoint: str | None):
        name = signal.Signals(signum).name
        where = f"checkpoint {checkpoint}.pt" if checkpoint else "nothing saved"
        super().__init__(f"interrupted by {name} after iteration {iteration}; {where}")
        self.signum, self.iteration, self.checkpoint = signum, iteration, checkpoint


class _Stop(BaseException):
    """Raised by :class:`_StopSignals` where the signal arrived."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class _StopSignals:
    """While entered, SIGINT and SIGTERM stop training: at once outside
    :meth:`held` blocks, at their end inside them, so an update, its log row
    and its checkpoint are never half done. A second signal inside a held
    block stops at once, without saving (the files stay whole: they are
    written atomically, and resume checks that they agree)."""

    def __init__(self):
        self.signum: int | None = None
        self._held = 0
        self._previous: dict = {}

    def __enter__(self) -> "_StopSignals":
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum, frame) -> None:
        if self._held and self.signum is not None:
            raise KeyboardInterrupt(f"{signal.Signals(signum).name} again: stopped "
                                    f"without saving")
        self.signum = signum
        if not self._held:
            raise _Stop(signum)

    @contextlib.contextmanager
    def held(self, stop_after: bool = True):
        """A block that a signal does not cut short; it stops at its end
        unless ``stop_after`` is false (the stop is already being handled)."""
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1
        if stop_after and not self._held and self.signum is not None:
            raise _Stop(self.signum)


def problem_streams(seed: int, iteration: int, index: int
                    ) -> tuple[np.random.Generator, np.random.Generator, torch.Generator]:
    """The random streams of problem ``index`` of ``iteration``: drawing the
    problem, deciding its refinement, sampling its placements. Each problem
    has its own, so results never depend on where, or beside which others,
    its rollout runs."""
    draw, roll, sample = np.random.SeedSequence([seed, iteration, index]).spawn(3)
    torch_seed = int(sample.generate_state(1, np.uint64)[0]) & ((1 << 63) - 1)
    return (np.random.default_rng(draw), np.random.default_rng(roll),
            torch.Generator().manual_seed(torch_seed))


def rollout(policy: PlacementPolicy, job: tuple, *, samples: int, refine: float,
            max_units: int) -> dict:
    """One problem's sampled rollout, without gradients: ``samples``
    placements of ``job = (problem, seed, iteration, index)`` and their
    step times by the analytical model at their best microbatch count
    (``actions``, ``times``), and, with probability ``refine``, as many
    refinements of the best (``context``, ``refined``, ``refined_times``)."""
    problem, seed, iteration, index = job
    _, roll, gen = problem_streams(seed, iteration, index)
    cost = get_cost_model("analytical")
    pg = encode_problem(problem, max_units)
    choices = microbatch_choices(problem)
    with torch.no_grad():
        encoded = policy.static_scores(pg)
        acts = policy.sample(pg, samples, generator=gen, encoded=encoded).actions.numpy()
        times, _, _ = best_times(cost, problem, pg.expand(acts), choices)
        out = {"actions": acts, "times": times}
        if roll.random() < refine:
            best = acts[int(np.argmin(times))]
            more = policy.sample(pg, samples, generator=gen, context=best,
                                 encoded=encoded).actions.numpy()
            t2, _, _ = best_times(cost, problem, pg.expand(more), choices)
            out.update(context=best, refined=more, refined_times=t2)
    return out


def _one_thread() -> None:
    """A rollout worker's initializer: one torch thread (the workers are
    the parallelism)."""
    torch.set_num_threads(1)


def evaluate_policy(policy: PlacementPolicy, problems, *, samples: int = 8, seed: int = 0,
                    max_units: int = 128, cost_model="analytical", backend: str = "local",
                    workers: int = 0) -> list[dict]:
    """Best-of-(greedy + ``samples``) reward on each ``(problem, reference)``;
    the problems' episodes run on ``workers`` processes or Ray workers
    (``backend``, see :mod:`placer.executors`) with the same results (each
    problem's generator is seeded by its position)."""
    policy.eval()
    episode = functools.partial(_episode, policy, samples=samples, seed=seed,
                                max_units=max_units, cost_model=cost_model)
    # a local pool forked from a process that ran torch can hang: Ray only
    return run_all(episode, list(enumerate(problems)), backend=backend,
                   workers=0 if backend == "local" else workers)


def _episode(policy: PlacementPolicy, item, *, samples: int, seed: int, max_units: int,
             cost_model) -> dict:
    """One problem of :func:`evaluate_policy`."""
    i, (problem, ref) = item
    cost = get_cost_model(cost_model)
    policy.eval()
    with torch.no_grad():
        pg = encode_problem(problem, max_units)
        enc = policy.static_scores(pg)
        gen = torch.Generator().manual_seed(seed + i)
        acts = [policy.sample(pg, 1, greedy=True, encoded=enc).actions]
        if samples:
            acts.append(policy.sample(pg, samples, generator=gen, encoded=enc).actions)
        A = pg.expand(torch.cat(acts).numpy())
        t, _, _ = best_times(cost, problem, A, microbatch_choices(problem))
    return {"graph": problem.graph.name, "cluster": problem.cluster.name,
            "time": float(t.min()), "greedy": float(t[0]), "reference": ref,
            "reward": float(reward(np.array([t.min()]), ref)[0])}


def _val_problems(cost):
    out = []
    for g in VAL_GRAPHS:
        for c in VAL_CLUSTERS:
            p = Problem(datasets.graph(g), datasets.cluster(c))
            out.append((p, reference_time(cost, p)))
    return out


def train(config: TrainConfig, out=None, *, resume: bool = False, progress: bool = True,
          validate: bool = True, log=None, time_budget: float | None = None,
          backend: str = "local", workers: int = 0) -> Trainer:
    """Train (or resume) a policy; checkpoints, CSV log and learning curve go
    to ``out`` (a stem: ``out.pt``, ``out.json``, ``out.csv``, ``out.png``).
    With ``time_budget`` (seconds of this call) training stops after the
    iteration that spends it and saves a checkpoint that ``resume`` continues.
    Ctrl-C or SIGTERM (caught on the main thread) saves the last completed
    iteration the same way and raises :class:`TrainingInterrupted`.
    ``backend`` and ``workers``: where the iterations' sampled rollouts
    (``workers`` > 1, or any on Ray) and validation's per-problem episodes
    (Ray only, see :func:`evaluate_policy`) run; the run is the same
    wherever."""
    if resume:
        if out is None:
            raise StrategyError("resume needs the checkpoint to continue", field="out")
        trainer = Trainer.resume(out, config)
    else:
        trainer = Trainer(config)
    cfg = trainer.config
    csv_path = Path(str(out) + ".csv") if out is not None else None
    if resume and csv_path is not None and csv_path.is_file():
        with open(csv_path, newline="") as handle:
            trainer.history = [_typed(r) for r in csv.DictReader(handle)
                               if int(r["iteration"]) <= trainer.iteration]
    val = _val_problems(trainer.cost) if validate and cfg.val_every > 0 else []
    bar = None
    if progress:
        try:
            from tqdm import tqdm
            bar = tqdm(total=cfg.iterations, initial=trainer.iteration, desc="train",
                       unit="it", file=sys.stderr, dynamic_ncols=True)
        except ImportError:
            bar = None
    trainer.backend, trainer.workers = backend, int(workers or 0)
    t0 = time.perf_counter()
    with _StopSignals() as signals:
        try:
            _loop(trainer, out, val, bar, log, time_budget, t0, signals,
                  {"backend": backend, "workers": workers})
        except _Stop as stop:
            if out is not None and trainer.saved_iteration != trainer.iteration:
                with signals.held(stop_after=False):
                    _save(trainer, out)
            raise TrainingInterrupted(stop.signum, trainer.iteration,
                                      None if out is None else str(out)) from None
        finally:
            trainer.close()
            if bar is not None:
                bar.close()
    return trainer


def _loop(trainer, out, val, bar, log, time_budget, t0, signals, parallel: dict) -> None:
    """The iterations of :func:`train`; a signal stops it between updates."""
    cfg = trainer.config
    while trainer.iteration < cfg.iterations:
        row = trainer.gradients()
        with signals.held():
            trainer.apply(row)
            row["seconds"] = round(trainer.elapsed_before + time.perf_counter() - t0, 2)
            it = trainer.iteration
            if val and (it % cfg.val_every == 0 or it == cfg.iterations):
                res = evaluate_policy(trainer.policy, val, seed=cfg.seed, **parallel)
                row["val"] = float(np.mean([r["reward"] for r in res]))
            trainer.history.append(row)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(stage=row["stage"], reward=f"{row['reward']:.3f}",
                                best=f"{row['best']:.3f}")
            if log is not None:
                log(row)
            over_budget = time_budget is not None and time.perf_counter() - t0 >= time_budget
            if out is not None and (it % cfg.checkpoint_every == 0 or it == cfg.iterations
                                    or over_budget):
                _save(trainer, out)
        if over_budget:
            return


def _save(trainer: Trainer, out) -> None:
    """Checkpoint and logs of the last completed iteration."""
    last = trainer.history[-1].get("seconds", 0.0) if trainer.history else trainer.elapsed_before
    trainer.save(out, elapsed=last)
    _write_logs(out, trainer.history)
    trainer.saved_iteration = trainer.iteration


def _typed(row: dict) -> dict:
    out = {}
    for k, v in row.items():
        if v in ("", None):
            continue
        try:
            out[k] = int(v) if k in ("iteration", "stage") else float(v)
        except ValueError:
            out[k] = v
    return out


def _write_logs(stem, history: list[dict]) -> None:
    keys = ["iteration", "stage", "loss", "reward", "best", "entropy", "val", "seconds",
            "graphs"]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=keys, extrasaction="ignore")
    writer.writeheader()
    for row in history:
        writer.writerow({k: row.get(k, "") for k in keys})
    atomic_write_text(str(stem) + ".csv", buffer.getvalue())
    try:
        plot_learning_curve(history, str(stem) + ".png")
    except ImportError:
        pass


def plot_learning_curve(history: list[dict], path) -> None:
    """Mean and best-sample reward per iteration (smoothed) and validation."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from placer._io import atomic_write_bytes
    its = np.array([r["iteration"] for r in history])
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, label in (("reward", "mean sample"), ("best", "best sample")):
        y = np.array([r[key] for r in history], dtype=float)
        w = max(1, len(y) // 50)
        smooth = np.convolve(y, np.ones(w) / w, mode="valid")
        ax.plot(its[w - 1:], smooth, label=f"{label} (train)")
    val = [(r["iteration"], r["val"]) for r in history if "val" in r]
    if val:
        ax.plot(*zip(*val), "o-", label="validation best-of-9")
    ax.axhline(0.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("iteration")
    ax.set_ylabel("reward = log(heuristic time / plan time)")
    ax.legend(loc="lower right")
    ax.set_title("placement policy training")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())


# --- hyperparameter search -------------------------------------------------------

def tune(trials: int, base: TrainConfig, iterations: int, out=None,
         progress: bool = False) -> dict:
    """An Optuna study (TPE, seeded) of ``trials`` short runs; returns the
    best parameters and writes the trials to ``out.tune.json``."""
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    cost = get_cost_model("analytical")
    val = _val_problems(cost)

    def objective(trial):
        cfg = TrainConfig.from_dict(base.to_dict())
        cfg.iterations = iterations
        cfg.lr = trial.suggest_float("lr", 1e-4, 3e-3, log=True)
        cfg.entropy = trial.suggest_float("entropy", 1e-3, 5e-2, log=True)
        cfg.samples = trial.suggest_categorical("samples", [8, 16, 32])
        cfg.refine = trial.suggest_float("refine", 0.0, 0.5)
        cfg.policy = dict(cfg.policy, hidden=trial.suggest_categorical("hidden", [32, 64, 96]),
                          layers=trial.suggest_int("layers", 2, 4))
        trainer = train(cfg, None, progress=progress, validate=False)
        res = evaluate_policy(trainer.policy, val, seed=base.seed)
        return float(np.mean([r["reward"] for r in res]))

    study = optuna.create_study(direction="maximize",
                                sampler=optuna.samplers.TPESampler(seed=base.seed))
    study.optimize(objective, n_trials=trials)
    result = {"best_params": study.best_params, "best_value": study.best_value,
              "trials": [{"params": t.params, "value": t.value} for t in study.trials]}
    if out is not None:
        atomic_write_text(str(out) + ".tune.json", dump_json(result))
    return result


# --- command line ------------------------------------------------------------------

def build_parser(prog: str = "train_policy.py") -> argparse.ArgumentParser:
    """The argument parser of :func:`main`."""
    d = TrainConfig()
    from placer._cli import add_backend, add_json, add_time_budget, command_parser
    p = command_parser(prog, "Train a placement policy (REINFORCE with a per-problem baseline) "
                       "on the training split; checkpoints are state dicts plus JSON.",
                       f"{prog} --iterations 200 -o policy --time-budget 600",
                       f"{prog} --iterations 400 -o policy --resume   # continue that run",
                       "placer plan gpt-125m --cluster two-sites --method rl  "
                       "# uses the shipped policy")
    p.add_argument("-o", "--out", default="gnn/checkpoints/policy",
                   help="checkpoint stem: writes STEM.pt, .json, .train.pt, .csv, .png")
    p.add_argument("--iterations", type=int, default=d.iterations)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--problems", type=int, default=d.problems, help="problems per update")
    p.add_argument("--samples", type=int, default=d.samples, help="placements per problem")
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--entropy", type=float, default=d.entropy)
    p.add_argument("--refine", type=float, default=d.refine)
    p.add_argument("--imitation", type=float, default=d.imitation,
                   help="share of the run that also imitates the reference heuristic plan")
    p.add_argument("--max-units", type=int, default=d.max_units)
    p.add_argument("--hidden", type=int, default=PolicyConfig.hidden)
    p.add_argument("--layers", type=int, default=PolicyConfig.layers)
    p.add_argument("--graphs", nargs="+", help="graph names (default: the training split)")
    p.add_argument("--clusters", nargs="+", default=list(TRAIN_CLUSTERS))
    p.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every)
    p.add_argument("--val-every", type=int, default=d.val_every,
                   help="validate every N iterations and at the end (0: never)")
    p.add_argument("--randomize", type=float, default=d.randomize, metavar="SHARE",
                   help="share of the random clusters drawn with a second speed class and "
                        "wider, slower site links (domain randomisation)")
    p.add_argument("--graph-randomize", type=float, default=d.graph_randomize,
                   metavar="SHARE", help="share of problems on randomised training graphs "
                   "(lognormally skewed op costs, groups of ops sharing weights)")
    p.add_argument("--init", metavar="STEM", help="start from this checkpoint's weights "
                   "(e.g. gnn/checkpoints/policy), its architecture")
    p.add_argument("--resume", action="store_true", help="continue the run saved at --out")
    p.add_argument("--tune", type=int, default=0, metavar="N",
                   help="run an Optuna study of N short trials instead of training")
    p.add_argument("--tune-iterations", type=int, default=100)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--no-progress", action="store_true")
    add_time_budget(p, "training (stops after the running iteration, saving a checkpoint "
                    "that --resume continues)")
    add_backend(p, "the sampled rollouts and validation's per-problem episodes")
    add_json(p)
    return p


def main(argv: list[str] | None = None, prog: str = "train_policy.py") -> int:
    """Command line: train, resume or tune; returns an exit status."""
    args = build_parser(prog).parse_args(argv)
    try:
        check_backend_arg(args)
    except PlacerError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(max(1, args.threads))
    cfg = TrainConfig(seed=args.seed, iterations=args.iterations, problems=args.problems,
                      samples=args.samples, lr=args.lr, entropy=args.entropy,
                      refine=args.refine, imitation=args.imitation,
                      max_units=args.max_units,
                      checkpoint_every=args.checkpoint_every, val_every=args.val_every,
                      graphs=args.graphs, clusters=list(args.clusters),
                      randomize=args.randomize, graph_randomize=args.graph_randomize,
                      init=args.init,
                      policy={"hidden": args.hidden, "layers": args.layers})
    with _StopSignals():      # a signal before or after the training loop: nothing to save
        return _run(args, cfg, prog)


def _run(args, cfg: TrainConfig, prog: str) -> int:
    """:func:`main` once the arguments are parsed."""
    try:
        if args.tune:
            result = tune(args.tune, cfg, args.tune_iterations, args.out,
                          progress=not args.no_progress)
            print(json.dumps({"best_params": result["best_params"],
                              "best_value": result["best_value"]}, indent=1))
            return 0
        t0 = time.perf_counter()
        trainer = train(cfg, args.out, resume=args.resume, progress=not args.no_progress,
                        time_budget=args.time_budget, backend=args.backend,
                        workers=args.workers or 0)
        last = trainer.history[-1] if trainer.history else {}
        if args.json:
            print(json.dumps({"iterations": trainer.iteration, "checkpoint": f"{args.out}.pt",
                              "seconds": last.get("seconds"), "last": last}, indent=1))
            return 0
        print(f"trained {trainer.iteration} iterations in {time.perf_counter() - t0:.1f}s "
              f"(total {last.get('seconds', 0):.1f}s); last val {last.get('val', math.nan):.3f}; "
              f"checkpoint {args.out}.pt")
        return 0
    except PlacerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except TrainingInterrupted as exc:
        resume = " (continue with --resume)" if exc.checkpoint else ""
        print(f"{prog}: {exc}{resume}", file=sys.stderr)
        return 128 + exc.signum
    except _Stop as stop:
        print(f"{prog}: interrupted by {signal.Signals(stop.signum).name}; nothing new to save",
              file=sys.stderr)
        return 128 + stop.signum
    except KeyboardInterrupt as exc:
        print(f"{prog}: interrupted{f' ({exc})' if str(exc) else ''}", file=sys.stderr)
        return 130

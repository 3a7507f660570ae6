"""Conventions shared by every ``placer`` subcommand's parser: a description,
an example in ``--help``, ``--seed``, ``--time-budget``, ``--json`` and
``-o/--output`` spelled and explained the same way everywhere."""
from __future__ import annotations

import argparse


def formatter(prog: str) -> argparse.HelpFormatter:
    """Help formatter that keeps the example's line breaks."""
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=32)


def command_parser(prog: str, description: str, *examples: str) -> argparse.ArgumentParser:
    """A parser for a subcommand whose ``--help`` ends with runnable examples."""
    lines = "\n".join(f"  {e}" for e in examples)
    return argparse.ArgumentParser(prog=prog, description=description,
                                   epilog=f"example{'s' if len(examples) > 1 else ''}:\n{lines}",
                                   formatter_class=formatter)


def add_seed(p: argparse.ArgumentParser, what: str = "random choices", default: int | None = 0):
    """``--seed N``: the same seed and inputs give the same result."""
    p.add_argument("--seed", type=int, default=default,
                   help=f"seed of the {what} (default {default})")


def add_time_budget(p: argparse.ArgumentParser, what: str, default: float | None = None):
    """``--time-budget SECONDS``: stop ``what`` after this long, keeping the best so far."""
    p.add_argument("--time-budget", type=float, default=default, metavar="SECONDS",
                   help=f"seconds of {what}" + ("" if default is None else f" (default {default:g})")
                   + ("; unlimited when not given" if default is None else ""))


def add_backend(p: argparse.ArgumentParser, what: str) -> None:
    """``--backend`` and ``--workers``: where ``what`` runs in parallel (see
    :mod:`placer.executors`)."""
    p.add_argument("--backend", default="local", metavar="WHERE",
                   help=f"where {what} run: local (processes on this machine, the default), "
                        "ray (joins RAY_ADDRESS or starts Ray here), auto (a running Ray "
                        "cluster) or ray://HOST:PORT; needs pip install 'placer[ray]' for "
                        "Ray; results never depend on it")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help=f"processes for {what} (default: the strategy's own; on Ray, the "
                        "cluster's CPUs)")


def check_backend_arg(args) -> None:
    """One clear line for a bad ``--backend``/``--workers`` (or Ray missing),
    before any work starts."""
    from .errors import PlacerError
    from .executors import check_backend
    check_backend(args.backend, field="--backend")
    if args.workers is not None and args.workers < 0:
        raise PlacerError(f"must be >= 0, got {args.workers}", field="--workers",
                          fix="give a number of processes, or leave it out")


def add_json(p: argparse.ArgumentParser) -> None:
    """``--json``: print machine-readable output instead of text."""
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")


class SearchBar:
    """A tqdm bar over a search's time (or evaluation) budget showing the
    best step time so far; a progress callback for :func:`placer.optimize`.
    Call :meth:`close` when the search ends."""

    def __init__(self, time_budget: float | None, evaluations: int | None, label: str = "search"):
        from tqdm.auto import tqdm
        self.by_evals = time_budget is None and evaluations is not None
        total = evaluations if self.by_evals else time_budget
        self.bar = tqdm(total=total, desc=label, unit="eval" if self.by_evals else "s",
                        leave=False, dynamic_ncols=True,
                        bar_format=("{desc}{percentage:3.0f}%|{bar}| {n:g}/{total:g} {unit}"
                                    "{postfix}") if total else "{desc}{elapsed}{postfix}")

    def __call__(self, event) -> None:
        done = event.evaluations if self.by_evals else event.elapsed
        if self.bar.total:
            done = min(done, self.bar.total)
        self.bar.n = round(done, 1)
        step = event.step_time if event.step_time is not None else event.best
        self.bar.set_postfix_str(f"{event.strategy}: best {step * 1e3:.4g} ms"
                                 + ("" if event.feasible in (None, True) else " (over memory)"),
                                 refresh=True)

    def next_search(self, label: str) -> None:
        """Start the next of several searches on the same bar."""
        self.bar.set_description(label)
        self.bar.reset(total=self.bar.total)

    def close(self) -> None:
        """Remove the bar."""
        self.bar.close()


def add_model_options(p: argparse.ArgumentParser) -> None:
    """How a model named as ``MODULE:FACTORY`` or a zoo name is built: the
    same flags on ``trace``, ``plan``, ``run`` and ``launch``."""
    p.add_argument("--input-shape", action="append", metavar="SHAPE",
                   help="MODULE:FACTORY: shape of one example input, e.g. 8,3,224,224 "
                        "(repeat per input)")
    p.add_argument("--input-dtype", default="float32",
                   help="MODULE:FACTORY: dtype of the example inputs (default float32)")
    p.add_argument("--batch", type=int, help="batch size for zoo models")
    p.add_argument("--seq", type=int, help="sequence length / image side for zoo models")
    p.add_argument("--tiny", action="store_true",
                   help="zoo models: the small test configuration")


class slow_stage:
    """``with slow_stage("placer plan", "tracing gpt-125m"):`` prints
    ``placer plan: tracing gpt-125m ...`` on stderr once the stage has run
    for ``after`` seconds (on a terminal or not: one line per slow stage),
    and nothing for quick ones. ``quiet`` turns it off."""

    def __init__(self, prog: str, label: str, after: float = 2.0, quiet: bool = False):
        import threading
        self.line = f"{prog}: {label} ..."
        self.timer = None if quiet else threading.Timer(after, self._say)
        if self.timer is not None:
            self.timer.daemon = True

    def _say(self) -> None:
        import sys
        print(self.line, file=sys.stderr, flush=True)

    def __enter__(self) -> "slow_stage":
        if self.timer is not None:
            self.timer.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.timer is not None:
            self.timer.cancel()
#: what ``--help`` says about every file option
OUTPUT_NOTE = ("; an existing file is replaced atomically (never left half-written), and "
               "an output that is also an input is refused")


def note_atomic_outputs(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Append :data:`OUTPUT_NOTE` to the help of every ``-o/--output`` of
    ``parser`` and its subcommands."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in set(action.choices.values()):
                note_atomic_outputs(sub)
        elif "--output" in action.option_strings and action.help and \
                OUTPUT_NOTE not in action.help:
            action.help += OUTPUT_NOTE
    return parser

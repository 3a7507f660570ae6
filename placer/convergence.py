"""Search convergence: the best step time a search had found, over time.

A :class:`Convergence` is a progress callback (see
:func:`placer.optimize`'s ``progress``) that records every report of one or
several searches, keyed by strategy, and draws them as one picture.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

from ._io import PathLike

if TYPE_CHECKING:
    from .search.base import Progress


class Convergence:
    """Records ``(seconds, evaluations, best step time, feasible)`` per strategy.

    Pass it as ``progress=`` (it forwards each event to ``forward`` if given),
    then :meth:`plot` or :meth:`to_dict`. Only improvements are kept, so the
    series is monotone per strategy.

    >>> import placer
    >>> from placer.convergence import Convergence
    >>> g = placer.datasets.layered(30, width=3, seed=0)
    >>> c = placer.Cluster.preset("two-sites")
    >>> conv = Convergence()
    >>> _ = placer.optimize(g, c, "evolution", seed=0, time_budget=None,
    ...                     evaluations=300, progress=conv)
    >>> series = conv.series["evolution"]
    >>> all(a["step_time"] >= b["step_time"] for a, b in zip(series, series[1:]))
    True
    """

    def __init__(self, forward: Callable[["Progress"], None] | None = None, label: str | None = None):
        self.forward = forward
        self.label = label
        self.series: dict[str, list[dict]] = {}

    def __call__(self, event: "Progress") -> None:
        step = event.step_time if event.step_time is not None else event.best
        if step is not None and math.isfinite(step):
            rows = self.series.setdefault(self.label or event.strategy, [])
            if not rows or step < rows[-1]["step_time"] or event.done:
                rows.append({"seconds": float(event.elapsed), "evaluations": int(event.evaluations),
                             "step_time": float(min(step, rows[-1]["step_time"]) if rows else step),
                             "feasible": event.feasible})
        if self.forward is not None:
            self.forward(event)

    def labelled(self, label: str) -> "Convergence":
        """A recorder writing into this one's series under ``label``
        (to compare several runs of the same strategy)."""
        other = Convergence(self.forward, label)
        other.series = self.series
        return other

    def to_dict(self) -> dict:
        """The series as plain JSON-able data."""
        return {name: list(rows) for name, rows in self.series.items()}

    def plot(self, path: PathLike, *, title: str = "") -> None:
        """Draw best step time against search time, one line per strategy."""
        from .plots import plot_convergence
        plot_convergence(self.series, path, title=title)

"""What a cost model (or a measured run) says about one plan.

>>> r = Report(step_time=0.5, peak_memory={"a0": 1e9}, busy={"a0": 0.4})
>>> r.feasible, r.objective
(True, 0.5)
>>> print(r.summary().splitlines()[0])
step 500 ms, feasible
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Callable, Iterable

from .._io import PathLike, atomic_write_bytes, atomic_write_text


@dataclass
class Event:
    """One bar of a timeline: on ``lane`` (a device or ``"a->b"`` link),
    ``name`` from ``start`` for ``duration`` seconds."""

    lane: str
    name: str
    category: str
    start: float
    duration: float
    args: dict = field(default_factory=dict)


@dataclass
class Report:
    """Figures for one plan. Times in seconds, memory and traffic in bytes.

    ``busy[d]`` is the time device d computes or communicates (their union),
    ``idle[d] = step_time - busy[d]``. ``memory_excess[d]`` is how far a
    device is over its memory (only devices over it). ``bottleneck`` names the
    most loaded device or link. ``objective`` is the problem's objective
    value (lower is better; defaults to ``step_time``).

    Two 1 TFLOP ops on two devices of 100 TFLOP/s at full efficiency (plus
    the default 5 us launch overhead per op), one 1 GB tensor between them over
    a 10 GB/s link (inference, so no backward):

    >>> import placer
    >>> g = placer.Graph("two", [placer.Op("a", flops=1e12, output_bytes=1e9),
    ...                          placer.Op("b", flops=1e12)], [placer.Edge("a", "b", 1e9)],
    ...                  training=False)
    >>> devices = [placer.Device(n, flops=1e14, memory=1e10, efficiency=1.0)
    ...            for n in ("d0", "d1")]
    >>> c = placer.Cluster.from_rules("pair", devices, default=(1e10, 0.0))
    >>> r = placer.simulate(g, c, placer.Plan({"a": ["d0"], "b": ["d1"]}))
    >>> round(r.step_time * 1e3, 3), r.bytes_per_link, r.feasible   # 10 + 100 + 10 ms
    (120.01, {'d0->d1': 1000000000.0}, True)
    >>> round(r.compute["d1"] * 1e3, 3), r.bottleneck
    (10.005, 'link d0->d1 (busy 83% of the step)')
    """

    step_time: float
    feasible: bool = True
    objective: float | None = None
    peak_memory: dict = field(default_factory=dict)
    memory_excess: dict = field(default_factory=dict)
    busy: dict = field(default_factory=dict)
    compute: dict = field(default_factory=dict)
    comm: dict = field(default_factory=dict)
    idle: dict = field(default_factory=dict)
    bytes_per_link: dict = field(default_factory=dict)
    bottleneck: str = ""
    model: str = ""
    microbatches: int | None = None
    schedule: str | None = None
    extra: dict = field(default_factory=dict)
    timeline: Callable[[], Iterable[Event]] | None = field(default=None, repr=False,
                                                            compare=False)

    def __post_init__(self):
        if self.objective is None:
            self.objective = self.step_time

    def __getstate__(self):
        # a lazy timeline is a closure: freeze its events so reports pickle
        state = dict(self.__dict__)
        if state.get("timeline") is not None and not isinstance(state["timeline"], FrozenTimeline):
            state["timeline"] = FrozenTimeline(list(state["timeline"]()))
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)

    # --- text -------------------------------------------------------------
    def to_dict(self) -> dict:
        """Plain JSON-able figures (no timeline)."""
        def clean(value):
            if isinstance(value, float) and not math.isfinite(value):
                return None
            if isinstance(value, dict):
                return {k: clean(v) for k, v in value.items()}
            return value
        data = {"step_time": self.step_time, "feasible": self.feasible,
                "objective": self.objective, "peak_memory": self.peak_memory,
                "memory_excess": self.memory_excess, "busy": self.busy,
                "compute": self.compute, "comm": self.comm, "idle": self.idle,
                "bytes_per_link": self.bytes_per_link, "bottleneck": self.bottleneck,
                "model": self.model, "microbatches": self.microbatches,
                "schedule": self.schedule}
        data.update(self.extra)
        return clean(data)

    def summary(self) -> str:
        """A few lines for people: step time, feasibility, bottleneck, memory."""
        lines = [f"step {format_time(self.step_time)}, "
                 + ("feasible" if self.feasible else "INFEASIBLE")]
        if self.bottleneck:
            lines.append(f"bottleneck: {self.bottleneck}")
        if self.memory_excess:
            worst = max(self.memory_excess, key=self.memory_excess.get)
            lines.append(f"over memory on {len(self.memory_excess)} device(s); worst "
                         f"{worst} by {_bytes(self.memory_excess[worst])}")
        if self.peak_memory:
            top = max(self.peak_memory, key=self.peak_memory.get)
            lines.append(f"peak memory {_bytes(self.peak_memory[top])} on {top}")
        if self.bytes_per_link:
            total = sum(self.bytes_per_link.values())
            lines.append(f"moved {_bytes(total)} over {len(self.bytes_per_link)} link(s)")
        return "\n".join(lines)

    # --- timelines --------------------------------------------------------
    def events(self) -> list[Event]:
        """The timeline's bars (empty when the model produced none)."""
        return list(self.timeline()) if self.timeline is not None else []

    def to_chrome_trace(self, path: PathLike) -> None:
        """Write a Chrome/Perfetto trace (JSON): one process per device and
        per link, one thread per category, times in microseconds."""
        events = self.events()
        if not events:
            events = [Event(d, "busy (estimated)", "compute", 0.0, t)
                      for d, t in self.busy.items() if t > 0]
        lanes: dict[str, int] = {}
        for name in list(self.peak_memory) + [e.lane for e in events]:
            lanes.setdefault(name, len(lanes) + 1)
        cats: dict[str, int] = {}
        out = []
        for lane, pid in lanes.items():
            kind = "link" if "->" in lane else "device"
            out.append({"ph": "M", "name": "process_name", "pid": pid,
                        "args": {"name": f"{kind} {lane}"}})
            out.append({"ph": "M", "name": "process_sort_index", "pid": pid,
                        "args": {"sort_index": pid}})
        for e in events:
            tid = cats.setdefault(e.category, len(cats) + 1)
            out.append({"ph": "X", "name": e.name, "cat": e.category, "pid": lanes[e.lane],
                        "tid": tid, "ts": e.start * 1e6, "dur": e.duration * 1e6,
                        "args": e.args})
        for lane, pid in lanes.items():
            for cat, tid in cats.items():
                out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                            "args": {"name": cat}})
        doc = {"traceEvents": out, "displayTimeUnit": "ms",
               "otherData": {"step_time": self.step_time, "model": self.model,
                             "bottleneck": self.bottleneck}}
        atomic_write_text(path, json.dumps(doc, separators=(",", ":")))

    def plot_gantt(self, path: PathLike, *, title: str | None = None) -> None:
        """Save a Gantt chart (PNG) of the timeline: a row per device and link
        (see :func:`placer.plots.plot_gantt`)."""
        from ..plots import plot_gantt
        plot_gantt(self, path, title=title)


def gap(measured: float, predicted: float, *, factor_from: float = 2.0,
        than: str = "predicted") -> str:
    """How far a prediction is from what was measured, in words a person
    reads at once: a signed percentage while the two are within
    ``factor_from`` of each other, a factor beyond (``"... than " + than``).

    >>> gap(16.54e-3, 14.38e-3)
    '-13%'
    >>> gap(0.28, 8e-5)
    '3,500x slower than predicted'
    >>> gap(0.01, 0.05)
    '5x faster than predicted'
    """
    if not (measured > 0 and predicted > 0):
        return "no prediction" if not predicted else "nothing measured"
    ratio = measured / predicted
    if 1 / factor_from < ratio < factor_from:
        return f"{(predicted - measured) / measured:+.0%}"
    slower = ratio >= 1
    factor = ratio if slower else 1 / ratio
    text = f"{factor:.2g}" if factor < 10 else f"{factor:,.0f}" if factor < 1e6 else f"{factor:.2g}"
    return f"{text}x {'slower' if slower else 'faster'} than {than}"


def spread(times: list[float]) -> str:
    """The run-to-run spread of measured step times, printed beside their
    median: ``"min 15.1, max 18.3 ms over 5 steps"``.

    >>> spread([0.0151, 0.0165, 0.0183])
    'min 15.1, max 18.3 ms over 3 steps'
    >>> spread([0.2])
    'one step'
    """
    if len(times) < 2:
        return "one step" if times else "no steps"
    low, high = min(times), max(times)
    unit, scale = ("s", 1.0) if high >= 1 else ("ms", 1e3) if high >= 1e-3 else ("us", 1e6)
    return f"min {low * scale:.3g}, max {high * scale:.3g} {unit} over {len(times)} steps"


class FrozenTimeline:
    """A timeline already built: calling it returns its events."""

    def __init__(self, events: list):
        self.events = events

    def __call__(self) -> list:
        return self.events


def format_time(seconds: float) -> str:
    """``seconds`` in s, ms or us, three significant digits."""
    if not math.isfinite(seconds):
        return str(seconds)
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"


def _bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} TB"

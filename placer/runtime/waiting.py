"""How a rank waits for its messages: blocking, or busy-polling a core it owns.

Two problems of CPU ranks, both measured on this project's 2-core virtual
machine (see BENCHMARKS.md, runtime):

- gloo's point-to-point ``Work`` objects never report ``is_completed()``
  before ``wait()`` returns, so a rank cannot ask whether a message has
  arrived. :class:`Watcher` lends each posted receive a daemon thread that
  blocks in ``wait()`` (which releases the GIL) and sets a flag; the rank
  can poll the flag (:meth:`Handle.done`) instead of blocking (it runs its
  tasks in the schedule's fixed order, :mod:`placer.schedule`).
- A rank that blocks lets its virtual CPU halt, and waking a halted vCPU
  takes the hypervisor from tens of microseconds to a scheduler tick (4 ms
  here): the median 1.3 MB all-reduce between two ranks took 2.9-3.5 ms
  blocking and 0.56 ms busy-polling with :class:`KeepAwake`. A busy-polling
  rank (``spin``) polls its collectives (handing its core to its own
  communication threads at every poll) and :class:`KeepAwake` keeps the
  rank's cores busy with an idle-priority process whenever the rank itself
  is not running, so they never halt. Both only make sense on cores the
  rank owns (pinned ranks): on shared cores they would take time from other
  work. Point-to-point receives are always waited for by blocking (see
  :meth:`Handle.wait`).
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading

__all__ = ["Handle", "Watcher", "wait_work", "handover", "KeepAwake", "busy_poll_default",
           "quick_handover", "demote_threads", "TRANSPORT_THREADS"]

#: name prefixes of the transport's socket threads (gloo's TCP event loop)
TRANSPORT_THREADS = ("gloo_tcp_loop",)


class Handle:
    """A posted receive being watched; :meth:`done` says whether it arrived."""

    __slots__ = ("work", "event", "error")

    def __init__(self, work):
        self.work = work
        self.event = threading.Event()
        self.error: BaseException | None = None

    def done(self) -> bool:
        return self.event.is_set()

    def wait(self) -> None:
        """Until the message is here (re-raises the transport's error).
        Blocks rather than polls: the watching thread needs the GIL to say
        the message arrived, which a polling thread holds (measured: no
        faster than blocking on cores kept awake, see :class:`KeepAwake`)."""
        self.event.wait()
        if self.error is not None:
            raise self.error


class Watcher:
    """Daemon threads that block in ``Work.wait()`` for the rank (see the
    module doc). Threads are started as needed (one per receive in flight)
    and reused from step to step; daemons, so a receive that never completes
    (a dead peer) does not keep the process alive."""

    def __init__(self):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._started: list[threading.Thread] = []
        self._busy = 0
        self._arrived = threading.Condition()

    def watch(self, work) -> Handle:
        handle = Handle(work)
        with self._lock:
            self._busy += 1
            start = self._busy > self._threads
            if start:
                self._threads += 1
        if start:
            thread = threading.Thread(target=self._run, name="placer-recv-watch", daemon=True)
            with self._lock:
                self._started.append(thread)
            thread.start()
        self._queue.put(handle)
        return handle

    def close(self) -> None:
        """End the threads once the receives handed to them are done (a
        transport lives for one plan's run: threads left behind by every
        plan a process ran made its later steps slower; see
        :meth:`placer.runtime.transport.DistTransport.close`)."""
        with self._lock:
            threads, self._started = self._started, []
            self._threads = 0
        for _ in threads:
            self._queue.put(None)
        # gone before the caller goes on: a thread still leaving at the
        # interpreter's exit made the process abort
        for thread in threads:
            thread.join(timeout=1.0)

    def _run(self) -> None:
        while True:
            handle = self._queue.get()
            if handle is None:
                return
            try:
                handle.work.wait()
            except BaseException as exc:   # re-raised by the rank in Handle.wait
                handle.error = exc
            with self._lock:
                self._busy -= 1
            handle.event.set()
            with self._arrived:
                self._arrived.notify_all()

    def wait_any(self, handles: list[Handle]) -> None:
        """Until one of ``handles`` is done (blocking, see :meth:`Handle.wait`)."""
        with self._arrived:
            while not any(h.event.is_set() for h in handles):
                self._arrived.wait(0.05)


def wait_work(work, spin: bool) -> None:
    """Wait for an asynchronous collective's ``work`` (its ``is_completed``
    works, unlike point-to-point ones, and needs no Python thread), polling
    when ``spin``."""
    if spin:
        while not work.is_completed():
            handover()
    work.wait()


def handover() -> None:
    """Let this core's other threads (gloo's) run now: ``sched_yield``.
    Measured against a 10 us sleep, polling a 1.3 MB all-reduce between two
    pinned ranks next to :class:`KeepAwake` spinners: median 0.60-0.72 ms
    and 90th percentile 2.1-3.3 ms yielding, 0.69-0.98 and 5.9-6.4 ms
    sleeping (blocking: 0.74, 5.8-5.9). The :class:`KeepAwake` spinner
    yields in turn, so a rank's yield does not lose its core for a tick."""
    os.sched_yield()


_SPIN = """
import os, sys
parent = int(sys.argv[1])
os.sched_setaffinity(0, [int(c) for c in sys.argv[2].split(",")])
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
while os.getppid() == parent:
    os.sched_yield()
"""


class KeepAwake:
    """Context manager: one idle-priority (``SCHED_IDLE``) process per core
    of ``cores`` that spins while nothing else runs there, so the core never
    halts and a wake-up of the rank is a context switch, not a trip through
    the hypervisor. The process yields to any normal thread at once and ends
    with its parent (also when the parent is killed). It spins on
    ``sched_yield``: a rank that yields (polling) may be handed the core's
    spinner, and a spinner that merely loops kept the core until the next
    tick (measured: 26 of 20,000 yields took 3-4 ms; a yielding spinner,
    none over 42 us). A no-op where the OS
    has no ``SCHED_IDLE`` or affinity."""

    def __init__(self, cores):
        self.cores = list(cores or [])
        self.procs: list[subprocess.Popen] = []

    def __enter__(self):
        if not (hasattr(os, "SCHED_IDLE") and hasattr(os, "sched_setaffinity")):
            return self
        for core in self.cores:
            self.procs.append(subprocess.Popen(
                [sys.executable, "-c", _SPIN, str(os.getpid()), str(core)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL))
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()
        self.procs.clear()
        return False


def busy_poll_default(pinned: bool, device_type: str, backend: str) -> bool:
    """Whether a rank busy-polls by default: a CPU rank over gloo that has
    cores of its own (GPU ranks wait on the device; ranks sharing cores must
    not spin on each other's time)."""
    return bool(pinned) and device_type == "cpu" and backend == "gloo"


class quick_handover:
    """Context manager: a short GIL switch interval (``seconds``), restored
    on exit. A :class:`Watcher` thread whose message arrived while the rank
    computes waits for the GIL; by default the rank hands it over only every
    5 ms, so the rank would see the message late when it next looks."""

    def __init__(self, seconds: float = 0.0005):
        self.seconds = seconds
        self.old: float | None = None

    def __enter__(self):
        self.old = sys.getswitchinterval()
        sys.setswitchinterval(min(self.old, self.seconds))
        return self

    def __exit__(self, *exc):
        sys.setswitchinterval(self.old)
        return False


def demote_threads(prefixes=TRANSPORT_THREADS, policy: str | None = None) -> list[int]:
    """Give this process's threads whose names start with ``prefixes`` the
    idle scheduling policy (``SCHED_IDLE``: they run only while the rank's
    own threads wait); returns their thread ids.

    Why: gloo's event-loop thread handles a socket's events only if it gets
    the pair's lock at once (``try_lock``); otherwise it returns to
    ``epoll_wait``, which reports the same unread data again at once. When
    data arrives while the rank is inside a send or a receive call (holding
    that lock), the woken loop thread preempts the rank on its one pinned
    core and spins until the scheduler's slice ends: measured on this
    project's 2-core VM with ``perf sched`` traces, posting one receive took
    1.5-5.4 ms instead of 30 us, in most steps. The price: a message is
    read (and a peer's receive notice seen) only when the rank next waits,
    so the send-to-arrival median rose from 0.2-0.3 to 0.3-1.0 ms; steps
    were still faster (median step lower in 10 of 14 interleaved pairs).
    Only for ranks that own their cores (pinned): on cores shared with
    other busy work an idle thread would barely run. ``policy`` ("idle",
    "batch": no wake-up preemption, "normal": leave them) defaults to the
    ``PLACER_TRANSPORT_THREADS`` environment variable, else "idle"."""
    policy = policy or os.environ.get("PLACER_TRANSPORT_THREADS", "idle")
    kinds = {"idle": getattr(os, "SCHED_IDLE", None), "batch": getattr(os, "SCHED_BATCH", None),
             "normal": None}
    if policy not in kinds:
        raise ValueError(f"PLACER_TRANSPORT_THREADS={policy!r}: use one of {sorted(kinds)}")
    kind = kinds[policy]
    if kind is None or not os.path.isdir("/proc/self/task"):
        return []
    done = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            if name.startswith(tuple(prefixes)):
                os.sched_setscheduler(int(tid), kind, os.sched_param(0))
                done.append(int(tid))
        except (OSError, ValueError):   # a thread that ended meanwhile
            continue
    return done

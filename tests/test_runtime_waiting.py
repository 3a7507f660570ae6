"""How ranks wait: watched receives, busy-poll helpers, the task overhead."""

import os
import threading
import time

import pytest
import torch

from placer.runtime.waiting import (KeepAwake, Watcher, busy_poll_default, demote_threads,
                                    quick_handover)


class FakeWork:
    """A point-to-point Work whose wait() blocks until released."""

    def __init__(self, error=None):
        self.released = threading.Event()
        self.error = error

    def wait(self):
        self.released.wait()
        if self.error is not None:
            raise self.error
        return True

    def is_completed(self):      # like gloo's p2p works: never before wait()
        return False


def test_watched_receive_reports_arrival_without_waiting_in_the_caller():
    watcher = Watcher()
    works = [FakeWork() for _ in range(3)]
    handles = [watcher.watch(w) for w in works]
    assert not any(h.done() for h in handles)
    works[1].released.set()
    watcher.wait_any([handles[0], handles[1]])
    assert handles[1].done() and not handles[0].done() and not handles[2].done()
    for w in works:
        w.released.set()
    for h in handles:
        h.wait()
    assert all(h.done() for h in handles)


def test_watched_receive_reraises_the_transport_error():
    watcher = Watcher()
    work = FakeWork(error=RuntimeError("peer gone"))
    handle = watcher.watch(work)
    work.released.set()
    with pytest.raises(RuntimeError, match="peer gone"):
        handle.wait()


def test_watcher_threads_are_reused_across_steps():
    watcher = Watcher()
    for _ in range(3):
        works = [FakeWork() for _ in range(4)]
        handles = [watcher.watch(w) for w in works]
        for w in works:
            w.released.set()
        for h in handles:
            h.wait()      # a watching thread counts itself free before it signals
    assert watcher._threads <= 4


def test_busy_poll_only_for_pinned_cpu_ranks_over_gloo():
    assert busy_poll_default(True, "cpu", "gloo")
    assert not busy_poll_default(False, "cpu", "gloo")
    assert not busy_poll_default(True, "cuda", "nccl")


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="needs SCHED_IDLE")
def test_keep_awake_runs_idle_priority_spinners_and_stops_them():
    cores = sorted(os.sched_getaffinity(0))[:1]
    with KeepAwake(cores) as awake:
        assert len(awake.procs) == 1
        proc = awake.procs[0]
        time.sleep(0.3)
        assert proc.poll() is None
        assert os.sched_getscheduler(proc.pid) == os.SCHED_IDLE
        assert os.sched_getaffinity(proc.pid) == set(cores)
    assert proc.poll() is not None


@pytest.mark.skipif(not (hasattr(os, "SCHED_IDLE") and os.path.isdir("/proc/self/task")),
                    reason="needs Linux scheduling policies")
def test_demote_threads_gives_named_threads_the_idle_policy_only():
    started, stop = threading.Event(), threading.Event()
    tids = {}

    def run(name):
        tids[name] = threading.get_native_id()
        with open(f"/proc/self/task/{tids[name]}/comm", "w") as f:   # the OS thread name
            f.write(name)
        started.set()
        stop.wait(10)

    threads = []
    for name in ("test_loop_a", "other_thread"):
        started.clear()
        threads.append(threading.Thread(target=run, args=(name,), daemon=True))
        threads[-1].start()
        assert started.wait(5)
    try:
        assert demote_threads(("test_loop",), policy="normal") == []
        assert os.sched_getscheduler(tids["test_loop_a"]) == os.SCHED_OTHER
        assert demote_threads(("test_loop",), policy="idle") == [tids["test_loop_a"]]
        assert os.sched_getscheduler(tids["test_loop_a"]) == os.SCHED_IDLE
        assert os.sched_getscheduler(tids["other_thread"]) == os.SCHED_OTHER
        assert os.sched_getscheduler(threading.get_native_id()) == os.SCHED_OTHER
        with pytest.raises(ValueError, match="PLACER_TRANSPORT_THREADS"):
            demote_threads(("test_loop",), policy="fast")
    finally:
        stop.set()
        for t in threads:
            t.join()


def test_quick_handover_restores_the_switch_interval():
    import sys
    before = sys.getswitchinterval()
    with quick_handover(0.0001):
        assert sys.getswitchinterval() == pytest.approx(min(before, 0.0001))
    assert sys.getswitchinterval() == before


def test_task_overhead_is_measured_positive_and_small():
    from placer.runtime.profile import task_overhead
    seconds = task_overhead(torch.device("cpu"), repeats=5)
    assert 0.0 < seconds < 0.01


def test_collective_efficiency_from_measured_allreduce():
    from placer.runtime.profile import ALLREDUCE_SIZES, collective_efficiency
    bw, lat = 1e9, 1e-4
    # an all-reduce taking twice the ring's time on these links: efficiency 0.5
    ring = {n: 2 * lat + n / bw for n in ALLREDUCE_SIZES}
    assert collective_efficiency({n: 2 * t for n, t in ring.items()}, bw, lat, 2) == \
        pytest.approx(0.5)
    # faster than the ring model (its latency overstates a collective's): above 1
    assert collective_efficiency({n: t / 2 for n, t in ring.items()}, bw, lat, 2,
                                 sizes=ALLREDUCE_SIZES) == pytest.approx(2.0)
    # the geometric mean over the sizes: 0.5 at one, 2 at the other -> 1
    a, b = ALLREDUCE_SIZES
    assert collective_efficiency({a: 2 * ring[a], b: ring[b] / 2}, bw, lat, 2) == \
        pytest.approx(1.0)
    # small sizes (latency alone) are left out by default
    assert collective_efficiency({**ring, 256: 1.0}, bw, lat, 2) == pytest.approx(1.0)
    # one rank, or no link: nothing to scale
    assert collective_efficiency(ring, float("inf"), 0.0, 1) == 1.0


def test_allreduce_sizes_follow_the_model():
    from placer.runtime.profile import allreduce_sizes
    assert allreduce_sizes(8 << 20) == (2 << 20, 8 << 20)
    assert allreduce_sizes(1000) == (64 << 10, 64 << 10)      # at least 64 KB
    assert allreduce_sizes(1e12) == (64 << 20, 64 << 20)      # at most 64 MB

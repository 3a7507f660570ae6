"""A transport's receive watchers end with it
(:meth:`placer.runtime.waiting.Watcher.close`): a process running plan
after plan kept every plan's threads before."""

from __future__ import annotations

import threading

from placer.runtime.waiting import Watcher


class _Work:
    """A posted receive: ``wait`` returns once ``arrive`` was called."""

    def __init__(self):
        self._arrived = threading.Event()

    def arrive(self):
        self._arrived.set()

    def wait(self):
        self._arrived.wait(5)


def _watchers() -> int:
    return sum(t.name == "placer-recv-watch" for t in threading.enumerate())


def test_close_ends_every_watcher_thread():
    before = _watchers()
    for _plan in range(3):
        watcher = Watcher()
        works = [_Work() for _ in range(4)]
        handles = [watcher.watch(w) for w in works]     # four in flight: four threads
        assert _watchers() == before + 4
        for w in works:
            w.arrive()
        for h in handles:
            h.wait()
            assert h.done()
        watcher.close()
        assert _watchers() == before


def test_threads_are_reused_until_closed():
    start = _watchers()
    watcher = Watcher()
    for _step in range(5):
        work = _Work()
        handle = watcher.watch(work)
        work.arrive()
        handle.wait()
    assert _watchers() <= start + 1
    watcher.close()
    assert _watchers() == start

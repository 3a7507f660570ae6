"""A rank's stage (``build``, ``step 2``, ``step 2: waiting for rank 0``...)
where its launcher, or its own watchdog under torchrun, can read it: one
:class:`Status` per process (:data:`STATUS`), written by the rank loop and
the transport at every blocking call, polled by
:func:`placer.runtime.launch.launch`."""

from __future__ import annotations

import json
import os
import time


class Status:
    """This rank's stage in a small file the launcher polls (one fixed-size
    record rewritten in place: cheap enough for every blocking call)."""

    SIZE = 512

    def __init__(self, path: str | None, rank: int):
        self.fd = None
        self.reopen(path, rank)

    def reopen(self, path: str | None, rank: int) -> None:
        """Record ``rank``'s stages in ``path`` from now on (None: in memory
        only), in place: every module holds this one object."""
        if self.fd is not None:
            os.close(self.fd)
        self.rank = rank
        self.stage = "start"
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600) if path else None
        self.count = 0

    def set(self, stage: str, state: str = "running", error: str = "") -> None:
        self.stage = stage
        self.count += 1
        if self.fd is None:
            return
        record = json.dumps({"rank": self.rank, "stage": stage, "state": state,
                             "count": self.count, "time": time.time(),
                             "error": error[:200]})
        data = record.encode()[:self.SIZE - 1].ljust(self.SIZE - 1) + b"\n"
        os.pwrite(self.fd, data, 0)

    def wait(self, peer: int | None, what: str = ""):
        """Context manager: mark this rank as waiting for ``peer`` (None: a
        collective) during a blocking call."""
        status = self

        class _Waiting:
            def __enter__(self_inner):
                status._outer = status.stage
                status.set(f"{status.stage}: waiting for "
                           + (f"rank {peer}" if peer is not None else (what or "a collective")))

            def __exit__(self_inner, exc_type, *exc):
                if exc_type is None:      # a failed wait keeps its stage for the error
                    status.set(status._outer)
        return _Waiting()


#: this process's stage; a launched rank or a torchrun rank reopens it
#: (:meth:`Status.reopen`) before it starts
STATUS = Status(None, 0)


def read_status(path: str) -> dict | None:
    """The record a rank last wrote to ``path`` (None: none yet or unreadable)."""
    try:
        with open(path, "rb") as f:
            return json.loads(f.read().decode().strip() or "null")
    except (OSError, ValueError):
        return None


def inject_fault(rank: int, step: int) -> None:
    """Test hook: ``PLACER_TEST_FAULT="RANK:STEP:exit"`` makes that rank
    ``os._exit(3)`` at the start of that step; ``...:hang`` makes it sleep."""
    spec = os.environ.get("PLACER_TEST_FAULT")
    if not spec:
        return
    r, st, kind = spec.split(":")
    if int(r) == rank and int(st) == step:
        if kind == "exit":
            os._exit(3)
        time.sleep(10 ** 6)


#: the stages of a rank still meeting the others at the first step
START_UP = ("step 0", "step 0: waiting for the step barrier")


def past_start_up(status: dict | None) -> bool:
    """Whether a rank's status shows it stepping (not building, calibrating
    or meeting the others at the first step barrier)."""
    stage = (status or {}).get("stage", "")
    return stage.startswith("step ") and stage not in START_UP and "calibrat" not in stage

"""Process faults with no hook in the service, shared by the game days (chaos/actions.py) and the
fault tests (tests/integration/faults.py): one thread of a process stopped while the others run.

A worker's consumer loop runs on its main thread and its ops server (/healthz, /metrics) on
another: stopping only the main thread is a hung call as the loop would see it (a stuck store
call, a compaction stall), seen from outside. ptrace(2) stops that one thread (SEIZE +
INTERRUPT, no group stop) and DETACH lets it go; a tracer that exits detaches too, so a game
day that dies leaves nothing hung. Only the thread that seized a process may detach it: the
game day's actions run one after another on one thread.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# ptrace(2) requests (linux/ptrace.h)
_PTRACE_DETACH, _PTRACE_SEIZE, _PTRACE_INTERRUPT = 17, 0x4206, 0x4207
_WALL = 0x40000000


def _ptrace(request: int, tid: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    libc.ptrace.restype = ctypes.c_long
    if libc.ptrace(request, tid, None, None) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"ptrace({request:#x}, {tid}): {os.strerror(errno)}")


def stop_main_thread(pid: int, answers: Callable[[], bool], attempts: int = 5) -> None:
    """Stop the process's main thread, leaving its other threads running. Python's GIL: a
    thread stopped while holding it would stall the others, so the stop is retried until
    `answers()` (the ops server) still answers with it in force."""
    for _ in range(attempts):
        _ptrace(_PTRACE_SEIZE, pid)
        _ptrace(_PTRACE_INTERRUPT, pid)
        os.waitpid(pid, _WALL)  # stopped
        if answers():
            return
        _ptrace(_PTRACE_DETACH, pid)  # stopped while holding the GIL: again
        time.sleep(0.3)
    raise RuntimeError(f"pid {pid}: no stop of its main thread left its other threads running")


def resume_main_thread(pid: int) -> None:
    """Let a thread `stop_main_thread` stopped go (from the thread that stopped it)."""
    _ptrace(_PTRACE_DETACH, pid)


@contextmanager
def hung_main_thread(pid: int, answers: Callable[[], bool], attempts: int = 5) -> Iterator[None]:
    """`stop_main_thread` for the block's duration."""
    stop_main_thread(pid, answers, attempts)
    try:
        yield
    finally:
        resume_main_thread(pid)

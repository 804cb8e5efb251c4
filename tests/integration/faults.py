"""Small pieces the fault tests share (the alert tests, the consumer-lag tests)."""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
from confluent_kafka import Producer
from confluent_kafka.serialization import MessageField, SerializationContext

from chaos import kafka_faults
from services.contracts import clients, events, keys
from tests.conftest import Stack


def produce_like(stack: Stack) -> int:
    """One like event of a new post on likes.committed, as the write path publishes it;
    returns its partition. A stopped aggregator's lag then grows with the clock."""
    settings = stack.settings()
    ser = clients.like_serializer(clients.schema_registry(settings))
    post = f"post-{uuid.uuid4()}"
    e = events.LikeEvent.new(intent_uuid=str(uuid.uuid4()), user_id=f"u-{uuid.uuid4().hex[:6]}",
                             post_id=post, action="like", reaction="like", delta=1,
                             region=settings.region, shard=0)  # fmt: skip
    value = ser(e, SerializationContext(events.COMMITTED, MessageField.VALUE))
    partition: list[int] = []
    p = Producer(stack.kafka_config())
    p.produce(events.COMMITTED, key=keys.kafka_key(post, 0).encode(), value=value,
              on_delivery=lambda _err, m: partition.append(m.partition()))  # fmt: skip
    assert p.flush(30) == 0 and len(partition) == 1
    return partition[0]


def produce_poison(stack: Stack, n: int = 1) -> None:
    """`n` messages on likes.committed that no consumer can decode (chaos/kafka_faults.py)."""
    kafka_faults.produce_poison(stack.kafka_config(), n)


@contextmanager
def records_refused(stack: Stack, *topics: str) -> Iterator[None]:
    """The brokers refuse every record written to `topics` until the block ends
    (chaos/kafka_faults.py)."""
    with kafka_faults.records_refused(stack.kafka_config(), *topics):
        yield


def set_sink_outage(stack: Stack, receiver: str, status: int | None) -> None:
    """The local stand-in of an external endpoint (local/webhook_sink.py) answers `status` to
    every call for `receiver` from now on; None ends the outage."""
    url = f"http://{stack.host}:{stack.layout.ports.webhook_sink}/-/outage/{receiver}"
    if status is None:
        httpx.delete(url, timeout=5).raise_for_status()
    else:
        httpx.put(url, json={"status": status}, timeout=5).raise_for_status()


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


@contextmanager
def hung_main_thread(pid: int, answers: Callable[[], bool], attempts: int = 5) -> Iterator[None]:
    """The process's main thread (a worker's loop) stops, its other threads (the ops server:
    /healthz, /metrics) go on: a hung call as the loop would see it, from outside, with no
    hook in the service. ptrace stops that one thread (SEIZE + INTERRUPT, no group stop) and
    DETACH lets it go; a tracer that dies detaches too. Python's GIL: a thread stopped while
    holding it would stall the others, so the stop is retried until `answers()` (the ops
    server) still answers with it in force."""
    for _ in range(attempts):
        _ptrace(_PTRACE_SEIZE, pid)
        _ptrace(_PTRACE_INTERRUPT, pid)
        os.waitpid(pid, _WALL)  # stopped
        if answers():
            break
        _ptrace(_PTRACE_DETACH, pid)  # stopped while holding the GIL: again
        time.sleep(0.3)
    else:
        raise AssertionError(
            f"pid {pid}: no stop of its main thread left its other threads running"
        )
    try:
        yield
    finally:
        _ptrace(_PTRACE_DETACH, pid)


@contextmanager
def stop_the_world_pauses(pid: int, pause_s: float = 0.3, run_s: float = 0.1) -> Iterator[None]:
    """The process stops for `pause_s` out of every `pause_s + run_s` (SIGSTOP, SIGCONT): long
    stop-the-world garbage-collection pauses of a JVM, as the seed's "Cassandra slow" has them.
    Calls still complete, within their timeouts, but late; no breaker opens on them."""
    done = threading.Event()

    def cycle() -> None:
        while not done.is_set():
            os.kill(pid, signal.SIGSTOP)
            done.wait(pause_s)
            os.kill(pid, signal.SIGCONT)
            done.wait(run_s)

    t = threading.Thread(target=cycle, daemon=True)
    t.start()
    try:
        yield
    finally:
        done.set()
        t.join(timeout=10)
        os.kill(pid, signal.SIGCONT)

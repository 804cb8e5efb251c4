"""A shutdown never waits on etcd for more than its bound (services/contracts/etcd.stop_poller):
a write service's shutdown once hung forever on its etcd poller's close."""

from __future__ import annotations

import asyncio

from services.contracts import etcd


def test_a_stuck_poll_and_a_stuck_close_are_left_after_the_bound() -> None:
    async def go() -> tuple[bool, bool, bool]:
        stuck = asyncio.Event()
        closing = asyncio.Event()

        async def poll() -> None:  # a call that swallows its cancellation
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                await stuck.wait()

        class Client:  # a channel whose close does not return
            async def close(self) -> None:
                closing.set()
                await stuck.wait()

        task = asyncio.create_task(poll())
        await asyncio.sleep(0)  # the poll is running
        await etcd.stop_poller(task, Client(), wait_s=0.1)  # type: ignore[arg-type]
        returned_while_stuck = not task.done()
        stuck.set()  # let both end, so the loop can close
        await asyncio.sleep(0.05)
        return returned_while_stuck, closing.is_set(), task.done()

    assert asyncio.run(go()) == (True, True, True)


def test_a_poll_that_ends_is_awaited_and_its_client_closed() -> None:
    class Client:
        closed = False

        async def close(self) -> None:
            self.closed = True

    async def go() -> tuple[bool, bool]:
        task = asyncio.create_task(asyncio.sleep(3600))
        await asyncio.sleep(0)
        client = Client()
        await etcd.stop_poller(task, client)  # type: ignore[arg-type]
        return task.cancelled(), client.closed

    assert asyncio.run(go()) == (True, True)

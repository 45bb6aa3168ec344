"""`TaskHost`: the owner of a service's task group, in a task of its own.

Why not enter the task group in `Memory.__aenter__`, the usual place: an anyio task group
must be exited by the task that entered it, and pytest-asyncio runs an async fixture's setup
and teardown in two different tasks (so would any framework that opens a resource in one task
and closes it in another). A `Memory` opened in a fixture would then fail to close. The host
task enters the group, and whichever task calls `stop` merely asks it to leave.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import anyio

Service = Callable[..., Coroutine[Any, Any, None]]


class TaskHost:
    """Runs `service(task_status=...)` in a task group hosted by a dedicated asyncio task."""

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None
        self._stop = anyio.Event()

    async def start(self, service: Service) -> None:
        """Returns once `service` reported it started.

        Raises:
            Exception: whatever `service` raised before it started.
        """
        started: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def host() -> None:
            try:
                async with anyio.create_task_group() as tg:
                    await tg.start(service)
                    started.set_result(None)
                    await self._stop.wait()
                    tg.cancel_scope.cancel()
            except BaseException as exc:
                if not started.done():
                    started.set_exception(exc)
                    return
                raise

        self._task = asyncio.get_running_loop().create_task(host(), name="mnemo-host")
        await started

    async def stop(self) -> None:
        """Cancels everything the service started and waits until it is gone."""
        task, self._task = self._task, None
        if task is None:
            return
        self._stop.set()
        with anyio.CancelScope(shield=True):
            await asyncio.wait({task})
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]



"""Drive deferrable operators and sensors the way a worker and a triggerer do, without a scheduler.

``execute()`` raises ``TaskDeferred``; the trigger's ``run()`` goes on an asyncio loop until its
first event; the event goes to ``execute_complete()`` with the deferral's kwargs.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_provider_tao_slurm.hooks.slurm import SlurmHook, async_pool
from airflow_provider_tao_slurm.lifecycle.events import JobEvent

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.triggers.base import TriggerEvent

    from airflow_provider_tao_slurm.triggers.slurm_job import SlurmJobTrigger

T = TypeVar("T")


def wait_until(probe: Callable[[], T | None], what: str, timeout: float = 60, every: float = 0.5) -> T:
    """Call ``probe`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not seen within {timeout:.0f} s")
        time.sleep(every)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on a fresh loop (as the triggerer would), closing the pooled SSH connection after."""

    async def main() -> T:
        try:
            return await coro
        finally:
            await async_pool().close_all()

    return asyncio.run(main())


async def first_event(trigger: SlurmJobTrigger, timeout: float = 120) -> TriggerEvent:
    """The trigger's first event; the generator is then closed like the triggerer does after ``return``."""
    events = trigger.run()
    try:
        async with asyncio.timeout(timeout):
            return await anext(events)
    finally:
        await events.aclose()


def full_event(trigger: SlurmJobTrigger, event: TriggerEvent) -> dict[str, Any]:
    """The whole of ``trigger``'s event: the file its compact event names, read over SSH (an inline one as it is)."""
    payload = dict(event.payload)
    if JobEvent.reference(payload) is None:
        return payload
    assert trigger.event_path is not None, f"a compact event {payload} from a trigger without an event_path"
    text = SlurmHook(trigger.slurm_conn_id).read_file(trigger.event_path)
    assert text is not None, f"the event file {trigger.event_path} is missing"
    return dict(json.loads(text))


def context(dag_id: str, task_id: str, run_id: str, try_number: int = 1) -> dict[str, Any]:
    """The slice of an Airflow context the operators read (``ti.xcom`` keeps what they push)."""
    xcom: dict[str, Any] = {}
    ti = SimpleNamespace(
        dag_id=dag_id,
        task_id=task_id,
        run_id=run_id,
        map_index=-1,
        try_number=try_number,
        stats_tags={},
        xcom=xcom,
        xcom_push=lambda key, value: xcom.__setitem__(key, value),
    )
    return {"ti": ti}


def defer(sensor: BaseOperator, ctx: dict[str, Any]) -> TaskDeferred:
    """``sensor.execute()``, which must defer."""
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(ctx)
    return deferred.value


def resume(sensor: BaseOperator, ctx: dict[str, Any], deferred: TaskDeferred, event: TriggerEvent) -> Any:
    """The worker's resume: ``execute_complete(context, event=payload, **kwargs)``."""
    assert deferred.method_name == "execute_complete"
    return sensor.execute_complete(ctx, event=event.payload, **(deferred.kwargs or {}))


def run_deferrable(op: BaseOperator, ctx: dict[str, Any], timeout: float = 180) -> Any:
    """execute → (trigger until its event → execute_complete)*, as often as the operator defers."""
    try:
        return op.execute(ctx)
    except TaskDeferred as first:
        deferred = first
    while True:
        event = run_async(first_event(deferred.trigger, timeout))
        try:
            return resume(op, ctx, deferred, event)
        except TaskDeferred as again:
            deferred = again

"""The poller benchmark's per-job scheduler baseline (``benchmarks/_perjob_trigger.py``): one query per job per poll."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from examples import load_file

from airflow_provider_tao_slurm.core.states import JobState, state_from_native
from airflow_provider_tao_slurm.exceptions import StatusQueryError
from airflow_provider_tao_slurm.hooks.slurm import SlurmHook

perjob = load_file("_perjob_trigger", Path(__file__).resolve().parents[2] / "benchmarks" / "_perjob_trigger.py")


class Answers:
    """``a_get_states`` answering from a script: one entry per call (a native state, or an exception)."""

    def __init__(self, script: list[str | Exception]) -> None:
        self.script = script
        self.calls: list[list[str]] = []

    async def __call__(self, hook: SlurmHook, job_ids: Iterable[str], **kwargs: Any) -> dict[str, JobState]:
        ids = list(job_ids)
        self.calls.append(ids)
        step = self.script[min(len(self.calls), len(self.script)) - 1]
        if isinstance(step, Exception):
            raise step
        return {job_id: state_from_native(job_id, step, source="squeue") for job_id in ids}


def install(monkeypatch: pytest.MonkeyPatch, answers: Answers) -> None:
    """Answer every hook's ``a_get_states`` from ``answers``."""

    async def a_get_states(hook: SlurmHook, job_ids: Iterable[str], **kwargs: Any) -> dict[str, JobState]:
        return await answers(hook, job_ids, **kwargs)

    monkeypatch.setattr(SlurmHook, "a_get_states", a_get_states)


async def events_of(trigger: Any) -> list[dict[str, Any]]:
    return [event.payload async for event in trigger.run()]


@pytest.fixture(autouse=True)
def fresh_stats() -> None:
    perjob.STATS.update(failures=0, gave_up=0)


def test_one_query_per_poll_about_its_own_job_until_a_terminal_state(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = Answers(["PENDING", "RUNNING", "CANCELLED"])
    install(monkeypatch, answers)
    trigger = perjob.PerJobSqueueTrigger("bench_slurm", "4242", 0.0)
    assert asyncio.run(events_of(trigger)) == [{"status": "terminal", "slurm_job_id": "4242", "state": "CANCELLED"}]
    assert answers.calls == [["4242"]] * 3


def test_a_failed_poll_is_asked_again_and_too_many_in_a_row_give_up(monkeypatch: pytest.MonkeyPatch) -> None:
    lost = StatusQueryError("1 of 1 job(s) unanswered", {}, ["4242"])
    answers = Answers([lost, "PENDING", *[lost] * 6])
    install(monkeypatch, answers)
    (event,) = asyncio.run(events_of(perjob.PerJobSqueueTrigger("bench_slurm", "4242", 0.0)))
    assert (event["status"], event["slurm_job_id"]) == ("error", "4242")
    assert "StatusQueryError" in event["message"]
    assert len(answers.calls) == 2 + perjob.MAX_FAILURES + 1
    assert perjob.STATS == {"failures": 1 + perjob.MAX_FAILURES + 1, "gave_up": 1}


def test_it_is_rebuilt_from_its_serialization_as_the_triggerer_does() -> None:
    classpath, kwargs = perjob.PerJobSqueueTrigger("bench_slurm", "7", 10.0).serialize()
    module, _, name = classpath.rpartition(".")
    rebuilt = getattr(importlib.import_module(module), name)(**kwargs)
    assert (rebuilt.slurm_conn_id, rebuilt.slurm_job_id, rebuilt.poll_interval) == ("bench_slurm", "7", 10.0)

"""The hook fakes cannot drift: each method they define has :class:`SlurmHook`'s signature.

The shared :class:`~fakes.FakeSlurmHook` and every class a unit-test module builds on it (or on
``SlurmHook`` itself) are checked with :mod:`inspect`: parameter names, kinds, defaults and order, and
whether the method is async. A fake whose ``submit`` lacked ``extra_args``, or whose ``a_run`` took
``**_`` instead of ``check`` and ``what``, fails here naming the method and the difference. The last
tests check that the shared fake answers reads, commands, submissions and log tails as the hook does.
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest
from examples import load_file
from fakes import FakeSlurmHook, Submission

from airflow_provider_tao_slurm.core.config import ClusterSettings
from airflow_provider_tao_slurm.core.logstream import TailChunk, TailRequest
from airflow_provider_tao_slurm.exceptions import RemoteCommandError, RemoteReadError, SubmissionError
from airflow_provider_tao_slurm.hooks.replies import CommandResult
from airflow_provider_tao_slurm.hooks.slurm import DEFAULT_SACCT_WINDOW, SlurmHook

if TYPE_CHECKING:
    from airflow_provider_tao_slurm.core.states import JobState

UNIT = Path(__file__).parent


def drift(fake: type, hook: type = SlurmHook) -> list[str]:
    """Every way the methods ``fake`` defines differ from ``hook``'s, one line each; empty when none do.

    A public method must be one of ``hook``'s, with the same parameters (names, kinds, defaults, in
    order) and the same async-ness. A private method is checked only when ``hook`` has one of that name
    (an override of the transport); other private methods are the fake's own helpers.
    """
    problems: list[str] = []
    for name, member in vars(fake).items():
        if not inspect.isfunction(member) or (name.startswith("__") and name.endswith("__")):
            continue
        where = f"{fake.__qualname__}.{name}"
        real = inspect.getattr_static(hook, name, None)
        if real is None:
            if not name.startswith("_"):
                problems.append(f"{where}: {hook.__name__} has no method {name!r}")
            continue
        if not inspect.isfunction(real):
            problems.append(f"{where}: {hook.__name__}.{name} is a {type(real).__name__}, not a method")
            continue
        problems += [f"{where}: {problem}" for problem in _differences(member, real, f"{hook.__name__}.{name}")]
    return problems


def _differences(mine: Callable[..., Any], real: Callable[..., Any], theirs: str) -> list[str]:
    """How ``mine`` differs from ``real`` (named ``theirs`` in the messages)."""
    problems: list[str] = []
    if inspect.iscoroutinefunction(mine) != inspect.iscoroutinefunction(real):
        problems.append(f"is {_sync(mine)}, {theirs} is {_sync(real)}")
    own = inspect.signature(mine).parameters
    wanted = inspect.signature(real).parameters
    problems += [f"lacks parameter {name!r} of {theirs}" for name in wanted if name not in own]
    problems += [f"has parameter {name!r}, which {theirs} does not take" for name in own if name not in wanted]
    for name in (name for name in wanted if name in own):
        have, want = own[name], wanted[name]
        if have.kind != want.kind:
            problems.append(f"parameter {name!r} is {have.kind.description}, in {theirs} {want.kind.description}")
        if not _same(have.default, want.default):
            problems.append(f"parameter {name!r} defaults to {_default(have)}, in {theirs} to {_default(want)}")
    common = [name for name in wanted if name in own]
    if [name for name in own if name in wanted] != common:
        problems.append(
            f"parameters in the order ({', '.join(n for n in own if n in wanted)}), {theirs} has ({', '.join(common)})"
        )
    if problems:
        problems.append(f"{theirs}{inspect.signature(real)} is the signature to match")
    return problems


def _sync(function: Callable[..., Any]) -> str:
    return "async" if inspect.iscoroutinefunction(function) else "not async"


def _same(mine: object, real: object) -> bool:
    """Whether two defaults are the same value of the same type (``()`` is not ``[]``, ``1`` is not ``True``)."""
    return type(mine) is type(real) and (mine is real or mine == real)


def _default(parameter: inspect.Parameter) -> str:
    return "nothing" if parameter.default is inspect.Parameter.empty else repr(parameter.default)


# ---------------------------------------------------------------------- the fakes in use


def _test_module(path: Path) -> ModuleType:
    """The test module at ``path``: the one pytest imported, else a fresh import of it."""
    for module in list(sys.modules.values()):
        if getattr(module, "__file__", None) == str(path):
            return module
    return load_file(f"_fake_check_{path.stem}", path)


def hook_fakes() -> dict[str, type]:
    """The shared fake and every class a unit-test module derives from it or from ``SlurmHook``, by ``module.class``."""
    found: dict[str, type] = {"fakes.FakeSlurmHook": FakeSlurmHook}
    for path in sorted(UNIT.rglob("test_*.py")):
        source = path.read_text()
        if path == Path(__file__) or ("FakeSlurmHook" not in source and "SlurmHook)" not in source):
            continue
        module = _test_module(path)
        derived = {name: value for name, value in vars(module).items() if isinstance(value, type)}
        for name, value in derived.items():
            if value.__module__ == module.__name__ and issubclass(value, FakeSlurmHook | SlurmHook):
                found[f"{path.stem}.{name}"] = value
    return found


HOOK_FAKES = hook_fakes()


def test_the_fakes_of_every_module_are_found() -> None:
    """The collection above is checked too: a module's fakes missing from it would never be compared."""
    assert {
        "fakes.FakeSlurmHook",
        "test_jobs.LifecycleHook",
        "test_submission.Cluster",
        "test_watch.ScriptedHook",
        "test_before_gpu.LocalHook",
        "test_nccl_probe.WaitingHook",
        "test_sbatch_submit.SubmitHook",
        "test_slurm_job_sensor.SensorHook",
        "test_slurm_job_sensor.LateStatusHook",
        "test_slurm_job_sensor.PokedHook",
        "test_slurm_job_sensor.EndsHook",
        "test_slurm_job_trigger.TriggerHook",
        "test_slurm_job_trigger.WritingHook",
    } <= set(HOOK_FAKES)


@pytest.mark.parametrize("fake", list(HOOK_FAKES.values()), ids=list(HOOK_FAKES))
def test_a_fake_has_the_hooks_signatures(fake: type) -> None:
    assert drift(fake) == []


# ---------------------------------------------------------------------- the check bites


class SubmitWithoutExtraArgs(FakeSlurmHook):
    def submit(  # type: ignore[override]
        self, script_path: str, job_name: str, *, log_dir: str, stage: Any = None
    ) -> str:
        return "1"


class RunWithoutCheck(FakeSlurmHook):
    async def a_run(self, command: str, **_: Any) -> CommandResult:
        return CommandResult(0, "", "")


class SyncCancel(FakeSlurmHook):
    def a_cancel(self, job_ids: Sequence[str], *, job_name: str | None = None) -> None:  # type: ignore[override]
        self.cancels.append((list(job_ids), job_name))


class SmallReads(FakeSlurmHook):
    def read_file(self, path: str, max_bytes: int = 4096) -> str | None:
        return None


class PositionalSince(FakeSlurmHook):
    def get_states(self, job_ids: Iterable[str], since: str = DEFAULT_SACCT_WINDOW) -> dict[str, JobState]:
        return {}


class RenamedIds(FakeSlurmHook):
    def cancel(self, ids: Sequence[str], *, job_name: str | None = None) -> None:
        return None


class SwappedLogArgs(FakeSlurmHook):
    def read_log(self, path: str, max_bytes: int = 65536, offset: int = 0) -> TailChunk[str]:  # type: ignore[override]
        return TailChunk(data="")


class NoSuchMethod(FakeSlurmHook):
    def get_state(self, job_id: str) -> JobState | None:
        return None


class SettingsAsMethod(FakeSlurmHook):
    def settings(self) -> ClusterSettings:  # type: ignore[override]
        return ClusterSettings(hosts=("login",), user="u")


class TupleDefault(FakeSlurmHook):
    def submit(
        self,
        script_path: str,
        job_name: str,
        *,
        log_dir: str,
        extra_args: Sequence[str] = [],
        stage: Any = None,
    ) -> str:
        return "1"


@pytest.mark.parametrize(
    ("fake", "expected"),
    [
        pytest.param(SubmitWithoutExtraArgs, r"\.submit: lacks parameter 'extra_args'", id="lacks"),
        pytest.param(RunWithoutCheck, r"\.a_run: lacks parameter 'check'", id="catch-all-kwargs"),
        pytest.param(RunWithoutCheck, r"\.a_run: has parameter '_', which SlurmHook.a_run", id="extra-parameter"),
        pytest.param(SyncCancel, r"\.a_cancel: is not async, SlurmHook\.a_cancel is async", id="sync"),
        pytest.param(SmallReads, r"\.read_file: parameter 'max_bytes' defaults to 4096, in .* 1048576", id="default"),
        pytest.param(TupleDefault, r"\.submit: parameter 'extra_args' defaults to \[\], in .* to \(\)", id="type"),
        pytest.param(PositionalSince, r"\.get_states: parameter 'since' is positional or keyword", id="kind"),
        pytest.param(RenamedIds, r"\.cancel: lacks parameter 'job_ids'", id="renamed"),
        pytest.param(SwappedLogArgs, r"\.read_log: parameters in the order \(self, path, max_bytes, off", id="order"),
        pytest.param(NoSuchMethod, r"\.get_state: SlurmHook has no method 'get_state'", id="no-such-method"),
        pytest.param(SettingsAsMethod, r"\.settings: SlurmHook\.settings is a cached_property", id="property"),
    ],
)
def test_a_fake_that_drifted_fails_naming_the_method_and_the_difference(fake: type, expected: str) -> None:
    problems = drift(fake)

    assert any(re.match(re.escape(fake.__qualname__) + expected, line) for line in problems), problems


def test_a_fake_that_matches_passes() -> None:
    class Matching(FakeSlurmHook):
        def read_file(self, path: str, max_bytes: int = 1 << 20) -> str | None:
            return None

        def _own_helper(self, anything: int) -> None:
            return None

    assert drift(Matching) == []


# ---------------------------------------------------------------------- the shared fake answers as the hook does


def test_a_read_is_none_only_for_a_missing_file() -> None:
    hook = FakeSlurmHook({"/l/a": "text"})
    hook.unreadable.add("/l/b")

    assert (hook.read_file("/l/a"), hook.read_file("/l/missing")) == ("text", None)
    with pytest.raises(RemoteReadError, match=r"reading /l/b failed on login with exit status 1: Input/output error"):
        hook.read_status_json("/l/b")
    assert hook.reads == ["/l/a", "/l/missing", "/l/b"]


def test_a_checked_command_that_failed_raises_and_an_unchecked_one_answers() -> None:
    hook = FakeSlurmHook()
    hook.handlers.append(lambda command: CommandResult(3, "", "boom") if command == "false" else None)

    assert hook.run("false").rc == 3
    assert hook.run("true") == CommandResult(0, "", "", "login")
    with pytest.raises(RemoteCommandError, match="probe failed on login with exit status 3: boom"):
        hook.run("false", check=True, what="probe")
    assert hook.commands == ["false", "true", "false"]


def test_submit_stages_first_then_sbatch_hands_out_ids_or_refuses() -> None:
    hook = FakeSlurmHook()
    files = {"jobs/j/job.sbatch": (b"#!/bin/sh\n", 0o700)}

    assert hook.submit("/b/jobs/j/job.sbatch", "j", log_dir="/b/logs", stage=("/b", files)) == "501"
    hook.submit_error = SubmissionError("sbatch: invalid partition", rc=1)
    with pytest.raises(SubmissionError):
        hook.submit("/b/jobs/k/job.sbatch", "k", log_dir="/b/logs", extra_args=["--exclude=n1"], stage=("/b", files))

    assert hook.submits == [Submission("/b/jobs/j/job.sbatch", "j", "/b/logs", ())]
    assert hook.staged == [("/b", files), ("/b", files)]  # the refused one was staged in the same round trip
    assert hook.read_file("/b/jobs/j/job.sbatch") == "#!/bin/sh\n"


def test_tail_many_reads_from_the_cursor_and_moves_it_on() -> None:
    hook = FakeSlurmHook({"/l/main.out": "abcdef", "/l/.cursor": "2\n"})
    request = TailRequest("/l/main.out", None, 3, "/l/.cursor")

    first, missing = hook.tail_many([request, TailRequest("/l/none", 0, 3)])
    (second,) = hook.tail_many([request])

    assert (first.offset, first.skipped, first.data, missing.missing) == (2, 1, b"def", True)
    assert (second.data, hook.files["/l/.cursor"]) == (b"", "6\n")

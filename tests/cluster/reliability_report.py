"""RELIABILITY.md: every fault and security case of issue 10, what was done, and its outcome in the last full run.

Two roles in one module:

- A pytest plugin, registered by the conftest of ``tests/cluster/faults`` and ``tests/cluster/security``.
  It records, for every test named in :data:`CATALOGUE` (and every test of the two suites), the
  docstring ("what was done"), the outcome and the details the test attached with ``record_property``.
  At the end of a session that ran the whole catalogue (``make test`` does), it writes
  ``RELIABILITY.json`` (the raw results with the commit and the UTC date of the run, committed beside
  the report) and renders ``RELIABILITY.md`` from it. A partial run (``-k``, one file) writes nothing,
  so it never replaces the report with a partial one.
- A command: ``python tests/cluster/reliability_report.py`` (``make reliability``) runs only the
  catalogue (the two suites plus the tests of other suites it cites), the ``long_outage`` cases included,
  and regenerates the report (a ``make test`` run leaves those out and carries their last result over);
  ``--render-only`` renders ``RELIABILITY.md`` again from ``RELIABILITY.json``.

The rendered file has no timings; its header names the run's commit and date.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import sys
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "RELIABILITY.md"
RESULTS = ROOT / "RELIABILITY.json"
PLUGIN_NAME = "tao-reliability-recorder"
#: A directory: each session of the run (each xdist worker, each phase) writes its share there, and
#: ``--merge DIR`` writes the report from them (``make test``).
PARTS_ENV = "TAO_RELIABILITY_PARTS"
#: The lines around the soak's own section (``tests/cluster/soak.py`` writes it): a regenerated report keeps it.
SOAK_BEGIN = "<!-- soak: written by tests/cluster/soak.py (make soak); kept when the rest is regenerated -->"
SOAK_END = "<!-- soak end -->"
FAULTS = "tests/cluster/faults"
SECURITY = "tests/cluster/security"
SUITES = (FAULTS, SECURITY)
#: The marker of the cases that take minutes: pyproject's addopts deselect them, ``make reliability`` runs them.
LONG = "long_outage"
#: The outcome of a long case a run left out (``make test``) and no earlier run recorded.
LONG_NOT_RUN = "not run in this run (make reliability)"
HOSTILE = f"{SECURITY}/test_security_hostile_input.py::test_refused"

CONN = f"{FAULTS}/test_faults_connection.py"
SCHED = f"{FAULTS}/test_faults_scheduler.py"
CONC = f"{FAULTS}/test_faults_concurrency.py"
SECRETS = f"{SECURITY}/test_security_secrets.py"
INPUT = f"{SECURITY}/test_security_hostile_input.py"
HOOK = "tests/cluster/test_hook.py"
WATCH = "tests/cluster/test_submit_watch.py"
BEFORE = "tests/cluster/test_cluster_before_gpu.py"
DAGS = "tests/cluster/test_example_dags.py"
NET = f"{FAULTS}/test_faults_network.py"
OUTAGES = f"{FAULTS}/test_faults_outages.py"
SKEW = f"{FAULTS}/test_faults_clock_and_limits.py"
LIVE = "tests/cluster/test_watch_live.py"


@dataclass(frozen=True)
class Ref:
    """One test (all its parameters) that proves a case; ``what`` describes tests that have no docstring."""

    node: str
    what: str = ""


@dataclass(frozen=True)
class Case:
    """One case of the issue and the tests that prove it."""

    title: str
    refs: tuple[Ref, ...]


def case(title: str, *refs: Ref | str) -> Case:
    return Case(title, tuple(ref if isinstance(ref, Ref) else Ref(ref) for ref in refs))


#: Section title -> the issue's cases, each with the tests that prove it (new ones first, then earlier suites).
CATALOGUE: dict[str, list[Case]] = {
    "Faults": [
        case(
            "sshd restarted while triggers are deferred",
            f"{CONN}::test_sshd_restart_while_three_triggers_are_deferred",
            Ref(
                f"{HOOK}::test_async_pool_reconnects_after_sshd_restart",
                "The pooled async connection was reset after an sshd restart; the next poll reconnected once, "
                "to the restarted sshd, and answered.",
            ),
        ),
        case(
            "the first login host down (failover)",
            f"{CONN}::test_first_login_host_down_the_task_runs_through_the_next",
            Ref(
                f"{HOOK}::test_failover_connects_to_the_next_host_and_logs_the_first_failure",
                "sync and async sides: a refusing first host, the command ran on the second, the failure was "
                "logged with its reason.",
            ),
            Ref(
                f"{HOOK}::test_all_hosts_down_lists_every_host_and_why",
                "sync and async sides: every host refused; one error lists each host and why.",
            ),
        ),
        case(
            "the SSH connection cut during submit after sbatch ran (ambiguous submit)",
            Ref(
                f"{HOOK}::test_ambiguous_submission_is_reconciled_by_exact_name",
                "Through the fault sshd (sbatch submits, then the session is cut before the reply): the hook "
                "reconciled by exact job name, adopted and released the one job; it ran to completion.",
            ),
            Ref(
                f"{HOOK}::test_async_run_never_repeats_a_command_whose_connection_dropped",
                "The async side got ConnectionLostError for the cut sbatch and did not send it again: one job.",
            ),
            f"{CONN}::test_submit_task_sigkilled_after_sbatch_then_retried_adopts_the_job",
        ),
        case("the poller's connection dropped mid-query", f"{CONN}::test_poller_connection_dropped_mid_query"),
        case(
            "slurmctld restarted mid-job",
            f"{SCHED}::test_slurmctld_restarted_mid_job",
            Ref(
                f"{HOOK}::test_controller_down_still_answers_from_accounting_then_fails_clearly",
                "slurmctld stopped: the poll still answered from sacct; with slurmdbd stopped too, one clear "
                "error naming both daemons.",
            ),
        ),
        case("slurmdbd down (sacct fails, squeue works) and then back", f"{SCHED}::test_slurmdbd_down_then_back"),
        case(
            "the sacct lag right after submit",
            f"{SCHED}::test_sacct_lag_right_after_submit",
            Ref(
                "tests/unit/triggers/test_slurm_job_trigger.py::test_not_found_right_after_submit_is_not_an_error",
                "Unit: a job unknown to squeue and sacct right after submit is waited for, not failed.",
            ),
            Ref(
                "tests/unit/triggers/test_slurm_job_trigger.py::test_terminal_state_from_squeue_waits_for_sacct_exit_code",
                "Unit: an end seen only by squeue waits for sacct's exit code.",
            ),
        ),
        case(
            "triggerer restart: the trigger rebuilt from serialize() continues without resubmitting or cancelling",
            Ref(
                f"{WATCH}::test_triggerer_restart_keeps_the_job_and_a_new_trigger_finishes_it",
                "The running trigger was cancelled and cleaned up like a triggerer shutdown; the job stayed live; "
                "a trigger rebuilt from the JSON of serialize() finished it; one job.",
            ),
            Ref(
                "tests/unit/triggers/test_slurm_job_trigger.py::test_triggerer_restart_cancels_run_and_cleanup_does_not_cancel_the_job",
                "Unit: cancelling run() and calling cleanup() sends no scancel and no further poll.",
            ),
        ),
        case(
            "NODE_FAIL with requeue off",
            Ref(
                f"{WATCH}::test_node_failure_without_requeue_is_resubmitted_once_avoiding_the_node",
                "The job's node was set DOWN while it ran (--no-requeue): NODE_FAIL, classified ERR_INFRA, "
                "resubmitted once under a new job id excluding the node, which completed; two jobs, two records.",
            ),
            Ref(
                f"{WATCH}::test_secret_env_survives_a_node_failure_resubmission",
                "Same fault with a secret: the sidecar stayed for the resubmitted job, which received the secret; "
                "removed at the end.",
            ),
        ),
        case(
            "NODE_FAIL with requeue on",
            Ref(
                f"{WATCH}::test_node_failure_with_requeue_continues_the_same_job",
                "The job's node was set DOWN while it ran (--requeue): SLURM requeued the same job id, the record "
                "shows PENDING after RUNNING, the rerun completed; one job.",
            ),
        ),
        case(
            "REQUEUED",
            f"{SECRETS}::test_every_run_ended_as_it_should",
            f"{SECRETS}::test_sidecar_is_private_while_the_job_lives_and_gone_after",
        ),
        case("PREEMPTED", f"{SCHED}::test_failure_state_ends_the_task_once[preempted]"),
        case("TIMEOUT", f"{SCHED}::test_timeout_at_the_wall_limit"),
        case("OUT_OF_MEMORY", f"{SCHED}::test_failure_state_ends_the_task_once[out-of-memory]"),
        case(
            "the submit task killed (SIGKILL) right after sbatch, then retried: adopts the job",
            f"{CONN}::test_submit_task_sigkilled_after_sbatch_then_retried_adopts_the_job",
            Ref(
                f"{WATCH}::test_success_sidecar_and_retried_submit_adopts_its_job",
                "A second try of a submit task whose first try had submitted adopted that job; one job.",
            ),
        ),
        case(
            "three concurrent DAG runs on the same image and dataset: one conversion, three jobs, three records",
            f"{CONC}::test_three_concurrent_dag_runs_share_one_conversion",
            Ref(
                f"{BEFORE}::test_two_concurrent_runs_share_one_conversion_job",
                "Two concurrent imports of one image: one conversion job, both got the same .sqsh.",
            ),
        ),
        case(
            "cancellation: by the user (Airflow) and outside Airflow",
            Ref(
                f"{WATCH}::test_user_kill_of_the_deferred_sensor_cancels_the_job",
                "The deferred task was marked failed (run() cancelled, on_kill, cleanup): the job was cancelled.",
            ),
            Ref(
                f"{WATCH}::test_job_cancelled_outside_airflow_is_canceled",
                "scancel outside Airflow: the task failed as cancelled, record CANCELED, sidecar removed.",
            ),
            f"{SECRETS}::test_user_kill_of_a_waiting_non_deferrable_sensor",
        ),
    ],
    "Round two": [
        case(
            "the triggerer process killed (SIGKILL) with a deferred sensor, then a new triggerer",
            "tests/cluster/test_airflow_ui.py::test_the_triggerer_killed_mid_job_and_a_new_one_finishes_it",
        ),
        case(
            "two triggerers (Airflow's HA setup, on PostgreSQL): triggers spread, one connection per process, "
            "one killed and its triggers moved to the other",
            f"{FAULTS}/test_faults_ha_triggerers.py::"
            "test_two_triggerers_share_the_sensors_and_one_takes_over_when_the_other_is_killed",
        ),
        case(
            "a black-holed login host (accepts TCP, never speaks) first in the host list",
            f"{NET}::test_black_holed_first_login_host_fails_over_within_conn_timeout",
            f"{NET}::test_black_hole_alone_fails_within_conn_timeout_naming_host_and_timeout",
        ),
        case(
            "the host key rotated while pooled connections are open",
            f"{NET}::test_host_key_rotated_while_connections_are_open_refuses_new_connections",
        ),
        case(
            "slurmdbd down for longer than the settle window (over 30 s) and past MinJobAge (6 minutes with "
            "SLURM's default 300 s; 30 s lowered in the normal suite) while jobs end",
            f"{OUTAGES}::test_slurmdbd_down_past_the_settle_window",
            f"{OUTAGES}::test_slurmdbd_down_six_minutes_past_the_default_min_job_age",
            f"{OUTAGES}::test_slurmdbd_down_past_a_lowered_min_job_age",
        ),
        case(
            "slurmctld unreachable from the login host while SSH stays up",
            f"{OUTAGES}::test_slurmctld_unreachable_from_the_login_host",
        ),
        case(
            "a user kill of a deferred sensor while the login host cannot reach slurmctld (found by the soak)",
            f"{OUTAGES}::test_a_user_kill_while_the_login_host_cannot_reach_slurmctld_goes_through_once_it_can",
            f"{OUTAGES}::test_a_sensor_marked_failed_in_airflow_during_a_login_head_cut_cancels_its_job_once_the_cut_lifts",
        ),
        case(
            "default sshd limits (MaxStartups 10:30:100, MaxSessions 10) with 200 deferred sensors",
            f"{SKEW}::test_two_hundred_deferred_sensors_behind_an_sshd_with_default_limits",
        ),
        case(
            "clock skew: the login host's clock 10 minutes off the worker's and the storage's",
            f"{SKEW}::test_a_fresh_conversion_lock_reads_fresh_on_a_login_host_ten_minutes_ahead",
            f"{SKEW}::test_the_partition_cache_written_a_moment_ago_is_used_on_a_login_host_ten_minutes_ahead",
            f"{SKEW}::test_a_job_watched_through_a_login_host_ten_minutes_ahead_has_right_windows_and_timestamps",
            Ref(
                "tests/unit/operators/test_before_gpu.py::test_lock_age_is_measured_by_the_storage_clock_not_the_login_hosts",
                "Unit, real sh with a date 10 minutes off either way: the lock's age is the storage's.",
            ),
        ),
        case(
            "two concurrent tries of the same task (a zombie try and its retry)",
            f"{CONC}::test_a_zombie_try_and_its_retry_submitting_at_once_leave_one_job",
            Ref(
                "tests/unit/core/test_commands.py::test_two_tries_submitting_at_once_keep_only_the_oldest_job",
                "Unit, real shells: the held job cancels itself when an older live job of its name exists, "
                "and that one is released and returned.",
            ),
        ),
        case(
            "shared-storage attacks: links, directories and files another user planted in the results tree "
            "(jobs/, the staging target, the sidecar's name, logs/, records/, the partition cache), or a tree "
            "left open to others",
            f"{SECURITY}/test_security_shared_storage.py::"
            "test_a_plant_in_the_results_tree_stops_the_submit_before_anything_is_written",
            f"{SECURITY}/test_security_shared_storage.py::"
            "test_a_link_left_at_the_sidecars_name_is_replaced_not_written_through",
            Ref(
                "tests/unit/core/test_commands.py::test_a_planted_link_or_dir_stops_every_writer_before_it_writes",
                "Unit, real sh and bash as root with the plants given to nobody: ten plants (open, group-writable "
                "or foreign base, links, sticky dirs, a file for a dir, a deep link) against every writer (file "
                "write, staging, held submit, log dir, partition cache): exit 86 naming the path, nothing written "
                "through, nothing submitted (a link at the job-id-named log dir cancels the held job).",
            ),
        ),
        case(
            "hostile job output: ANSI escapes, fake Airflow log lines, carriage returns, invalid UTF-8, NUL, "
            "a 1 GB flood; a restarted triggerer",
            f"{LIVE}::test_hostile_and_flooding_output_stays_bounded_readable_and_unforgeable",
            f"{LIVE}::test_a_restarted_triggerer_resumes_the_stream_without_duplicates",
            Ref(
                "tests/unit/core/test_logstream.py::test_job_output_cannot_forge_the_framing",
                "Unit, real sh: a log printing the read's own framing markers is read as data.",
            ),
        ),
        case(
            "hostile specs: YAML bombs, deep nesting, huge values",
            Ref(
                "tests/unit/core/test_specs.py::test_hostile_specs_are_refused_quickly_in_little_memory",
                "Unit: billion-laughs aliases, nesting past 32, 50,000+ values, 1 MiB texts refused in "
                "bounded time and memory.",
            ),
        ),
        case(
            "secrets in other forms (base64, URL-encoded, JSON-escaped, shell-special characters); the lint "
            "as strict as the TAO workflow's",
            f"{SECRETS}::test_secret_is_absent",
            Ref(
                "tests/unit/core/test_secrets.py::test_the_lint_catches_what_the_workflows_lint_catches",
                "Unit: docker/podman login -p, list-item options, ${NAME:-X}, name/value env lists (block, "
                "flow, JSON), partial quotes, backslash-newline splices are all flagged.",
            ),
            Ref(
                "tests/unit/core/test_secrets.py::test_redacted_text_lints_clean_and_redacting_twice_changes_nothing",
                "Unit: redacted text lints clean; redaction is idempotent.",
            ),
            Ref(
                "tests/unit/core/test_secrets.py::test_a_known_secret_is_redacted_in_its_encoded_forms",
                "Unit: base64, URL and JSON forms of a known secret are redacted.",
            ),
        ),
        case(
            "end markers: a marker accounting does not confirm (the job still runs, then SLURM requeues it), and "
            "a run requeued by SIGTERM (no marker): the watch goes on to the next run; accounting ends it and the "
            "record agrees; with slurmdbd down or cut off, markers end nothing and the scheduler queries decide",
            f"{WATCH}::test_a_marker_accounting_does_not_confirm_does_not_end_the_watch",
            f"{WATCH}::test_a_run_cancelled_or_requeued_by_sigterm_leaves_no_marker",
            f"{WATCH}::test_the_end_marker_ends_the_watch_within_seconds_at_a_30_s_scheduler_interval",
        ),
    ],
    "Hostile and bad input": [
        case("refused before any remote command (one row per value below)", HOSTILE),
        case(
            "accepted and passed quoted, no injection",
            f"{INPUT}::test_accepted_values_arrive_byte_exact",
            f"{INPUT}::test_canary_never_appeared",
            Ref(
                f"{BEFORE}::test_hostile_inputs_are_refused_before_any_command",
                "EnrootImportOperator: ; $( ) backticks newline in image, sqsh_path, containers_dir, partition: "
                "refused, no command sent, canary absent.",
            ),
            Ref(
                f"{BEFORE}::test_an_odd_but_valid_image_name_is_quoted_all_the_way",
                "A registry image with unusual but valid characters converted and named correctly.",
            ),
            Ref(
                f"{BEFORE}::test_dataset_check_refuses_local_paths_before_any_ssh",
                "file:// and relative dataset paths refused before any SSH.",
            ),
            Ref(
                "tests/cluster/test_cluster_execution.py::test_bad_supporting_files_are_refused_before_anything_is_staged",
                "Spec-bundle supporting files escaping their root or missing: refused before staging.",
            ),
            Ref(
                "tests/unit/core/test_commands.py::test_sbatch_hostile_values_stay_one_word",
                "Unit, real shells: hostile values in every command builder stay one word.",
            ),
        ),
    ],
    "Secrets": [
        case(
            "no secret value in task logs, triggerer logs, XCom, job records, rendered scripts, spec/env/meta "
            "files, the login host's process list or sshd logs, after success, failure, cancel and requeue runs",
            f"{SECRETS}::test_secret_is_absent",
            Ref(
                f"{DAGS}::test_secret_is_absent",
                "After full `airflow dags test` runs of the example DAG: the secret is absent from every place.",
            ),
            Ref(
                f"{HOOK}::test_enroot_credentials_are_private_and_never_leak",
                "Registry credentials: mode 600, never in argv (ps sampled), logs, sent commands or sshd logs.",
            ),
        ),
        case(
            "the sidecar is mode 600 while the job lives, survives a requeue, and is gone after every terminal state",
            f"{SECRETS}::test_sidecar_is_private_while_the_job_lives_and_gone_after",
            f"{SECRETS}::test_user_kill_of_a_waiting_non_deferrable_sensor",
            Ref(
                f"{DAGS}::test_secret_reached_the_program_and_its_sidecar_is_gone",
                "Example DAG: the program received the secret; the sidecar is gone afterwards.",
            ),
        ),
        case(
            "host keys verified by default; a changed host key is refused",
            Ref(
                f"{HOOK}::test_untrusted_host_key_is_refused",
                "sync and async: an unknown host key (nothing pinned, empty known_hosts) and a changed pinned "
                "key are refused with HostKeyError; nothing is learnt on first use.",
            ),
        ),
        case(
            "key files with loose permissions refused",
            Ref(
                f"{HOOK}::test_key_readable_by_others_is_refused_before_connecting",
                "sync and async, modes 0644/0640/0604: refused with the chmod 600 fix, before any connection.",
            ),
        ),
    ],
}

#: Every problem found while building the suites: fixed (where, proven by) or open (why).
FINDINGS: list[tuple[str, str, str]] = [
    (
        "Two tries of one submit task running at once (a zombie try and its retry) both submitted a job "
        "under the same name: two trainings on the GPUs.",
        "fixed: `commands.sbatch_submit_held` checks, while the new job is held, for an older live job of the "
        "same name and user; the newer one cancels itself and the older one is released and adopted",
        f"{CONC}::test_a_zombie_try_and_its_retry_submitting_at_once_leave_one_job",
    ),
    (
        "With the race forced (both tries held at a barrier before their submitting round trip), the two tries "
        "unpacked the same job files at the same moment and one tar failed (`specs/spec.yaml: Cannot open: "
        "File exists`: GNU tar unlinks a member's old file, then creates it exclusively, and the other tar "
        "created it in between): that try failed with 'staging failed, nothing was submitted' instead of "
        "adopting the other's job (2 of 9 runs of the test, 2 of 33 races).",
        "fixed: `commands.extract_tar` unpacks into a private directory and renames each file into place "
        "(one rename(2), which replaces the twin's file instead of failing)",
        f"{CONC}::test_a_zombie_try_and_its_retry_submitting_at_once_leave_one_job",
    ),
    (
        "Ages on shared storage (the conversion lock, the partition cache) were the login host's `date` minus "
        "the file's mtime: with the login host's clock 10 minutes ahead of the storage's, a lock taken a moment "
        "ago read as 600 s old (past the 300 s submit grace: broken, the image converted twice), and a cache "
        "dated in the future read as fresh.",
        "fixed: `core.shell.storage_now` takes 'now' from a scratch file's mtime on the same storage; a cache "
        "dated in the future is stale",
        f"{SKEW}::test_a_fresh_conversion_lock_reads_fresh_on_a_login_host_ten_minutes_ahead",
    ),
    (
        "The sync connection trusted a host key from `~/.ssh/known_hosts` over the pinned `host_key`: after "
        "a rotation it connected silently when known_hosts listed the new key.",
        "fixed: `SlurmHook._connect` compares the server's key with the pinned one after connecting",
        f"{NET}::test_host_key_rotated_while_connections_are_open_refuses_new_connections",
    ),
    (
        "A login host that accepts TCP and never speaks was reported as 'unreachable (No existing session)' "
        "and left a socket open for up to 30 s after each failover.",
        "fixed: banner and auth timeouts bounded by conn_timeout, the error names the host and the timeout",
        f"{NET}::test_black_holed_first_login_host_fails_over_within_conn_timeout",
    ),
    (
        "A retried submit task adopted its earlier try's job but never released it: when the first try died "
        "between `sbatch --hold` and the release (killed worker, cut session), the job stayed PENDING "
        "(JobHeldUser) forever and the sensor waited forever.",
        "fixed: `SbatchSubmitOperator._adopt` creates the log directory and releases the adopted job "
        "(`commands.prepare_job_logs`, a no-op for a released job)",
        f"{CONN}::test_submit_task_sigkilled_after_sbatch_then_retried_adopts_the_job",
    ),
    (
        "A user kill of a deferred sensor cancelled the job but left the mode-600 secret sidecar on shared "
        "storage: no execute_complete runs after a kill, and only it removed the sidecar.",
        "fixed: `SlurmJobTrigger` takes `sidecar_path` (serialized; the sensor passes the handle's) and its "
        "`on_kill` removes the sidecar after the scancel",
        f"{SECRETS}::test_sidecar_is_private_while_the_job_lives_and_gone_after[cancel]",
    ),
    (
        "A non-deferrable sensor had no `on_kill`: a user kill left the SLURM job running and its sidecar in place.",
        "fixed: `SlurmJobSensor.on_kill` cancels the job it waits for (by id and exact name) and removes the sidecar",
        f"{SECRETS}::test_user_kill_of_a_waiting_non_deferrable_sensor",
    ),
    (
        "The sensor accepted a job handle whose `job_id` is not a job name (e.g. `x;touch ...`); it was used "
        "quoted, but failed only late (at a resubmission).",
        "fixed: `SlurmJobSensor` checks the handle's `job_id` with `check_job_id` before deferring",
        f"{HOSTILE}[sensor-job-id-injection]",
    ),
    (
        "PREEMPTED (without requeue) ends the task as CANCELED without resubmission, as the design's state table "
        "says, while `core.failures.classify` calls PREEMPTED a retryable ERR_INFRA: the sensor never asks it.",
        "fixed (issue 15): the seed's table decides; CANCELLED, PREEMPTED and REVOKED are CANCELED and "
        "`classify` refuses them (SLURM's own requeue handles preemption)",
        f"{SCHED}::test_failure_state_ends_the_task_once[preempted]",
    ),
    (
        "OUT_OF_MEMORY and PREEMPTED cannot happen on the test cluster (no cgroup memory enforcement, "
        "PreemptType none): those two cases rewrite only the state columns of the scheduler's answer.",
        "open (test-cluster limit): the harness would need cgroup memory limits (or "
        "`JobAcctGatherParams=OverMemoryKill`) and a preemption policy; changing slurm.conf restarts the "
        "daemons every suite shares",
        f"{SCHED}::test_failure_state_ends_the_task_once",
    ),
    (
        "`test_node_failure_with_requeue_continues_the_same_job` was flaky (failed 3 of 5 runs while building "
        "this suite): it set the node DOWN as soon as squeue showed the job RUNNING, so the trigger's 1 s poll "
        "often never saw RUNNING and the record had no RUNNING to find.",
        "fixed (test race): `through_node_failure` waits two poll intervals after RUNNING before the node fails",
        f"{WATCH}::test_node_failure_with_requeue_continues_the_same_job",
    ),
    (
        "`tests/cluster/test_hook.py` samples the process list with `ps -eo args`, which cuts each command "
        "line at 80 columns when not on a terminal: a secret late in a long argv would be missed.",
        "fixed: the hook suite samples with `ps -eww -o args=` (full command lines), as the security suite does",
        f"{HOOK}::test_enroot_credentials_are_private_and_never_leak",
    ),
    (
        "The second one-hour soak (seed 41207): two runs marked failed while the login host could not reach "
        "slurmctld ran on to COMPLETED with their records open; the trigger's on_kill tried scancel once, it "
        "failed at once, and the cancel was over.",
        "fixed: a scancel that slurmctld does not answer is handed to the login host, which tries it again "
        "every 5 s for up to an hour (a log beside the record says what became of it), and on_kill ends at "
        "once; a login host out of reach is tried again for 35 s in a worker and 20 s in the triggerer "
        "(inside Airflow's on_kill budgets). Proven with a 40 s cut, past the triggerer's 30 s budget",
        f"{OUTAGES}::test_a_user_kill_while_the_login_host_cannot_reach_slurmctld_goes_through_once_it_can",
    ),
]


# ---------------------------------------------------------------------- recording


def _matches(nodeid: str, ref: str) -> bool:
    """Whether ``nodeid`` is the test ``ref`` names (all parameters when ``ref`` has none)."""
    return nodeid == ref or nodeid.startswith(f"{ref}[")


def _refs() -> list[str]:
    return [ref.node for cases in CATALOGUE.values() for item in cases for ref in item.refs]


def catalogued(nodeid: str) -> bool:
    """Whether a test belongs in the report: a test of the two suites, or one the catalogue cites."""
    return nodeid.startswith(tuple(f"{suite}/" for suite in SUITES)) or any(_matches(nodeid, r) for r in _refs())


def _doc(item: pytest.Item) -> str:
    function = getattr(item, "function", None)
    text = inspect.getdoc(function) if function is not None else None
    return " ".join((text or "").split())


class Recorder:
    """The pytest plugin: collects docstrings, outcomes and properties; writes the report after a full run."""

    def __init__(self) -> None:
        self.tests: dict[str, dict[str, Any]] = {}
        self.deselected: list[str] = []
        # What is tested is the checkout as the session starts (the run takes minutes; files may change).
        self.commit = tested_commit()
        self.date = datetime.now(UTC).isoformat(timespec="seconds")

    @pytest.hookimpl
    def pytest_deselected(self, items: Sequence[pytest.Item]) -> None:
        for item in items:
            if catalogued(item.nodeid) and item.get_closest_marker(LONG):
                # Left out by default (make test): the report keeps its last make reliability result.
                self.tests[item.nodeid] = {"doc": _doc(item), "outcome": LONG_NOT_RUN, "properties": {}}
            elif catalogued(item.nodeid):
                self.deselected.append(item.nodeid)

    @pytest.hookimpl
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        for item in session.items:
            if catalogued(item.nodeid):
                self.tests[item.nodeid] = {"doc": _doc(item), "outcome": "not run", "properties": {}}

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        test = self.tests.get(report.nodeid)
        if test is None:
            return
        if report.when == "call" or (report.when == "setup" and not report.passed):
            if hasattr(report, "wasxfail"):
                test["outcome"] = "open (xfail)" if report.skipped else "XPASS"
            elif report.failed:
                test["outcome"] = "FAILED" if report.when == "call" else "ERROR"
            else:
                test["outcome"] = report.outcome
            test["properties"].update({str(k): str(v) for k, v in report.user_properties})
        elif report.when == "teardown" and report.failed:
            test["outcome"] = "ERROR"

    @pytest.hookimpl
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if session.config.option.collectonly:
            return
        parts = os.environ.get(PARTS_ENV)
        if parts:
            self._write_part(Path(parts))
        elif not hasattr(session.config, "workerinput"):  # an xdist worker ran a share of the run only
            write_run(self.tests, self.deselected, self.commit, self.date)

    def _write_part(self, parts: Path) -> None:
        """This session's share of a run made of several sessions (``make test``: the cluster tests that run
        side by side under xdist, each worker a session, then those that run alone): what it ran and what it
        left out. ``--merge`` writes the report from every share."""
        ran = {nodeid: test for nodeid, test in self.tests.items() if test["outcome"] != "not run"}
        if not ran and not self.deselected:  # xdist's controller: its workers ran the tests
            return
        part = {"commit": self.commit, "date": self.date, "tests": ran, "deselected": self.deselected}
        parts.mkdir(parents=True, exist_ok=True)
        (parts / f"{os.getpid()}-{uuid.uuid4().hex}.json").write_text(json.dumps(part, indent=1) + "\n")


def write_run(tests: dict[str, dict[str, Any]], deselected: Sequence[str], commit: str, date: str) -> bool:
    """Write ``RELIABILITY.json`` and ``RELIABILITY.md`` from a run that ran every catalogued case; return
    whether it did (a partial run, ``-k`` or one file, writes nothing)."""
    missing = [ref for ref in _refs() if not any(_matches(nodeid, ref) for nodeid in tests)]
    if deselected or missing:
        return False
    carry_long_results(tests)
    run = {"commit": commit, "date": date, "tests": tests}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(run, indent=1) + "\n")  # tests in collection order, as rendered
    write_report(render(run))
    return True


def merge_parts(parts: Path) -> str:
    """Write the report from the shares in ``parts`` (see :meth:`Recorder._write_part`); return what was done.

    A case one share left out and no share ran keeps the report from being written, as in a partial run.
    The run's commit must be the same in every share; its date is the earliest share's.
    """
    shares = [json.loads(path.read_text()) for path in sorted(parts.glob("*.json"))]
    if not shares:
        return f"no share of a run in {parts}: nothing written"
    commits = sorted({share["commit"] for share in shares})
    if len(commits) > 1:
        return f"the shares in {parts} tested different commits ({', '.join(commits)}): nothing written"
    tests: dict[str, dict[str, Any]] = {}
    for share in sorted(shares, key=lambda share: str(share["date"])):
        for nodeid, test in share["tests"].items():
            if nodeid not in tests or tests[nodeid]["outcome"] == LONG_NOT_RUN:
                tests[nodeid] = test
    deselected = sorted({nodeid for share in shares for nodeid in share["deselected"]} - set(tests))
    ordered = dict(sorted(tests.items(), key=lambda entry: entry[0].split("::")[0]))
    date = min(str(share["date"]) for share in shares)
    if not write_run(ordered, deselected, commits[0], date):
        ran = f"{len(shares)} shares in {parts} ran {len(tests)} catalogued tests"
        return f"{ran}, not the whole catalogue ({len(deselected)} left out): nothing written"
    return f"{REPORT.name} written from {len(shares)} shares in {parts}: {len(tests)} catalogued tests"


def soak_section(report: str) -> str:
    """The body of the soak's section of ``report`` ('' when it has none)."""
    begin, end = report.find(SOAK_BEGIN), report.find(SOAK_END)
    return report[begin + len(SOAK_BEGIN) : end].strip() if 0 <= begin < end else ""


def replace_soak_section(report: str, section: str) -> str:
    """``report`` with its soak section (markers included) replaced by ``section``, at the end."""
    begin, end = report.find(SOAK_BEGIN), report.find(SOAK_END)
    kept = report[:begin] + report[end + len(SOAK_END) :] if 0 <= begin < end else report
    return f"{kept.rstrip()}\n\n{SOAK_BEGIN}\n{section.strip()}\n{SOAK_END}\n"


def write_report(text: str) -> None:
    """Write the rendered report, keeping the soak section of the one it replaces."""
    try:
        earlier = soak_section(REPORT.read_text())
    except OSError:
        earlier = ""
    REPORT.write_text(replace_soak_section(text, earlier) if earlier else text)


def carry_long_results(tests: dict[str, dict[str, Any]]) -> None:
    """Give each long case this run left out its result from ``RELIABILITY.json``, with the run it came from."""
    try:
        earlier = json.loads(RESULTS.read_text())
    except (OSError, ValueError):
        return
    for nodeid, test in tests.items():
        last = earlier.get("tests", {}).get(nodeid)
        if test["outcome"] != LONG_NOT_RUN or last is None or last["outcome"] == LONG_NOT_RUN:
            continue
        ran = last.get("ran") or f"commit `{earlier.get('commit')}`, started {earlier.get('date')}"
        test.update(outcome=last["outcome"], properties=last["properties"], ran=ran)


def tested_commit() -> str:
    """``git rev-parse HEAD`` of the checkout tested, with ``-dirty`` when it has changes (the report aside).

    The same rule as the benchmarks' (``benchmarks/gitstate.py``, loaded by path: ``benchmarks`` is no package).
    """
    spec = importlib.util.spec_from_file_location("gitstate", ROOT / "benchmarks" / "gitstate.py")
    assert spec is not None
    assert spec.loader is not None
    gitstate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gitstate)
    return str(gitstate.checkout_commit(ROOT, (REPORT.name, RESULTS.name)))


def register(config: pytest.Config) -> None:
    """Register the recorder once per session (both suites' conftests call this)."""
    if not config.pluginmanager.has_plugin(PLUGIN_NAME):
        config.pluginmanager.register(Recorder(), PLUGIN_NAME)


# ---------------------------------------------------------------------- rendering


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _outcome(outcomes: Iterable[str]) -> str:
    """``passed``, ``passed (3)``, or every non-pass outcome with its count."""
    values = list(outcomes)
    if not values:
        return "**not run**"
    if set(values) == {"passed"}:
        return "passed" if len(values) == 1 else f"passed ({len(values)})"
    counts = {value: values.count(value) for value in dict.fromkeys(values)}
    return ", ".join(f"**{value}** ({count} of {len(values)})" for value, count in counts.items())


def _rows(tests: dict[str, dict[str, Any]], ref: Ref) -> tuple[str, str, str]:
    found = {nodeid: test for nodeid, test in tests.items() if _matches(nodeid, ref.node)}
    docs = [test["doc"] for test in found.values() if test["doc"]]
    details = [test["properties"]["detail"] for test in found.values() if "detail" in test["properties"]]
    what = ref.what or (docs[0] if docs else "")
    if details:
        what += " Observed: " + "; ".join(dict.fromkeys(details)) + "."
    for ran in dict.fromkeys(test["ran"] for test in found.values() if "ran" in test):
        what += f" Not run in this run: outcome and observations of the last run that ran it (make reliability), {ran}."
    return f"`{ref.node}`", what, _outcome(test["outcome"] for test in found.values())


def render(run: dict[str, Any]) -> str:
    """RELIABILITY.md from a recorded run: its ``commit``, ``date`` and ``tests``."""
    tests: dict[str, dict[str, Any]] = run["tests"]
    outcomes = [test["outcome"] for test in tests.values()]
    summary = ", ".join(f"{outcomes.count(o)} {o}" for o in dict.fromkeys(sorted(outcomes)))
    lines = [
        "# Reliability",
        "",
        "Generated by `tests/cluster/reliability_report.py` from the last full test run (`make test`, or",
        "`make reliability` for the catalogue alone); the raw results are in `RELIABILITY.json`. Do not edit",
        "by hand: change the tests or the catalogue.",
        "",
        f"Run at commit `{run['commit']}`, started {run['date']}.",
        "",
        "Every case of issue 10 runs against the local SLURM test cluster (real SLURM 22.05, real OpenSSH);",
        "faults are injected for real with `tests/cluster/harness.py` (sshd restart, slurmctld restart,",
        "slurmdbd stop/start, node down) or on the connection itself (`ss -K` on the test's own socket, the",
        "fault sshd that cuts the session after sbatch, SIGKILL of the submitting process). Each fault case",
        "checks that the task ends correctly, that exactly one SLURM job exists per logical submission",
        "(asked independently over OpenSSH) and that nothing is left running. Tests of earlier suites that",
        "already prove a case are cited by node id, with their outcome in the same run.",
        "",
        f"**{len(tests)} tests: {summary}.**",
        "",
    ]
    for section, cases in CATALOGUE.items():
        lines += [f"## {section}", "", "| case | test | what was done | outcome |", "|---|---|---|---|"]
        for item in cases:
            for index, ref in enumerate(item.refs):
                node, what, outcome = _rows(tests, ref)
                title = _cell(item.title) if index == 0 else ""
                lines.append(f"| {title} | {_cell(node)} | {_cell(what)} | {outcome} |")
        lines.append("")
        if section == "Hostile and bad input":
            lines += _hostile_table(tests)
    extra = [nodeid for nodeid in tests if nodeid.startswith(SUITES) and not any(_matches(nodeid, r) for r in _refs())]
    if extra:
        lines += ["## Other tests of the suites", "", "| test | what was done | outcome |", "|---|---|---|"]
        lines += [f"| `{_cell(n)}` | {_cell(tests[n]['doc'])} | {_outcome([tests[n]['outcome']])} |" for n in extra]
        lines.append("")
    lines += ["## Findings", "", "Every problem found while building these suites.", ""]
    lines += ["| # | finding | status | proven by |", "|---|---|---|---|"]
    for number, (finding, status, proof) in enumerate(FINDINGS, 1):
        lines.append(f"| {number} | {_cell(finding)} | {_cell(status)} | `{_cell(proof)}` |")
    return "\n".join(lines) + "\n"


def _hostile_table(tests: dict[str, dict[str, Any]]) -> list[str]:
    rows = {nodeid: test for nodeid, test in tests.items() if _matches(nodeid, HOSTILE)}
    lines = [
        f"### Values refused before any remote command ({len(rows)})",
        "",
        "Each value was given to one parameter and the task (or hook) run, with paramiko's connect/exec and",
        "asyncssh's connect watched: refused with an error naming the parameter or the problem, and no SSH",
        "activity at all. `CANARY` is `/tmp/tao-rl-canary`; `x…` stands for a 5000-character run.",
        "",
        "| id | parameter | value | outcome |",
        "|---|---|---|---|",
    ]
    for nodeid, test in rows.items():
        props = test["properties"]
        value = props.get("value", "").replace("x" * 60, "x…")
        case_id = nodeid[len(HOSTILE) + 1 : -1]
        shown = props.get("outcome", "") if test["outcome"] == "passed" else f"**{test['outcome']}**"
        lines.append(f"| {case_id} | {_cell(props.get('parameter', ''))} | `{_cell(value)}` | {_cell(shown)} |")
    return [*lines, ""]


# ---------------------------------------------------------------------- command line


class OnlyCatalogue:
    """Deselects what the catalogue does not name from the files it cites (so each module is collected once)."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        keep = [item for item in items if catalogued(item.nodeid)]
        config.hook.pytest_deselected(items=[item for item in items if not catalogued(item.nodeid)])
        items[:] = keep


def main(argv: Sequence[str] | None = None) -> int:
    """Run the catalogue and regenerate RELIABILITY.md, or only render it again (``--render-only``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--render-only", action="store_true", help=f"render {REPORT.name} from {RESULTS}")
    parser.add_argument(
        "--cited-outside-cluster",
        action="store_true",
        help="print the tests the catalogue cites outside tests/cluster, one per line (make test adds them to "
        "its cluster run, which regenerates the report, after the unit tests ran on every core)",
    )
    parser.add_argument(
        "--merge",
        metavar="DIR",
        type=Path,
        help=f"write the report from the shares the sessions of one run wrote into DIR (${PARTS_ENV})",
    )
    args, pytest_args = parser.parse_known_args(argv)  # anything else goes to pytest
    if args.merge:
        print(merge_parts(args.merge))
        return 0
    if args.cited_outside_cluster:
        print("\n".join(dict.fromkeys(ref for ref in _refs() if not ref.startswith("tests/cluster/"))))
        return 0
    if args.render_only:
        run = json.loads(RESULTS.read_text())
        if "tests" not in run:  # written before runs recorded their commit: the tests alone
            run = {"commit": "not recorded", "date": "not recorded", "tests": run}
        write_report(render(run))
        return 0
    files = dict.fromkeys(ref.split("::")[0] for ref in _refs() if not ref.startswith(SUITES))
    os.chdir(ROOT)
    every = ["-m", f"{LONG} or not {LONG}"]  # the long cases too (pyproject's addopts leave them out)
    return int(pytest.main([*SUITES, *files, *every, *pytest_args], plugins=[OnlyCatalogue()]))


if __name__ == "__main__":
    sys.exit(main())

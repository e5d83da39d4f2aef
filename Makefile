# The two commands a newcomer runs (see README): `make demo` and `make test`.
# Both work as root on a fresh Debian 12 or 13 machine with only Python installed: the harness
# installs the SLURM, MariaDB, munge, OpenSSH, PostgreSQL and faketime packages it needs.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
HARNESS := $(PYTHON) tests/cluster/harness.py
RELEASES := $(PYTHON) tests/cluster/releases.py

# SLURM=24.11 or SLURM=26.05 (or 22.05 on a Debian 13 machine): the same target on that SLURM release, in a
# Debian tree of the suite that ships it (tests/cluster/releases.py builds it once per machine). Unset: the
# machine's own release.
SLURM ?=
# `make test` also runs the cluster tests that touch what SLURM prints or decides (MATRIX_TESTS) on this
# release, after the full suite on the machine's own (nothing more where the machine runs it itself).
MATRIX_RELEASE ?= 26.05
# About 12 minutes on 2 cores (26.05, in the sid tree): preemption with and without send_user_signal (PreemptParameters
# from 23.02) and the fault login host's three cases run there too (2 minutes of it).
MATRIX_TESTS := \
	tests/cluster/test_submit_watch.py \
	tests/cluster/test_watch_live.py \
	tests/cluster/test_long_trainings.py \
	tests/cluster/test_site_neutral.py \
	tests/cluster/test_example_dags.py \
	tests/cluster/test_job_script_rules.py \
	tests/cluster/faults/test_faults_scheduler.py \
	tests/cluster/faults/test_faults_outages.py::test_slurmdbd_down_past_the_settle_window \
	tests/cluster/faults/test_faults_clock_and_limits.py \
	tests/cluster/faults/test_faults_connection.py \
	tests/cluster/test_hook.py::test_without_a_site_limiter_submissions_go_at_once \
	tests/cluster/test_hook.py::test_a_site_limiter_paces_submissions_and_slowed_queries_stay_unanswered \
	tests/cluster/test_cluster_before_gpu.py::test_preflight_finds_gpu_nodes_without_pyxis_behind_a_login_host_with_it \
	tests/cluster/test_preemption_signal.py \
	tests/cluster/test_hook.py::test_ambiguous_submission_is_reconciled_by_exact_name \
	tests/cluster/test_hook.py::test_async_run_never_repeats_a_command_whose_connection_dropped \
	tests/cluster/test_smoke.py::test_fault_sshd_submits_but_cuts_the_reply

.PHONY: venv cluster-up cluster-down lint docs unit unit-and-packaging shape test matrix matrix-here reliability mutation soak demo bench bench-release bench-release-here clean

$(BIN)/.installed: pyproject.toml
	@$(PYTHON) -c 'import ensurepip' 2>/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $@

venv: $(BIN)/.installed

ifneq ($(SLURM),)
demo test unit lint docs reliability soak bench matrix-here bench-release-here:
	$(RELEASES) run $(SLURM) -- make $@

cluster-up cluster-down:
	$(RELEASES) $(subst cluster-,,$@) $(SLURM)
else
cluster-up:
	$(HARNESS) up

cluster-down:
	$(HARNESS) down

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

docs: venv
	$(BIN)/mkdocs build --strict

unit: venv
	$(BIN)/pytest -n 2 tests/unit

unit-and-packaging: venv
	$(BIN)/pytest -n 2 tests/unit tests/packaging

# The package's shape (issue 50): lines, the largest modules, classes and functions, import cycles, and the files
# the settle, submit and NCCL probe paths run through (three unit tests, traced). Run it before and after a refactor.
shape: venv
	$(BIN)/python tests/shape.py

# The cluster tests in two phases: those that leave the cluster as they found it side by side, on CLUSTER_WORKERS
# workers (their own job names, DAG ids and directories, as tenants of one cluster; most of their time is spent
# waiting on SLURM), then the ones marked `alone` (they stop or restart a daemon, take a node down, change a
# partition or a cluster-wide setting, or hold every GPU of a partition) one at a time. Each session writes its
# share of RELIABILITY.md into RELIABILITY_PARTS; the shares are merged once both phases ran.
CLUSTER_WORKERS ?= 4
CLUSTER_BESIDE = -n $(CLUSTER_WORKERS) -m "not alone and not long_outage"
CLUSTER_ALONE = -m "alone and not long_outage"
RELIABILITY_PARTS := $(CURDIR)/.reliability-parts
PHASES := $(PYTHON) tests/phases.py

# The fastest verdicts first: lint, docs, the unit and packaging tests (pytest-xdist, two workers) and the
# cluster's start side by side (on a fresh machine the start waits on apt and pip more than on the CPU); the
# cluster tests side by side, with the unit tests RELIABILITY.md cites, then alone, while MATRIX_RELEASE's tree
# is prepared in the background (the CPU is idle then); then the matrix. The time of each phase is printed at
# the end, or when one fails.
test: venv
	@$(PHASES) start
	$(PHASES) run "lint, docs, unit tests, cluster up" -- \
		$(MAKE) --no-print-directory -j4 --output-sync=target lint docs unit-and-packaging cluster-up
	rm -rf $(RELIABILITY_PARTS)
	cited=$$($(BIN)/python tests/cluster/reliability_report.py --cited-outside-cluster) && \
		TAO_RELIABILITY_PARTS=$(RELIABILITY_PARTS) $(PHASES) run "cluster tests side by side" -- \
		$(BIN)/pytest $(CLUSTER_BESIDE) tests/cluster $$cited
	$(PHASES) background "$(MATRIX_RELEASE) tree prepared" -- $(RELEASES) prepare $(MATRIX_RELEASE)
	TAO_RELIABILITY_PARTS=$(RELIABILITY_PARTS) $(PHASES) run "cluster tests alone" -- \
		$(BIN)/pytest $(CLUSTER_ALONE) tests/cluster
	$(BIN)/python tests/cluster/reliability_report.py --merge $(RELIABILITY_PARTS)
	$(PHASES) wait "$(MATRIX_RELEASE) tree prepared"
	$(PHASES) run "$(MATRIX_RELEASE) matrix" -- $(MAKE) --no-print-directory matrix
	@$(PHASES) show

# The release-sensitive cluster tests on MATRIX_RELEASE, alone on the machine (its own cluster is stopped).
matrix:
	$(RELEASES) run --not-on-host $(MATRIX_RELEASE) -- make matrix-here

# The requeue stress case (3 to 4 minutes) runs in the full suite on the machine's own release; on MATRIX_RELEASE
# the single requeue tests of test_submit_watch.py cover the same path. The continued training under
# `airflow dags test` (about 100 s) tries Airflow's dag.test(), not SLURM: on MATRIX_RELEASE the slices' SLURM
# side is test_trainings_over_several_slices. The 16-GPU node's whole-node rule (about a minute) reads the node
# shape as the 4-GPU layout test does, which runs there; the earliest start beside a busy partition (about
# 40 s) takes the same path as the earliest start beside a DOWN one, which runs there. Three more read what the
# program prints or writes, not what SLURM does (about 80 s there): hostile and flooding output, TAO's
# status.json, two torchrun rendezvous on one node. Six more try the SSH side alone (about 45 s there): an sshd
# restart under deferred triggers, a poll's connection dropped, the first login host down, and a login host ten
# minutes ahead (the harness's self-check of the skewed and limited login hosts stays, with the 200 sensors
# behind an sshd with default limits).
MATRIX_DESELECT := tests/cluster/test_submit_watch.py::test_requeues_at_random_moments_end_each_watch_once_on_its_true_end \
	tests/cluster/test_long_trainings.py::test_a_continued_training_under_airflow_dags_test \
	tests/cluster/test_site_neutral.py::test_whole_node_follows_the_sixteen_gpu_node_shape \
	tests/cluster/test_long_trainings.py::test_a_training_naming_a_busy_and_a_free_partition_starts_on_the_free_one \
	tests/cluster/test_watch_live.py::test_hostile_and_flooding_output_stays_bounded_readable_and_unforgeable \
	tests/cluster/test_site_neutral.py::test_a_tao_job_is_complete_only_when_status_json_says_success \
	tests/cluster/test_job_script_rules.py::test_two_single_node_torchrun_bundles_on_one_node_both_bind_their_rendezvous \
	tests/cluster/faults/test_faults_connection.py::test_sshd_restart_while_three_triggers_are_deferred \
	tests/cluster/faults/test_faults_connection.py::test_poller_connection_dropped_mid_query \
	tests/cluster/faults/test_faults_connection.py::test_first_login_host_down_the_task_runs_through_the_next \
	tests/cluster/faults/test_faults_clock_and_limits.py::test_a_fresh_conversion_lock_reads_fresh_on_a_login_host_ten_minutes_ahead \
	tests/cluster/faults/test_faults_clock_and_limits.py::test_the_partition_cache_written_a_moment_ago_is_used_on_a_login_host_ten_minutes_ahead \
	tests/cluster/faults/test_faults_clock_and_limits.py::test_a_job_watched_through_a_login_host_ten_minutes_ahead_has_right_windows_and_timestamps

matrix-here: venv cluster-up
	$(BIN)/pytest $(CLUSTER_BESIDE) $(MATRIX_TESTS) $(addprefix --deselect ,$(MATRIX_DESELECT))
	$(BIN)/pytest $(CLUSTER_ALONE) $(MATRIX_TESTS) $(addprefix --deselect ,$(MATRIX_DESELECT))

# RELIABILITY.md from the fault and security suites and the tests they cite, about 15 minutes
# (make test regenerates it too, from the same tests in its full run).
reliability: venv cluster-up
	$(BIN)/python tests/cluster/reliability_report.py

# Mutation testing (issue 49, item 5) of the modules that decide outcomes: job states and their parsing, failure
# classification, partitions and limits, continuation, the resubmission's exclusions. cosmic-ray, one session per
# module, each run only with the unit test files that exercise that module (a few seconds a mutant), one mutant at a
# time at nice 19: about 80 minutes on 2 cores (1472 mutants); not part of `make test`. cosmic-ray writes each mutant
# into the module file itself, so the run works on a copy of the package, its templates and the unit tests in
# MUTATION_DIR, never on this checkout. Left out: `|` mutated into another operator, which here is nearly always a
# type annotation (never evaluated under `from __future__ import annotations`: equivalent mutants). Each module's
# score (killed / run) is printed and kept in MUTATION_DIR/score.txt, its report in <module>.txt (survivors:
# cr-report --surviving-only --show-diff on its .sqlite; cr-report's own percentage counts the left-out mutants).
# MUTATION_MODULES=resources also runs (the limits of core/resources.py), outside the default set. docs/reliability.md
# has the score.
MUTATION_DIR ?= /tmp/tao-slurm-mutation
MUTATION_MODULES ?= states failures partitions continuation resubmission
MUTATION_TESTS_states := tests/unit/core/test_states.py tests/unit/core/test_failures.py \
	tests/unit/core/test_resubmission.py tests/unit/test_slurm_release_forms.py
MUTATION_TESTS_failures := tests/unit/core/test_failures.py tests/unit/core/test_resubmission.py \
	tests/unit/test_slurm_release_forms.py
MUTATION_TESTS_partitions := tests/unit/core/test_partitions.py tests/unit/core/test_resources.py \
	tests/unit/core/test_earliest_start.py tests/unit/core/test_node_shape.py
MUTATION_TESTS_continuation := tests/unit/core/test_continuation.py tests/unit/core/test_earliest_start.py \
	tests/unit/core/test_node_shape.py tests/unit/core/test_request.py tests/unit/test_slurm_release_forms.py
MUTATION_TESTS_resubmission := tests/unit/core/test_resubmission.py
MUTATION_TESTS_resources := tests/unit/core/test_resources.py tests/unit/core/test_partitions.py \
	tests/unit/core/test_requested_gpu_hours.py tests/unit/core/test_node_shape.py tests/unit/test_slurm_release_forms.py
# `python -m pytest` in the copy: the copy's package comes first on sys.path (the editable install points here).
MUTATION_PYTEST = $(abspath $(BIN))/python -m pytest -x -q -p no:cacheprovider $(MUTATION_TESTS_$(1))
# $(call mutation_score,module): mutants, left out, run, killed, survived and killed / run of the module's session.
mutation_score = $(abspath $(BIN))/python -c 'import sqlite3, sys; rows = sqlite3.connect(sys.argv[2]).execute("select \
	worker_outcome, test_outcome from work_results").fetchall(); run = [t for w, t in rows if w == "NORMAL"]; \
	killed, survived = run.count("KILLED"), run.count("SURVIVED"); print(f"{sys.argv[1]}: {len(rows)} mutants, \
	{len(rows) - len(run)} left out, {len(run)} run: {killed} killed, {survived} survived, score \
	{100 * killed / max(len(run), 1):.1f}%")' $(1) ../$(1).sqlite

# $(call mutation_session,module): the module's config, its mutants, the unmutated tests (they must pass, on the
# copy), the run and its report.
define mutation_session
	cd $(MUTATION_DIR)/tree && \
	printf '[cosmic-ray]\nmodule-path = "airflow_provider_tao_slurm/core/$(1).py"\ntimeout = 120.0\nexcluded-modules = []\ntest-command = "$(MUTATION_PYTEST)"\n[cosmic-ray.distributor]\nname = "local"\n[cosmic-ray.filters.operators-filter]\nexclude-operators = ["core/ReplaceBinaryOperator_BitOr_.*"]\n' > ../$(1).toml && \
	$(abspath $(BIN))/cosmic-ray init ../$(1).toml ../$(1).sqlite && \
	$(abspath $(BIN))/cr-filter-operators ../$(1).sqlite ../$(1).toml && \
	$(abspath $(BIN))/python -c 'import os, airflow_provider_tao_slurm.core.$(1) as m; assert m.__file__.startswith(os.getcwd()), m.__file__' && \
	$(MUTATION_PYTEST) > ../$(1).baseline.log && \
	nice -n 19 $(abspath $(BIN))/cosmic-ray exec ../$(1).toml ../$(1).sqlite && \
	$(abspath $(BIN))/cr-report ../$(1).sqlite > ../$(1).txt && \
	$(call mutation_score,$(1)) | tee -a ../score.txt

endef

mutation: export PYTHONDONTWRITEBYTECODE := 1
mutation: venv
	rm -rf $(MUTATION_DIR) && mkdir -p $(MUTATION_DIR)/tree
	tar --exclude=__pycache__ -cf - airflow_provider_tao_slurm templates tests/unit pyproject.toml | tar -xf - -C $(MUTATION_DIR)/tree
	$(foreach module,$(MUTATION_MODULES),$(call mutation_session,$(module)))

# The soak (issue 41): SOAK_TRAININGS trainings over SOAK_MINUTES under a seeded random schedule of real faults,
# checked against SLURM; its table goes into RELIABILITY.md. Not part of `make test`. SOAK_SEED unset: a random seed
# (printed first, with the whole schedule). Run it alone on the cluster.
SOAK_SEED ?=
SOAK_MINUTES ?= 60
SOAK_TRAININGS ?= 40
soak: venv cluster-up
	$(BIN)/python tests/cluster/soak.py --minutes $(SOAK_MINUTES) --trainings $(SOAK_TRAININGS) $(if $(SOAK_SEED),--seed $(SOAK_SEED))

demo: venv cluster-up
	$(BIN)/python tests/cluster/demo.py

# Performance figures against same-run baselines (benchmarks/RESULTS.md); about an hour on 2 cores, of which about
# 10 minutes for restart.py (real triggerers SIGKILLed 5 times per mode at N = 1000) and 17 for bench-release.
# BENCH_RUN (the run's start, UTC) is exported once for the whole run, bench-release's scripts in the 26.05 tree
# included (releases.py passes BENCH_*): each script records it beside the commit it measured and the cluster's
# SLURM release, and report.py labels every table that does not come from this run and commit.
bench: export BENCH_RUN := $(shell date -u +%Y-%m-%dT%H:%M:%SZ)
bench: venv cluster-up
	rm -rf "$${BENCH_OUT:-/tmp/tao-slurm-bench}"
	$(BIN)/python benchmarks/poller.py
	$(BIN)/python benchmarks/restart.py
	$(BIN)/python benchmarks/submit.py
	$(BIN)/python benchmarks/import_parse.py
	$(BIN)/python benchmarks/detect.py
	$(BIN)/python benchmarks/logs.py
	$(BIN)/python benchmarks/markers.py
	$(BIN)/python benchmarks/shared_streams.py
	$(BIN)/python benchmarks/storm.py
	$(BIN)/python benchmarks/earliest_start.py
	$(MAKE) bench-release
	$(BIN)/python benchmarks/report.py

# The poller at N = 1000, the submit ratio (one and back to back) and the storm again on MATRIX_RELEASE (26.05, in
# the sid tree, alone on the machine), then the submit ratio and the storm with slurmctld's RPC rate limit on
# (BENCH_RATE_LIMIT: rl_enable at SLURM's default bucket; each script turns it off again at its end, whatever
# happens); about 17 minutes. Stored as poller@26.05.json, submit@26.05.json, storm@26.05.json,
# submit@26.05-rl.json and storm@26.05-rl.json in BENCH_OUT: report.py sets them beside the machine's own (the
# rate-limited ones beside the same release's without the limit). The tree writes under the checkout (its /tmp is
# its own).
BENCH_RATE_LIMIT ?= rl_enable,rl_bucket_size=30,rl_refill_rate=2
bench-release:
	rm -rf .bench-release
	BENCH_OUT=$(CURDIR)/.bench-release $(RELEASES) run --not-on-host $(MATRIX_RELEASE) -- make bench-release-here
	if [ -d .bench-release ]; then mkdir -p "$${BENCH_OUT:-/tmp/tao-slurm-bench}" && \
		cp .bench-release/*.json "$${BENCH_OUT:-/tmp/tao-slurm-bench}/"; fi

bench-release-here: venv cluster-up
	$(BIN)/python benchmarks/poller.py --sizes 1000 --scale-sizes ""
	$(BIN)/python benchmarks/submit.py
	$(BIN)/python benchmarks/storm.py
	$(BIN)/python benchmarks/submit.py --rate-limit $(BENCH_RATE_LIMIT)
	$(BIN)/python benchmarks/storm.py --rate-limit $(BENCH_RATE_LIMIT)

clean: cluster-down
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site
endif

"""The provider's own pacing of slurmctld RPCs: a token bucket per cluster user, kept on the login host.

Since SLURM 23.02 a site may enable ``rl_enable``: slurmctld gives each user a bucket of RPC tokens
(30 by default, refilled 2 per second) and refuses an RPC that finds it empty; the client command sleeps
and sends it again. A sweep of 40 trainings submitting at once sends about 200 RPCs within a minute and
would empty the user's bucket, and every other command of that user (an ``squeue`` typed in a terminal)
would wait with it. So the provider spaces its own submissions with a bucket of its own, smaller than
SLURM's default: a submission takes its RPCs' tokens before it sends any, and waits while the bucket is
spent.

The bucket must be one for every Airflow worker of the user, whichever host runs it, so it lives on the
login host: a two-number file (tokens, time of the last take) in the user's home, updated under
``flock``. The take is a reservation: it may leave the bucket below zero, and the taker sleeps until its
tokens are refilled, so the lock is held for a moment only and the waiting submissions go in the order
they took. Pacing is a courtesy to the scheduler and never a reason to fail: when the file cannot be
used (a read-only home, no ``flock``) the submission goes at once.
"""

from __future__ import annotations

#: slurmctld RPCs of the cluster user that one submission causes, counted with ``sdiag`` on the test
#: cluster: the submitting round trip sends 5 (sbatch: ``REQUEST_FED_INFO``, ``REQUEST_PARTITION_INFO``,
#: ``REQUEST_SUBMIT_BATCH_JOB``; the duplicate check: ``REQUEST_JOB_USER_INFO``; the release:
#: ``REQUEST_UPDATE_JOB``), and the job's container step, once the job starts, 2 more as the same user
#: (srun: ``REQUEST_HET_JOB_ALLOC_INFO``, ``REQUEST_JOB_STEP_CREATE``). The submission pays for all 7.
SUBMISSION_RPCS = 7

#: The longest one submission waits for its tokens; past it, it goes (and a site's own limiter paces it).
MAX_PACING_WAIT_S = 120.0

#: The stderr line a paced command prints when it waited: this prefix, then the seconds.
PACED_PREFIX = "#paced "

#: The bucket's file and lock, under the cluster user's home.
PACING_DIR = ".tao-slurm"
PACING_FILE = "rpc-bucket"

# Reads "tokens stamp" on stdin (nothing: a full bucket), refills, takes ``cost``, writes the new state
# to ``out`` and prints the seconds to wait. A stamp ahead of this host's clock (another login host's)
# refills nothing.
_TAKE = (
    "NR == 1 { tokens = $1 + 0; stamp = $2 + 0; seen = 1 } "
    "END { if (!seen) { tokens = size; stamp = now } "
    "elapsed = now - stamp; if (elapsed < 0) elapsed = 0; else stamp = now; "
    "tokens += elapsed * rate; if (tokens > size) tokens = size; tokens -= cost; "
    "if (tokens < -max * rate) tokens = -max * rate; "
    'printf "%.6f %.6f\\n", tokens, stamp > out; '
    'printf "%.3f\\n", tokens < 0 ? -tokens / rate : 0 }'
)


def rpc_pacing(cost: int, bucket_size: int, refill_rate: float, max_wait: float = MAX_PACING_WAIT_S) -> str:
    """Shell that takes ``cost`` tokens from the cluster user's RPC bucket and sleeps until they are there.

    Put it first in the round trip whose RPCs it pays for. It always succeeds (see the module's text).
    When it waited, it prints :data:`PACED_PREFIX` and the seconds on stderr (read them with
    :func:`parse_paced`).

    :param cost: the RPCs the paced command sends (e.g. :data:`SUBMISSION_RPCS`).
    :param bucket_size: tokens the bucket holds: the RPCs that may go at once.
    :param refill_rate: tokens added per second; 0 means no pacing (the empty string is returned).
    :param max_wait: the longest the command waits.
    :returns: a shell fragment ending in ``;`` (or nothing).
    :raises ValueError: for a cost or bucket below 1, or a negative rate or wait.
    """
    if cost < 1 or bucket_size < 1 or refill_rate < 0 or max_wait < 0:
        raise ValueError(f"bad pacing: cost {cost}, bucket {bucket_size}, rate {refill_rate}, wait {max_wait}")
    if refill_rate == 0:
        return ""
    take = (
        f'awk -v now="$(date +%s.%N)" -v cost={cost:d} -v size={bucket_size:d} -v rate={refill_rate!r} '
        f"-v max={max_wait!r} -v out=\"$_pd/{PACING_FILE}\" '{_TAKE}'"
    )
    return (
        f'{{ _pd="$HOME/{PACING_DIR}"; mkdir -p -- "$_pd" && '
        f'_pw=$( ( flock -w 30 9 || exit 1; cat -- "$_pd/{PACING_FILE}" 2>/dev/null | {take} ) '
        f'9>>"$_pd/{PACING_FILE}.lock" ) && sleep "$_pw"; }} 2>/dev/null || true; '
        f"case ${{_pw:-0}} in 0|0.000) ;; *) printf '%s%s\\n' '{PACED_PREFIX}' \"$_pw\" >&2;; esac; "
    )


def parse_paced(stderr: str) -> tuple[float, str]:
    """Split a paced command's stderr: the seconds it waited for its tokens (0: none), and the rest."""
    waited, rest = 0.0, []
    for line in stderr.splitlines(keepends=True):
        if line.startswith(PACED_PREFIX):
            try:
                waited = float(line[len(PACED_PREFIX) :])
            except ValueError:
                rest.append(line)
        else:
            rest.append(line)
    return waited, "".join(rest)

"""The provider's own pacing of slurmctld RPCs: a token bucket per cluster user, kept on the login host.

Since SLURM 23.02 a site may enable ``rl_enable`` (in ``SlurmctldParameters``): slurmctld gives each user
a bucket of RPC tokens (``rl_bucket_size``, 30 by default, refilled ``rl_refill_rate`` tokens every
``rl_refill_period`` seconds, 2 per 1 s by default) and refuses an RPC that finds it empty; the client
command sleeps and sends it again, longer at each refusal from 24.05. A sweep of 40 trainings submitting at
once sends about 200 RPCs within a minute and would empty the user's bucket, and every other command of
that user (an ``squeue`` typed in a terminal) would wait with it. So where the site limits RPCs, the
provider spaces its own submissions with a bucket of its own, four fifths of the site's: a submission takes
its RPCs' tokens before it sends any, and waits while the bucket is spent. Where the site does not limit
them, submissions go at once.

The site's limiter is read from ``scontrol show config`` on the login host, in the submitting round trip
itself, and kept for :data:`LIMITS_CACHE_S` seconds beside the bucket (one ``REQUEST_BUILD_INFO`` RPC per
cluster user every 10 minutes). A connection may set the bucket's figures instead (``rpc_bucket_size``,
``rpc_refill_rate``): each figure it sets is used as given, a refill rate set pacing whatever the site
does, and a refill rate of 0 never pacing.

The same ``scontrol`` call keeps the site's preemption settings in a second file beside it
(:data:`PREEMPTION_FILE`), which :func:`site_config` reads: a continued training's submission learns
whether preemption sends the batch shell its warning (:mod:`~airflow_provider_tao_slurm.core.preemption`)
without asking slurmctld again.

The bucket must be one for every Airflow worker of the user, whichever host runs it, so it lives on the
login host: a two-number file (tokens, time of the last take) in the user's home, updated under
``flock``. The take is a reservation: it may leave the bucket below zero, and the taker sleeps until its
tokens are refilled, so the lock is held for a moment only and the waiting submissions go in the order
they took. Pacing is a courtesy to the scheduler and never a reason to fail: when the file cannot be
used (a read-only home, no ``flock``) or the site's configuration cannot be read (then nothing is cached
and the next submission asks again), the submission goes at once.
"""

from __future__ import annotations

from typing import NamedTuple

from airflow_provider_tao_slurm.core.preemption import CONFIG_KEYS

#: slurmctld RPCs of the cluster user that one submission causes, counted with ``sdiag`` on the test
#: cluster: the submitting round trip sends 5 (sbatch: ``REQUEST_FED_INFO``, ``REQUEST_PARTITION_INFO``,
#: ``REQUEST_SUBMIT_BATCH_JOB``; the duplicate check: ``REQUEST_JOB_USER_INFO``; the release:
#: ``REQUEST_UPDATE_JOB``), and the job's container step, once the job starts, 2 more as the same user
#: (srun: ``REQUEST_HET_JOB_ALLOC_INFO``, ``REQUEST_JOB_STEP_CREATE``). The submission pays for all 7.
#: The job's end asks slurmctld nothing unless a signal reached its step or its batch shell (a cancel, a
#: requeue, a preemption, a slice's warning; the batch shell reads the step's note of a ``SIGTERM`` in the job
#: directory, no RPC). Then it asks ``scontrol --local show job`` (one RPC, ``REQUEST_JOB_INFO_SINGLE``; without
#: ``--local`` scontrol first asks for the federation, ``REQUEST_FED_INFO``): once whether a
#: preemption is under way (where the batch shell itself got no ``SIGTERM``) and again every 5 s while one is.
#: A ``secret_env`` job asks once more at its end, signalled or not, whether SLURM will run it again (its
#: sidecar: a node failure can end the step before SLURM's signal reaches the shell). The job sends those
#: from its node, unpaced: a submission pays for none of them.
SUBMISSION_RPCS = 7

#: The longest one submission waits for its tokens; past it, it goes (and a site's own limiter paces it).
MAX_PACING_WAIT_S = 120.0

#: The provider's share of the site's bucket and refill rate, the rest left to the user's other commands.
SITE_SHARE = 0.8

#: The provider's bucket where a connection sets a refill rate but no size and the site has no limiter.
FALLBACK_BUCKET_SIZE = 24

#: How long one reading of the site's ``SlurmctldParameters`` serves the cluster user's submissions.
LIMITS_CACHE_S = 600

#: The stderr line a paced command prints when it waited: this prefix, the seconds, then why.
PACED_PREFIX = "#paced "

#: The bucket's file and lock, and the site's cached ``SlurmctldParameters``, under the cluster user's home.
PACING_DIR = ".tao-slurm"
PACING_FILE = "rpc-bucket"
LIMITS_FILE = "slurmctld-parameters"
#: The site's preemption settings (and SlurmctldParameters) as ``scontrol show config`` printed them, read
#: with the same ``scontrol`` call: a stamp line, then the ``Key = value`` lines.
PREEMPTION_FILE = "slurmctld-preemption"

# Reads the site's limiter from ``site`` (SlurmctldParameters' value), the figures the connection gave
# (``size``/``rate``, empty: the site's share) and "tokens stamp" on stdin (nothing: a full bucket). Where
# nothing paces, writes nothing and prints 0; else refills, takes ``cost``, writes the new state to ``out``
# and prints the seconds to wait and why. A stamp ahead of this host's clock (another login host's)
# refills nothing.
_TAKE = (
    'BEGIN { on = 0; ss = 30; sr = 2; sp = 1; n = split(site, kv, ","); '
    'for (i = 1; i <= n; i++) { split(kv[i], p, "="); k = p[1]; gsub(/ /, "", k); '
    'if (k == "rl_enable") on = 1; else if (k == "rl_bucket_size") ss = p[2] + 0; '
    'else if (k == "rl_refill_rate") sr = p[2] + 0; else if (k == "rl_refill_period") sp = p[2] + 0 } '
    "if (sp <= 0) sp = 1; "
    'if (on) why = sprintf("the site limits RPCs (rl_enable: bucket %d, %g per %g s)", ss, sr, sp); '
    'else why = "rpc_refill_rate set on the connection"; '
    'if (rate == "") { if (!on || sr <= 0) off = 1; else rate = share * sr / sp } '
    'if (size == "") { size = on ? int(share * ss) : dsize; if (size < 1) size = 1 } '
    "size += 0; rate += 0; if (rate <= 0) off = 1; "
    'why = sprintf("%s; the provider paces at a bucket of %d, %g per s", why, size, rate) } '
    "NR == 1 { tokens = $1 + 0; stamp = $2 + 0; seen = 1 } "
    "END { if (off) { print 0; exit } if (!seen) { tokens = size; stamp = now } "
    "elapsed = now - stamp; if (elapsed < 0) elapsed = 0; else stamp = now; "
    "tokens += elapsed * rate; if (tokens > size) tokens = size; tokens -= cost; "
    "if (tokens < -max * rate) tokens = -max * rate; "
    'printf "%.6f %.6f\\n", tokens, stamp > out; '
    'printf "%.3f %s\\n", tokens < 0 ? -tokens / rate : 0, why }'
)

# Reads the site's configuration lines that matter here (SlurmctldParameters and the preemption settings) into
# $_sc, SlurmctldParameters' value into $_sp, and caches both under $_pd (with this host's clock) when scontrol
# printed the SlurmctldParameters line: one REQUEST_BUILD_INFO serves the pacing and the preemption read.
_READ = (
    "_sc=$(scontrol show config 2>/dev/null | awk '/^({keys}) *=/'); "
    "_sp=$(printf '%s\\n' \"$_sc\" | sed -n 's/^SlurmctldParameters *= *//p'); "
    'if [ -n "$_sp" ]; then printf \'%s\\n%s\\n\' "$_now" "$_sp" > "$_cf.$$" && mv -f -- "$_cf.$$" "$_cf"; '
    'printf \'%s\\n%s\\n\' "$_now" "$_sc" > "$_pf.$$" && mv -f -- "$_pf.$$" "$_pf"; fi; '
    'rm -f -- "$_cf.$$" "$_pf.$$"; '
)

# Prints the site's SlurmctldParameters into $_sp: from the cache while it is fresh (by this host's clock; a
# stamp in the future is stale), else from scontrol (:data:`_READ`).
_SITE = (
    '{{ _cf="$_pd/{limits}"; _pf="$_pd/{preemption}"; '
    '_sp=$(awk -v now="$_now" \'NR == 1 {{ s = $1 + 0 }} NR == 2 {{ p = $0 }} '
    'END {{ if (NR == 2 && s <= now && now - s < {age:d}) print p; else exit 1 }}\' "$_cf" 2>/dev/null) || '
    "{{ {read}}}; }}"
)

# Prints the cached configuration lines while they are fresh, else reads them (:data:`_READ`) and prints them;
# exits 1 when scontrol printed none.
_CONFIG = (
    '_pd="$HOME/{dir}"; _now=$(date +%s.%N); _cf="$_pd/{limits}"; _pf="$_pd/{preemption}"; '
    'awk -v now="$_now" \'NR == 1 {{ s = $1 + 0; next }} {{ l = l $0 "\\n" }} '
    'END {{ if (NR > 1 && s <= now && now - s < {age:d}) printf "%s", l; else exit 1 }}\' "$_pf" 2>/dev/null || '
    '{{ mkdir -p -- "$_pd" 2>/dev/null; {read}[ -n "$_sc" ] && printf \'%s\\n\' "$_sc"; }}'
)


class Paced(NamedTuple):
    """A paced command's stderr, split: the seconds it waited (0: none), why, and the other lines."""

    waited: float
    reason: str
    rest: str


def rpc_pacing(
    cost: int,
    bucket_size: int | None = None,
    refill_rate: float | None = None,
    max_wait: float = MAX_PACING_WAIT_S,
) -> str:
    """Shell that takes ``cost`` tokens from the cluster user's RPC bucket and sleeps until they are there.

    Put it first in the round trip whose RPCs it pays for. It always succeeds (see the module's text).
    When it waited, it prints :data:`PACED_PREFIX`, the seconds and why on stderr (read them with
    :func:`parse_paced`).

    :param cost: the RPCs the paced command sends (e.g. :data:`SUBMISSION_RPCS`).
    :param bucket_size: tokens the bucket holds (the RPCs that may go at once); None: :data:`SITE_SHARE` of
        the site's ``rl_bucket_size`` (:data:`FALLBACK_BUCKET_SIZE` where the site has no limiter and
        ``refill_rate`` is given).
    :param refill_rate: tokens added per second; None: :data:`SITE_SHARE` of the site's refill where
        ``rl_enable`` is on, no pacing where it is off; 0: no pacing (the empty string is returned).
    :param max_wait: the longest the command waits.
    :returns: a shell fragment ending in ``;`` (or nothing).
    :raises ValueError: for a cost or bucket below 1, or a negative rate or wait.
    """
    if cost < 1 or (bucket_size is not None and bucket_size < 1):
        raise ValueError(f"bad pacing: cost {cost}, bucket {bucket_size}, rate {refill_rate}, wait {max_wait}")
    if (refill_rate is not None and refill_rate < 0) or max_wait < 0:
        raise ValueError(f"bad pacing: cost {cost}, bucket {bucket_size}, rate {refill_rate}, wait {max_wait}")
    if refill_rate == 0:
        return ""
    size = "" if bucket_size is None else f"{bucket_size:d}"
    rate = "" if refill_rate is None else repr(float(refill_rate))
    site = _site(_SITE, LIMITS_CACHE_S) if bucket_size is None or refill_rate is None else ":"
    take = (
        f'awk -v now="$_now" -v cost={cost:d} -v size="{size}" -v rate="{rate}" -v dsize={FALLBACK_BUCKET_SIZE:d} '
        f'-v share={SITE_SHARE!r} -v site="$_sp" -v max={max_wait!r} -v out="$_pd/{PACING_FILE}" \'{_TAKE}\''
    )
    return (
        f'{{ _pd="$HOME/{PACING_DIR}"; _sp=; _po=; _pw=; mkdir -p -- "$_pd" && _now=$(date +%s.%N) && {site} && '
        f'_po=$( ( flock -w 30 9 || exit 1; cat -- "$_pd/{PACING_FILE}" 2>/dev/null | {take} ) '
        f'9>>"$_pd/{PACING_FILE}.lock" ) && _pw=${{_po%% *}} && sleep "$_pw"; }} 2>/dev/null || true; '
        f"case ${{_pw:-0}} in 0|0.000) ;; *) printf '%s%s\\n' '{PACED_PREFIX}' \"$_po\" >&2;; esac; "
    )


def site_config(max_age: int = LIMITS_CACHE_S) -> str:
    """Shell that prints the site's preemption settings and ``SlurmctldParameters`` (``scontrol show config`` lines).

    It answers from the cache the pacing keeps beside the bucket while it is younger than ``max_age`` seconds,
    else asks ``scontrol`` and refreshes the cache for both (read it with
    :func:`~airflow_provider_tao_slurm.core.preemption.parse_preemption`). It exits 1 when ``scontrol``
    printed nothing.

    :param max_age: the oldest cache used, in seconds (0: always ask ``scontrol``).
    :raises ValueError: for a negative age.
    """
    if max_age < 0:
        raise ValueError(f"bad cache age: {max_age}")
    return _site(_CONFIG, max_age)


def _site(template: str, age: int) -> str:
    """Fill a template that reads the site's configuration (:data:`_SITE`, :data:`_CONFIG`)."""
    read = _READ.format(keys="|".join(CONFIG_KEYS))
    return template.format(dir=PACING_DIR, limits=LIMITS_FILE, preemption=PREEMPTION_FILE, age=age, read=read)


def parse_paced(stderr: str) -> Paced:
    """Split a paced command's stderr: the seconds it waited for its tokens (0: none), why, and the rest."""
    waited, reason, rest = 0.0, "", []
    for line in stderr.splitlines(keepends=True):
        if line.startswith(PACED_PREFIX):
            seconds, _, why = line[len(PACED_PREFIX) :].rstrip("\n").partition(" ")
            try:
                waited, reason = float(seconds), why
            except ValueError:
                rest.append(line)
        else:
            rest.append(line)
    return Paced(waited, reason, "".join(rest))

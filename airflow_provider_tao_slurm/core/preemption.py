"""What the site's preemption does to a running job, read from ``scontrol show config`` (pure: no I/O).

A preempted job's batch shell gets its ``--signal`` warning (a slice's ``B:USR1@<grace>``) at preemption only
where the site sends the user signal: ``PreemptParameters=send_user_signal`` (SLURM 23.02 on), or
``SlurmctldParameters=preempt_send_user_signal`` (SLURM 22.05 knows only this spelling; later releases read
both). Elsewhere preemption gives the job's steps ``SIGTERM`` (at once, or when the partition's preemption
``GraceTime`` starts) and nothing to the batch shell before it ends the job. What that means for a training is
on the docs' "Long trainings" page ("Preemption"); the continuation rules never rely on the warning.
"""

from __future__ import annotations

from dataclasses import dataclass

from airflow_provider_tao_slurm.exceptions import RemoteCommandError

#: The ``scontrol show config`` keys read (``PreemptParameters`` is absent before SLURM 23.02).
CONFIG_KEYS = ("PreemptType", "PreemptMode", "PreemptParameters", "SlurmctldParameters")
#: ``PreemptType`` of a site that never preempts.
NO_PREEMPTION = "preempt/none"


@dataclass(frozen=True)
class SitePreemption:
    """The site's preemption settings.

    :param preempt_type: ``PreemptType`` (``preempt/none``, ``preempt/partition_prio``, ``preempt/qos``).
    :param mode: ``PreemptMode`` (``OFF``, ``CANCEL``, ``REQUEUE``, ``SUSPEND,GANG``, ...).
    :param parameters: ``PreemptParameters`` (empty where unset or where the release has none).
    :param slurmctld_parameters: ``SlurmctldParameters`` (empty where unset).
    """

    preempt_type: str
    mode: str
    parameters: str = ""
    slurmctld_parameters: str = ""

    @property
    def preempts(self) -> bool:
        """Whether the site preempts jobs at all (a preemption plugin, and a mode other than ``OFF``)."""
        return self.preempt_type not in ("", NO_PREEMPTION) and self.mode.upper() != "OFF"

    @property
    def warns_batch_shell(self) -> bool:
        """Whether a preempted job's batch shell gets its ``--signal`` warning (``send_user_signal``)."""
        return "send_user_signal" in _words(self.parameters) or "preempt_send_user_signal" in _words(
            self.slurmctld_parameters
        )

    @property
    def setting(self) -> str:
        """The setting that decides the warning, as slurm.conf writes it (for messages)."""
        if "preempt_send_user_signal" in _words(self.slurmctld_parameters):
            return "SlurmctldParameters=preempt_send_user_signal"
        return f"PreemptParameters={self.parameters or '(none)'}"

    def describe(self) -> str:
        """One line: whether preemption warns the batch shell, and what a training can rely on."""
        settings = f"PreemptType={self.preempt_type}, PreemptMode={self.mode}"
        if not self.preempts:
            return f"the site does not preempt jobs ({settings})"
        if self.warns_batch_shell:
            return (
                f"preemption sends the batch shell its --signal warning ({settings}, {self.setting}): a slice's "
                "checkpoint_signal reaches the program when it is preempted too"
            )
        return (
            f"preemption does not warn the batch shell ({settings}, no send_user_signal): the job's steps get "
            "SIGTERM and checkpoint_signal comes only before the time limit, so a training must checkpoint "
            "periodically"
        )


def parse_preemption(text: str) -> SitePreemption:
    """Read the preemption settings from ``scontrol show config`` lines (``Key = value``; others ignored).

    ``(null)`` reads as empty.

    :raises RemoteCommandError: when ``PreemptType`` or ``PreemptMode`` is missing (the reply is not a
        configuration), naming the text.
    """
    found: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() in CONFIG_KEYS:
            found[key.strip()] = "" if value.strip() == "(null)" else value.strip()
    if "PreemptType" not in found or "PreemptMode" not in found:
        raise RemoteCommandError(
            f"scontrol show config printed no PreemptType and PreemptMode lines ({text.strip()[-300:]!r}); the "
            "site's preemption settings cannot be read"
        )
    return SitePreemption(
        preempt_type=found["PreemptType"],
        mode=found["PreemptMode"],
        parameters=found.get("PreemptParameters", ""),
        slurmctld_parameters=found.get("SlurmctldParameters", ""),
    )


def unsignalled_preemption(site: SitePreemption, checkpoint_signal: str | None) -> str | None:
    """Return the warning for a training with ``checkpoint_signal`` on a site whose preemption will not send it.

    :returns: the message, or ``None`` when there is nothing to say (no signal asked, no preemption, or
        the site sends the user signal at preemption).
    """
    if checkpoint_signal is None or not site.preempts or site.warns_batch_shell:
        return None
    return (
        f"checkpoint_signal={checkpoint_signal}: this site preempts jobs (PreemptType={site.preempt_type}, "
        f"PreemptMode={site.mode}) without send_user_signal, so a preempted slice gets no SIG{checkpoint_signal} "
        "(its steps get SIGTERM); only the time-limit warning sends it. The program must checkpoint periodically "
        "(TAO's checkpoint interval): a preempted slice resumes from its last checkpoint"
    )


def _words(value: str) -> set[str]:
    """Return the comma-separated words of a parameters value."""
    return {word.strip() for word in value.split(",") if word.strip()}

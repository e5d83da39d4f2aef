"""The site's preemption settings, read from ``scontrol show config`` (issue 42, item 6)."""

from __future__ import annotations

import pytest

from airflow_provider_tao_slurm.core.preemption import SitePreemption, parse_preemption, unsignalled_preemption
from airflow_provider_tao_slurm.exceptions import RemoteCommandError

#: ``scontrol show config`` lines of SLURM 22.05 (no PreemptParameters line) and of a later release.
CONFIG_2205 = (
    "PreemptMode             = REQUEUE\nPreemptType             = preempt/partition_prio\n"
    "PreemptExemptTime       = 00:00:00\nSlurmctldParameters     = {ctld}\n"
)
CONFIG_LATER = (
    "PreemptMode             = REQUEUE\nPreemptParameters       = {params}\nPreemptType             = preempt/qos\n"
    "SlurmctldParameters     = {ctld}\n"
)


@pytest.mark.parametrize(
    ("text", "preempts", "warns"),
    [
        (CONFIG_2205.format(ctld="(null)"), True, False),
        (CONFIG_2205.format(ctld="preempt_send_user_signal"), True, True),  # 22.05's spelling
        (CONFIG_2205.format(ctld="enable_configless,preempt_send_user_signal"), True, True),
        (CONFIG_2205.format(ctld="preempt_send_user_signal_x"), True, False),  # a word, not a substring
        (CONFIG_LATER.format(params="(null)", ctld="(null)"), True, False),
        (CONFIG_LATER.format(params="send_user_signal", ctld="(null)"), True, True),
        (CONFIG_LATER.format(params="strict_order,send_user_signal", ctld="(null)"), True, True),
        (CONFIG_LATER.format(params="(null)", ctld="preempt_send_user_signal"), True, True),  # old spelling read too
        (CONFIG_LATER.format(params="youngest_first", ctld="rl_enable"), True, False),
        ("PreemptMode = OFF\nPreemptType = preempt/none\nSlurmctldParameters = (null)\n", False, False),
        ("PreemptMode = OFF\nPreemptType = preempt/partition_prio\n", False, False),
        ("PreemptMode = REQUEUE\nPreemptType = preempt/none\n", False, False),
    ],
    ids=[
        "2205-none",
        "2205-send",
        "2205-send-among-others",
        "2205-other-word",
        "later-none",
        "later-send",
        "later-send-among-others",
        "later-old-spelling",
        "later-other-words",
        "no-preemption",
        "mode-off",
        "type-none",
    ],
)
def test_parse_preemption(text: str, preempts: bool, warns: bool) -> None:
    site = parse_preemption(text)
    assert (site.preempts, site.warns_batch_shell) == (preempts, warns)
    said = site.describe()
    assert ("does not preempt" in said, "sends the batch shell" in said) == (not preempts, preempts and warns)


def test_null_reads_as_empty() -> None:
    site = parse_preemption(CONFIG_LATER.format(params="(null)", ctld="(null)"))
    assert site == SitePreemption("preempt/qos", "REQUEUE", "", "")
    assert site.setting == "PreemptParameters=(none)"
    assert parse_preemption(CONFIG_2205.format(ctld="preempt_send_user_signal")).setting == (
        "SlurmctldParameters=preempt_send_user_signal"
    )


@pytest.mark.parametrize(
    "text",
    ["", "slurm_load_ctl_conf error: Unable to contact slurm controller", "PreemptMode = REQUEUE\n"],
    ids=["empty", "an-error", "no-type"],
)
def test_a_reply_without_the_settings_is_an_error(text: str) -> None:
    with pytest.raises(RemoteCommandError, match="PreemptType and PreemptMode"):
        parse_preemption(text)


@pytest.mark.parametrize(
    ("text", "signal", "said"),
    [
        (CONFIG_2205.format(ctld="(null)"), "USR1", True),
        (CONFIG_2205.format(ctld="(null)"), None, False),  # no checkpoint_signal: nothing to say
        (CONFIG_2205.format(ctld="preempt_send_user_signal"), "USR1", False),
        (CONFIG_LATER.format(params="send_user_signal", ctld="(null)"), "USR2", False),
        ("PreemptMode = OFF\nPreemptType = preempt/none\n", "USR1", False),  # the site never preempts
    ],
    ids=["no-send", "no-signal", "2205-send", "later-send", "no-preemption"],
)
def test_unsignalled_preemption(text: str, signal: str | None, said: bool) -> None:
    note = unsignalled_preemption(parse_preemption(text), signal)
    assert (note is not None) == said
    if note is not None:
        assert f"checkpoint_signal={signal}" in note
        assert "checkpoint periodically" in note

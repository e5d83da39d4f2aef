"""Which nodes an infrastructure resubmission avoids, and what the partition keeps (pure, table-driven)."""

from __future__ import annotations

import pytest

from airflow_provider_tao_slurm.core.commands import NodeRow, parse_node_states
from airflow_provider_tao_slurm.core.failures import Classification
from airflow_provider_tao_slurm.core.resubmission import Exclusion, nodes_to_exclude, remaining_nodes
from airflow_provider_tao_slurm.core.states import ErrClass, JobState, state_from_native

ALL_UP = "n1|polar*|idle\nn2|polar*|mix\nn3|polar*|alloc\nn21|polar*|idle\n"


def failed(native: str = "NODE_FAIL") -> JobState:
    return state_from_native("500", native, source="sacct", exit_code=1, signal=0, node_list="n[1-3]")


def verdict(evidence: str) -> Classification:
    return Classification(ErrClass.ERR_INFRA, "infrastructure failure", evidence, True)


def rows(text: str) -> list[NodeRow]:
    return parse_node_states(text)


@pytest.mark.parametrize(
    ("native", "evidence", "allocation", "sinfo", "expected"),
    [
        pytest.param(
            "NODE_FAIL",
            "State=NODE_FAIL",
            ["n1", "n2", "n3"],
            "n1|polar*|idle\nn2|polar*|down*\nn3|polar*|idle\n",
            ("n2",),
            id="node-fail-only-the-node-now-down",
        ),
        pytest.param(
            "NODE_FAIL",
            "State=NODE_FAIL",
            ["n1", "n2", "n3"],
            "n1|polar*|idle\nn2|polar*|drain\nn3|polar*|idle\n",
            ("n2",),
            id="node-fail-drained-node",
        ),
        pytest.param(
            "BOOT_FAIL",
            "State=BOOT_FAIL",
            ["n1", "n2", "n3"],
            "n3|polar*|fail\nn1|polar*|down\nn2|polar*|idle\n",
            ("n1", "n3"),
            id="boot-fail-several-in-allocation-order",
        ),
        pytest.param(
            "NODE_FAIL",
            "State=NODE_FAIL",
            ["n1", "n2"],
            "n1|gpu|idle\nn2|gpu|idle\nn2|debug*|down*\n",
            ("n2",),
            id="down-in-any-partition",
        ),
        pytest.param(
            "NODE_FAIL",
            "State=NODE_FAIL",
            ["n1", "n2", "n3"],
            ALL_UP,
            ("n1", "n2", "n3"),
            id="node-fail-nothing-down-nothing-named-whole-allocation",
        ),
        pytest.param(
            "NODE_FAIL",
            "line 4: slurmstepd: error: node n3 not responding",
            ["n1", "n2", "n3"],
            ALL_UP,
            ("n3",),
            id="node-fail-nothing-down-evidence-names-one",
        ),
        pytest.param(
            "FAILED",
            "line 12: NVRM: Xid (PCI:0000:3b:00) on n2: 79, GPU has fallen off the bus",
            ["n1", "n2", "n21"],
            "n1|polar*|down*\n" + ALL_UP,
            ("n2",),
            id="evidence-names-n2-not-n21-and-rows-ignored-for-non-node-fail",
        ),
        pytest.param(
            "FAILED",
            "line 3: n21: NCCL WARN NET/IB : Got completion with error 12",
            ["n2", "n21"],
            ALL_UP,
            ("n21",),
            id="evidence-names-n21-not-n2",
        ),
        pytest.param(
            "FAILED",
            "line 3: [n2] NCCL WARN transport error, peer n3.",
            ["n1", "n2", "n3"],
            ALL_UP,
            ("n2", "n3"),
            id="evidence-names-two-with-punctuation",
        ),
        pytest.param(
            "FAILED",
            "line 9: NCCL WARN NET/IB : Got completion with error 12",
            ["n1", "n2"],
            ALL_UP,
            ("n1", "n2"),
            id="nothing-named-whole-allocation",
        ),
        pytest.param(
            "FAILED",
            "line 9: failed on n2-ib0 and gpu-n1",
            ["n1", "n2"],
            ALL_UP,
            ("n1", "n2"),
            id="longer-names-containing-a-node-do-not-name-it",
        ),
        pytest.param(
            "NODE_FAIL",
            "State=NODE_FAIL",
            ["n2", "n2", "n3"],
            "n2|polar*|down*\nn3|polar*|idle\n",
            ("n2",),
            id="duplicates-in-allocation",
        ),
        pytest.param("NODE_FAIL", "State=NODE_FAIL on n2", [], ALL_UP, (), id="no-allocation-nothing"),
    ],
)
def test_nodes_to_exclude(
    native: str, evidence: str, allocation: list[str], sinfo: str, expected: tuple[str, ...]
) -> None:
    exclusion = nodes_to_exclude(failed(native), verdict(evidence), allocation, rows(sinfo))
    assert isinstance(exclusion, Exclusion)
    assert exclusion.nodes == expected
    assert exclusion.why


def test_a_controller_outage_excludes_no_node() -> None:
    outage = Classification(
        ErrClass.ERR_INFRA, "srun could not reach slurmctld", "line 4: srun: error: Unable to confirm", True, False
    )
    exclusion = nodes_to_exclude(failed("FAILED"), outage, ["n1", "n2"], rows(ALL_UP))
    assert exclusion.nodes == ()
    assert exclusion.why == "the evidence shows no node at fault (line 4: srun: error: Unable to confirm)"


def test_exclusion_says_why() -> None:
    down = nodes_to_exclude(failed(), verdict("State=NODE_FAIL"), ["n1", "n2"], rows("n2|p|down*\nn1|p|idle\n"))
    named = nodes_to_exclude(failed("FAILED"), verdict("line 1: Xid on n1"), ["n1", "n2"], rows(ALL_UP))
    whole = nodes_to_exclude(failed("FAILED"), verdict("line 1: NCCL error"), ["n1", "n2"], rows(ALL_UP))
    assert "the scheduler shows n2 unusable" in down.why
    assert named.why == "named by the evidence (line 1: Xid on n1)"
    assert "whole allocation" in whole.why


MULTI = "n1|gpu*|idle\nn2|gpu*|down*\nn2|debug|down*\nn3|debug|idle\nn4|cpu|idle\nn5|gpu*|drain\n"


@pytest.mark.parametrize(
    ("partition", "excluded", "expected"),
    [
        pytest.param("gpu", [], ["n1", "n2", "n5"], id="down-and-drained-nodes-still-count"),
        pytest.param("gpu", ["n2"], ["n1", "n5"], id="one-excluded"),
        pytest.param("gpu,debug", ["n1"], ["n2", "n3", "n5"], id="comma-list-each-node-once-in-sinfo-order"),
        pytest.param("gpu,debug", ["n1", "n2", "n3", "n5"], [], id="comma-list-all-excluded"),
        pytest.param("debug,cpu", ["n9"], ["n2", "n3", "n4"], id="excluding-a-stranger-changes-nothing"),
        pytest.param("nope", [], [], id="unknown-partition"),
    ],
)
def test_remaining_nodes(partition: str, excluded: list[str], expected: list[str]) -> None:
    assert remaining_nodes(partition.split(","), excluded, rows(MULTI)) == expected

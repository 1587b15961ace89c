"""The Xid table against NVIDIA's catalogue, row by row.

Each code's mnemonic and immediate resolution bucket as printed on
https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html (Ampere and newer, H100 column YES
except 61, which the catalogue marks Unused). A change here is a change of NVIDIA's word, not ours:
re-read the page before editing a row.
"""

from __future__ import annotations

import pytest

from appliance.observe.gpu_events import XID_TABLE, FaultSide, GpuAction

CATALOG = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"

# code: (mnemonic, immediate action, investigatory action), copied from the catalogue's row.
CATALOGUE_ROWS: dict[int, tuple[str, str, str]] = {
    13: ("ROBUST_CHANNEL_GR_EXCEPTION", "RESTART_APP", "WORKFLOW_XID_13"),
    31: ("ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "RESTART_APP", "WORKFLOW_XID_31"),
    43: ("ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "IGNORE", "CONTACT_SUPPORT"),
    45: ("ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "WORKFLOW_XID_45", "Solo: RESTART_FM / Not Solo: IGNORE"),
    48: ("ROBUST_CHANNEL_GPU_ECC_DBE", "WORKFLOW_XID_48", "WORKFLOW_XID_48"),
    61: ("PMU_BREAKPOINT", "CONTACT_SUPPORT", "N/A; Unused"),
    62: ("PMU_HALT_ERROR", "RESET_GPU", "CONTACT_SUPPORT"),
    63: ("INFOROM_DRAM_RETIREMENT_EVENT", "IGNORE", "IGNORE"),
    64: ("INFOROM_DRAM_RETIREMENT_FAILURE", "RESET_GPU", "CONTACT_SUPPORT"),
    74: ("NVLINK_ERROR", "WORKFLOW_NVLINK_ERR", "CONTACT_SUPPORT"),
    79: ("ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM", "CONTACT_SUPPORT"),
    92: ("EXCESSIVE_SBE_INTERRUPTS", "IGNORE", "CONTACT_SUPPORT"),
    94: ("ROBUST_CHANNEL_CONTAINED_ERROR", "RESTART_APP", "IGNORE (sympathetic)"),
    95: ("ROBUST_CHANNEL_UNCONTAINED_ERROR", "RESET_GPU", "IGNORE (sympathetic)"),
    119: ("GSP_RPC_TIMEOUT", "RESET_GPU", "INVESTIGATE_SW"),
    120: ("GSP_ERROR", "RESET_GPU", "INVESTIGATE_SW"),
}

# How the appliance reads a bucket. WORKFLOW_* rows name their step in the trigger text: 45 follows the
# other Xid (nothing for the card itself), 48 and 74 "a GPU reset or node reboot is needed".
_READING = {
    "RESTART_APP": GpuAction.RESTART_APP,
    "IGNORE": GpuAction.NONE,
    "RESET_GPU": GpuAction.RESET_GPU,
    "RESTART_BM": GpuAction.DRAIN_NODE,
    "WORKFLOW_XID_45": GpuAction.NONE,
    "WORKFLOW_XID_48": GpuAction.RESET_GPU,
    "WORKFLOW_NVLINK_ERR": GpuAction.RESET_GPU,
}


def test_every_catalogued_code_is_in_the_table_and_nothing_else() -> None:
    assert set(XID_TABLE) == set(CATALOGUE_ROWS)


@pytest.mark.parametrize("code", sorted(CATALOGUE_ROWS))
def test_row_matches_the_catalogue(code: int) -> None:
    mnemonic, immediate, investigate = CATALOGUE_ROWS[code]
    row = XID_TABLE[code]
    assert (row.mnemonic, row.nvidia_action, row.nvidia_investigate) == (mnemonic, immediate, investigate)
    assert row.source.startswith(CATALOG)


@pytest.mark.parametrize("code", sorted(c for c in CATALOGUE_ROWS if c != 61))
def test_the_appliance_action_reads_the_immediate_bucket(code: int) -> None:
    assert XID_TABLE[code].action is _READING[XID_TABLE[code].nvidia_action]


def test_a_row_the_catalogue_marks_unused_says_where_its_meaning_comes_from() -> None:
    # 61 applies to no Ampere+ GPU; the appliance keeps the conservative reset and says so.
    row = XID_TABLE[61]
    assert "Unused" in row.source and "archive" in row.source
    assert row.fatal and row.action is GpuAction.RESET_GPU


def test_decisions_follow_the_catalogue() -> None:
    # RESET_GPU / RESTART_BM rows: the card is unfit for the next launch until the action is taken.
    for code, row in XID_TABLE.items():
        if row.nvidia_action in ("RESET_GPU", "RESTART_BM"):
            assert row.fatal, code
        if row.nvidia_action in ("IGNORE", "RESTART_APP"):
            assert not row.fatal, code
    # 43: "a user application error; the GPU remains in a healthy state".
    assert XID_TABLE[43].side is FaultSide.APPLICATION
    # 94: "all other applications running at the time of the Xid are unaffected".
    assert not XID_TABLE[94].fatal and XID_TABLE[94].action is GpuAction.RESTART_APP

"""GPU fault lines in the kernel log → events (appliance/observe/gpu_events.py), on fixture lines whose
sources tests/fixtures/gpu_health/kmsg/README.md cites."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.diagnosis.scan import kernel_message
from appliance.observe.gpu_events import (
    XID_TABLE,
    FaultSide,
    GpuAction,
    GpuEvent,
    GpuEventKind,
    GpuEventReader,
    attribute_card,
    gpu_events_in_text,
    parse_gpu_line,
    pci_key,
    xid_label,
)
from appliance.observe.kmsg import parse_stream

FIXTURES = Path(__file__).parents[1] / "fixtures" / "gpu_health" / "kmsg"


def _events(name: str) -> list[GpuEvent]:
    lines = (FIXTURES / name).read_text().splitlines()
    return gpu_events_in_text([kernel_message(line) for line in lines])


def test_the_xid_table_covers_the_codes_an_operator_meets() -> None:
    assert {13, 31, 43, 45, 48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120} <= set(XID_TABLE)
    for code in (13, 31, 43):
        assert XID_TABLE[code].side is FaultSide.APPLICATION and not XID_TABLE[code].fatal
    for code in (48, 79, 95, 119, 120):
        assert XID_TABLE[code].side is FaultSide.HARDWARE and XID_TABLE[code].fatal
    assert XID_TABLE[79].action is GpuAction.DRAIN_NODE


def test_nvidia_fixture_lines() -> None:
    events = _events("nvidia_xid.txt")
    assert [(e.xid, e.kind) for e in events] == [
        (79, GpuEventKind.XID), (31, GpuEventKind.XID), (48, GpuEventKind.XID), (63, GpuEventKind.XID),
        (3, GpuEventKind.XID), (79, GpuEventKind.XID), (None, GpuEventKind.UNKNOWN)]
    off_bus, mmu, dbe, remap, old, no_xid, cut = events
    assert off_bus.pci == "0000:2b:00" and off_bus.fatal and off_bus.side is FaultSide.HARDWARE
    assert (mmu.pid, mmu.process, mmu.side, mmu.fatal) == (12083, "chrome", FaultSide.APPLICATION, False)
    assert dbe.pid is None and dbe.process is None and dbe.fatal  # pid='<unknown>'
    assert remap.pid == 1896 and remap.pci == "0000:10:1c" and not remap.fatal
    assert old.pci == "0000:01:00" and not old.known and "Xid 3" in old.meaning
    assert no_xid.pci == "0000:b3:00" and no_xid.fatal
    # Bad input: a truncated record is kept, as unknown, with its text.
    assert not cut.known and cut.text.startswith("NVRM: Xid (PCI:0000:3b:0")


def test_amdgpu_fixture_lines() -> None:
    events = _events("amdgpu.txt")
    kinds = [e.kind for e in events]
    assert kinds == [GpuEventKind.RING_TIMEOUT, GpuEventKind.RESET, GpuEventKind.RING_TIMEOUT,
                     GpuEventKind.RESET, GpuEventKind.PAGE_FAULT, GpuEventKind.RAS, GpuEventKind.RAS]
    ring, reset, old_ring, old_reset, fault, ue, ce = events
    assert (ring.pci, ring.ring, ring.pid, ring.process) == ("0000:28:00", "gfx_0.0.0", 2288, "cosmic-comp")
    assert reset.pci == "0000:28:00" and reset.fatal and reset.side is FaultSide.HARDWARE
    assert old_ring.pci is None and (old_ring.pid, old_ring.process) == (2184, "Xorg")
    assert old_reset.pci == "0000:03:00"
    assert fault.side is FaultSide.APPLICATION and fault.pci == "0000:03:00"
    assert (ue.block, ue.count, ue.fatal) == ("umc", 2, True)
    assert (ce.block, ce.count, ce.fatal) == ("gfx", 5, False)


def test_kmsg_records_carry_seq_and_time() -> None:
    text = ("4,900,5000000,-;NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, name=VLLM::EngineCor, "
            "Graphics Exception\n")
    reader = GpuEventReader()
    events = [e for rec in parse_stream(text) for e in reader.feed_message(rec.message, seq=rec.seq,
                                                                               ts_usec=rec.ts_usec)]
    assert len(events) == 1
    assert (events[0].seq, events[0].ts_usec, events[0].pid, events[0].process) == (
        900, 5000000, 4242, "VLLM::EngineCor")


@pytest.mark.parametrize("text", ["", "random text", "NVRM: loading NVIDIA UNIX Open Kernel Module",
                                  "amdgpu 0000:28:00.0: [drm] PCIE GART of 512M enabled"])
def test_other_lines_are_not_events(text: str) -> None:
    assert parse_gpu_line(text) is None


def test_pci_keys_and_card_attribution() -> None:
    assert pci_key("00000000:3B:00.0") == pci_key("0000:3b:00") == pci_key("3b:00.0") == "0000:3b:00"
    assert pci_key("not a bus id") is None
    event = parse_gpu_line("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.")
    assert event is not None
    assert attribute_card(event, {"0000:3b:00": 2}).card == 2
    assert attribute_card(event, {"0000:3c:00": 0}).card is None
    assert "GPU 2: Xid 79" in attribute_card(event, {"0000:3b:00": 2}).describe()


def test_one_card_off_the_bus_is_one_event_whatever_the_driver_repeats() -> None:
    # The Xid line and its companion (NVIDIA/open-gpu-kernel-modules#1151), then the Xid again: one
    # card, one incident; another card's is its own.
    lines = ["NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.",
             "NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus.",
             "NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.",
             "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."]
    assert [e.pci for e in gpu_events_in_text(lines)] == ["0000:2b:00", "0000:3b:00"]


def test_lines_behind_a_journal_prefix_keep_their_card() -> None:
    # `journalctl -k` without a hostname field (as in pop-os/pop#2132's syslog excerpt style)
    amd = parse_gpu_line("Feb  2 08:03:20 kernel: [37937.169164] amdgpu 0000:03:00.0: amdgpu: "
                         "GPU reset begin!")
    nv = parse_gpu_line("May 18 19:02:39 kernel: NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.")
    assert amd is not None and amd.pci == "0000:03:00" and amd.kind is GpuEventKind.RESET
    assert nv is not None and nv.pci == "0000:2b:00" and nv.xid == 79


def test_an_nvlink_xid_74_makes_the_card_unfit_until_it_is_reset() -> None:
    # Xid 74 (NVLINK_ERROR): the catalogue's immediate bucket is a workflow (WORKFLOW_NVLINK_ERR), so
    # test_decisions_follow_the_catalogue cannot derive it; "a GPU reset or node reboot is needed to
    # clear this error" — the card is unfit for the next launch (fatal) until it is reset.
    row = XID_TABLE[74]
    assert (row.side, row.fatal, row.action) == (FaultSide.HARDWARE, True, GpuAction.RESET_GPU)
    event = parse_gpu_line("NVRM: Xid (PCI:0000:18:00): 74, pid='<unknown>', name=<unknown>, "
                           "NVLink: fatal error detected on link 7(0x0, 0x0, 0x0, 0x10000, 0x0, 0x0, 0x0)")
    assert event is not None and event.known
    assert (event.xid, event.pci, event.pid, event.process) == (74, "0000:18:00", None, None)
    assert (event.side, event.fatal, event.action) == (FaultSide.HARDWARE, True, GpuAction.RESET_GPU)
    assert event.meaning == row.meaning


def test_the_cards_a_launch_was_given() -> None:
    from appliance.observe.gpu_events import launch_cards

    assert launch_cards({"CUDA_VISIBLE_DEVICES": "0, 2"}) == {0, 2}
    assert launch_cards({"HIP_VISIBLE_DEVICES": "1"}) == {1}
    assert launch_cards({"ROCR_VISIBLE_DEVICES": "3,"}) == {3}
    # UUIDs and an empty list name no index; the three variables add up.
    assert launch_cards({"CUDA_VISIBLE_DEVICES": "GPU-5f3c,1", "HIP_VISIBLE_DEVICES": ""}) == {1}
    assert launch_cards({"CUDA_VISIBLE_DEVICES": "0", "HIP_VISIBLE_DEVICES": "1",
                         "ROCR_VISIBLE_DEVICES": "2"}) == {0, 1, 2}
    assert launch_cards({}) == frozenset()


def test_a_ring_timeout_without_its_process_line_is_reported_as_it_is() -> None:
    reader = GpuEventReader()
    assert reader.feed_message("amdgpu 0000:28:00.0: ring gfx_0.0.0 timeout, signaled seq=5, "
                               "emitted seq=7") == []  # waits one record for the process line
    (event,) = reader.feed_message("systemd[1]: something else entirely")
    assert event.kind is GpuEventKind.RING_TIMEOUT and event.pid is None and event.process is None


# -- written from mutmut's survivors (docs/mutation-testing.md, fourth round) ------------------

_RING = "amdgpu 0000:28:00.0: ring gfx_0.0.0 timeout, signaled seq=57638, emitted seq=57641"
_RESET = "amdgpu 0000:0c:00.0: amdgpu: GPU reset begin!"
_FAULT = "amdgpu 0000:03:00.0: amdgpu: [gfxhub] page fault (src_id:0 ring:32 vmid:0 pasid:0)"
_UE = "amdgpu 0000:03:00.0: amdgpu: 1 uncorrectable hardware errors detected in umc block"
_CE = "amdgpu 0000:03:00.0: amdgpu: 3 correctable hardware errors detected in gfx block"


def test_each_amd_line_is_read_whole() -> None:
    amd = {"vendor": "amd"}
    assert parse_gpu_line(_RING) == GpuEvent(
        **amd, kind=GpuEventKind.RING_TIMEOUT, pci="0000:28:00", ring="gfx_0.0.0", side=FaultSide.UNKNOWN,
        fatal=False, action=GpuAction.RESTART_APP,
        meaning="ring gfx_0.0.0 timed out (a job hung; the driver resets the ring or the card)", text=_RING)
    assert parse_gpu_line(_RESET) == GpuEvent(
        **amd, kind=GpuEventKind.RESET, pci="0000:0c:00", side=FaultSide.HARDWARE, fatal=True,
        action=GpuAction.RESET_GPU,
        meaning="GPU reset: every process on the card lost its context (VRAM may be lost)", text=_RESET)
    assert parse_gpu_line(_FAULT) == GpuEvent(
        **amd, kind=GpuEventKind.PAGE_FAULT, pci="0000:03:00", side=FaultSide.APPLICATION, fatal=False,
        action=GpuAction.RESTART_APP, meaning="GPU page fault in gfxhub (an illegal address, like Xid 31)",
        text=_FAULT)
    assert parse_gpu_line(_UE) == GpuEvent(
        **amd, kind=GpuEventKind.RAS, pci="0000:03:00", block="umc", count=1, side=FaultSide.HARDWARE,
        fatal=True, action=GpuAction.RESET_GPU,
        meaning="uncorrectable hardware errors in the umc block (RAS)", text=_UE)
    assert parse_gpu_line(_CE) == GpuEvent(
        **amd, kind=GpuEventKind.RAS, pci="0000:03:00", block="gfx", count=3, side=FaultSide.HARDWARE,
        fatal=False, action=GpuAction.NONE, meaning="correctable hardware errors in the gfx block (RAS)",
        text=_CE)


@pytest.mark.parametrize(("line", "pci"), [
    ("NVRM: Xid (PCI:0000:3b:00): cut", "0000:3b:00"),
    ("NVRM: Xid (0000:3B:00) and the rest was lost", "0000:3b:00"),
    ("NVRM: Xid (PCI:0000:3b:0", None),
])
def test_an_xid_line_cut_short_keeps_its_card_and_text(line: str, pci: str | None) -> None:
    assert parse_gpu_line(line) == GpuEvent(vendor="nvidia", kind=GpuEventKind.UNKNOWN, known=False,
                                            text=line, pci=pci,
                                            meaning="an Xid line that could not be read whole")


def test_an_xid_event_is_nvidias() -> None:
    event = parse_gpu_line("NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.")
    assert event is not None and event.vendor == "nvidia"


def test_a_pci_domain_is_hexadecimal() -> None:
    assert pci_key("0010:3b:00.0") == "0010:3b:00"


def test_the_one_line_description() -> None:
    base = GpuEvent(vendor="amd", kind=GpuEventKind.RING_TIMEOUT)
    assert base.describe() == "PCI ?: ring timeout"
    at = base.model_copy(update={"pci": "0000:28:00", "meaning": "m", "pid": 7})
    assert at.describe() == "PCI 0000:28:00: ring timeout: m (pid 7)"
    named = at.model_copy(update={"card": 2, "process": "python3"})
    assert named.describe() == "GPU 2: ring timeout: m (pid 7 python3)"
    assert GpuEvent(vendor="nvidia", kind=GpuEventKind.XID, xid=79, card=0).describe() == "GPU 0: Xid 79"


def test_an_amd_event_without_a_process_line_is_given_at_once_or_at_the_end() -> None:
    reader = GpuEventReader()
    (reset,) = reader.feed_message(_RESET)  # a reset has no process line to wait for
    assert reset.kind is GpuEventKind.RESET
    assert reader.feed_message(_RING) == []  # a ring timeout waits one record for its process line
    (ring,) = reader.flush()
    assert ring.kind is GpuEventKind.RING_TIMEOUT and reader.flush() == []


def test_the_xid_metric_label_is_bounded() -> None:
    assert xid_label(GpuEvent(vendor="amd", kind=GpuEventKind.RESET)) == ""
    assert xid_label(GpuEvent(vendor="nvidia", kind=GpuEventKind.XID, xid=79)) == "79"
    assert xid_label(GpuEvent(vendor="nvidia", kind=GpuEventKind.XID, xid=999)) == "other"

"""GPU fault lines in the kernel log (NVIDIA Xid, amdgpu/DCU resets, ring timeouts, RAS, VM faults) →
events. Pure.

The other way a GPU host kills an engine is the card itself; the driver says so in the kernel log, in
lines this module turns into `GpuEvent`s. Nothing here opens a file: the kmsg follower
(controller/watch/kmsg_follower.py) hands records in, tests hand in fixture text
(tests/fixtures/gpu_health/kmsg/, every line's source cited in its README).

NVIDIA (the driver's `NVRM:` prefix). The Xid line, as NVIDIA documents it
(https://docs.nvidia.com/deploy/xid-errors/index.html, "Xid Messages"), and as public reports show it:

    NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.
    NVRM: Xid (PCI:0000:03:00): 31, pid=12083, name=chrome, Ch 00000010, intr 10000000. MMU Fault: …
    NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error …
    NVRM: Xid (0000:01:00): 3, C 00000005 SC 00000007 …          (older drivers: no `PCI:` tag)

The PCI address is domain:bus:device (no function); `pid=` and `name=` are given by newer drivers when
the faulting channel belongs to a process. Newer drivers also print the multi-line
`NVRM: The NVIDIA GPU 0000:b3:00.0 … has fallen off the bus` without an Xid (NVIDIA/NVSentinel#155):
recognised as Xid 79.

AMD and Hygon (amdgpu; Hygon's DCU driver `hydcu` is an amdgpu fork and prints the same text), from the
kernel's drivers/gpu/drm/amd/amdgpu (amdgpu_job.c `amdgpu_job_timedout`, amdgpu_device.c
`amdgpu_device_gpu_recover`, amdgpu_ras.c, gmc_v9_0.c `gmc_v9_0_process_interrupt`) and public reports:

    amdgpu 0000:28:00.0: ring gfx_0.0.0 timeout, signaled seq=57638, emitted seq=57641
    [drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring sdma0 timeout, signaled seq=121570, emitted seq=121572
    amdgpu 0000:28:00.0:  Process cosmic-comp pid 2288 thread cosmic-com:cs0 pid 2316
    [drm:amdgpu_job_timedout [amdgpu]] *ERROR* Process information: process picom pid 37593 thread …
    amdgpu 0000:0c:00.0: amdgpu: GPU reset begin!
    amdgpu 0000:03:00.0: amdgpu: [gfxhub] page fault (src_id:0 ring:32 vmid:0 pasid:0)
    amdgpu 0000:03:00.0: amdgpu: 1 uncorrectable hardware errors detected in umc block

A line that is recognisably a GPU fault but cannot be read whole (truncated, an Xid number the table
does not know) becomes an event with `known=False` and its text: never dropped.
"""

from __future__ import annotations

import re
from enum import StrEnum

from pydantic import BaseModel, ConfigDict


class FaultSide(StrEnum):
    """Whose fault an event is: what decides between "fix the engine" and "fix the card"."""

    APPLICATION = "application"  # the program on the card did something illegal; the card is fine
    HARDWARE = "hardware"  # the card, its memory, its link, its firmware
    CONSEQUENCE = "consequence"  # follows another error (cleanup); the other event is the cause
    UNKNOWN = "unknown"


class GpuAction(StrEnum):
    """NVIDIA's resolution buckets (Xid catalogue: RESTART_APP, RESET_GPU, …) in the appliance's words."""

    NONE = "none"
    RESTART_APP = "restart_app"  # relaunching the engine is enough
    RESET_GPU = "reset_gpu"  # the card needs a reset (nvidia-smi -r / amdgpu reset) before reuse
    DRAIN_NODE = "drain_node"  # take the host out of service: reboot, reseat, check power and cooling
    CHECK_COOLING = "check_cooling"


class XidInfo(BaseModel):
    """One row of the Xid table."""

    model_config = ConfigDict(frozen=True)

    code: int
    mnemonic: str  # the catalogue's "Mnemonic" column (the driver's nverror.h name)
    meaning: str
    side: FaultSide
    fatal: bool  # the card is unfit for the next launch until the action is taken
    action: GpuAction
    advice: str
    # The catalogue's "Resolution Bucket (Immediate Action)" and "(Investigatory Action)" columns,
    # verbatim (RESTART_APP, RESET_GPU, RESTART_BM, IGNORE, CONTACT_SUPPORT, WORKFLOW_XID_48, …).
    # `action` is the appliance's reading of the immediate bucket (IGNORE → NONE, RESTART_BM →
    # DRAIN_NODE, WORKFLOW_* → the step its trigger text names).
    nvidia_action: str
    nvidia_investigate: str
    source: str  # the page this row was checked against


_CATALOG = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"


# NVIDIA's Xid catalogue for Ampere and newer (H100/H200 included):
# https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html (columns Code, Mnemonic,
# Description, Applies to A100/H100/B100/GB200, Resolution Bucket (Immediate Action), Resolution Bucket
# (Investigatory Action), Xid 154 linkage, Trigger Conditions). Every row below was checked against that
# page's row for its code; `meaning` follows its Description and Trigger Conditions, `side` its trigger
# text (user application / hardware / cleanup after another error), `action` its immediate bucket.
XID_TABLE: dict[int, XidInfo] = {x.code: x for x in (
    XidInfo(code=13, mnemonic="ROBUST_CHANNEL_GR_EXCEPTION", meaning="graphics engine exception (a "
            "user application fault: typically an out-of-bounds access, or an illegal instruction or "
            "register)", side=FaultSide.APPLICATION, fatal=False, action=GpuAction.RESTART_APP,
            advice="an engine/kernel bug; run the workload again, compute-sanitizer memcheck or cuda-gdb "
                   "finds the kernel (catalogue: in rare cases hardware or driver bugs show as Xid 13)",
            nvidia_action="RESTART_APP", nvidia_investigate="WORKFLOW_XID_13", source=_CATALOG),
    XidInfo(code=31, mnemonic="ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", meaning="GPU memory page fault "
            "(the MMU reported an illegal address access)", side=FaultSide.APPLICATION, fatal=False,
            action=GpuAction.RESTART_APP,
            advice="typically an application bug (catalogue: can also be a driver or hardware bug); "
                   "if it recurs on one card only, suspect the card",
            nvidia_action="RESTART_APP", nvidia_investigate="WORKFLOW_XID_31", source=_CATALOG),
    XidInfo(code=43, mnemonic="ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", meaning="GPU stopped processing "
            "(the application hit a software-induced fault and had to terminate; the GPU stays "
            "healthy)", side=FaultSide.APPLICATION, fatal=False, action=GpuAction.NONE,
            advice="an application error, not the card (catalogue: immediate action IGNORE); the "
                   "engine died and is relaunched as any crashed engine",
            nvidia_action="IGNORE", nvidia_investigate="CONTACT_SUPPORT", source=_CATALOG),
    XidInfo(code=45, mnemonic="ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", meaning="preemptive cleanup after an "
            "earlier error, or the application was aborted (Ctrl-C, kill, a GPU reset)",
            side=FaultSide.CONSEQUENCE, fatal=False, action=GpuAction.NONE,
            advice="look at the Xid just before this one: it is the cause (catalogue: alone → restart "
                   "Fabric Manager; with another Xid → follow that one)",
            nvidia_action="WORKFLOW_XID_45", nvidia_investigate="Solo: RESTART_FM / Not Solo: IGNORE",
            source=_CATALOG),
    XidInfo(code=48, mnemonic="ROBUST_CHANNEL_GPU_ECC_DBE", meaning="double-bit (uncorrectable) ECC "
            "error", side=FaultSide.HARDWARE, fatal=True, action=GpuAction.RESET_GPU,
            advice="reset the card or reboot the node to clear it (catalogue); an SRAM DBE over its "
                   "threshold → RMA flow and field diag",
            nvidia_action="WORKFLOW_XID_48", nvidia_investigate="WORKFLOW_XID_48", source=_CATALOG),
    XidInfo(code=61, mnemonic="PMU_BREAKPOINT", meaning="internal micro-controller breakpoint/warning "
            "(Volta and older; unused on Ampere and newer)", side=FaultSide.HARDWARE, fatal=True,
            action=GpuAction.RESET_GPU,
            advice="not expected on an H100/H200 (catalogue: Unused, bucket CONTACT_SUPPORT); the "
                   "appliance resets the card before reuse and a recurrence goes to NVIDIA support with "
                   "nvidia-bug-report.sh",
            nvidia_action="CONTACT_SUPPORT", nvidia_investigate="N/A; Unused",
            source=_CATALOG + " (row marked Unused, applies to no Ampere+ GPU; meaning from "
                   "https://docs.nvidia.com/deploy/xid-errors/archive/index.html)"),
    XidInfo(code=62, mnemonic="PMU_HALT_ERROR", meaning="internal micro-controller halt",
            side=FaultSide.HARDWARE, fatal=True, action=GpuAction.RESET_GPU,
            advice="reset the card; if it recurs, NVIDIA support (catalogue's investigatory action)",
            nvidia_action="RESET_GPU", nvidia_investigate="CONTACT_SUPPORT", source=_CATALOG),
    XidInfo(code=63, mnemonic="INFOROM_DRAM_RETIREMENT_EVENT", meaning="GPU memory remapping event (the "
            "row remapper handled an ECC error; the remap takes effect at the next card reset)",
            side=FaultSide.HARDWARE, fatal=False, action=GpuAction.NONE,
            advice="nothing now (catalogue: IGNORE); the driver's line asks for a reset to activate the "
                   "remap: reset the card when it is idle",
            nvidia_action="IGNORE", nvidia_investigate="IGNORE", source=_CATALOG),
    XidInfo(code=64, mnemonic="INFOROM_DRAM_RETIREMENT_FAILURE", meaning="GPU memory remapping failure "
            "(an ECC error's row could not be remapped)", side=FaultSide.HARDWARE, fatal=True,
            action=GpuAction.RESET_GPU,
            advice="reset the card; if the failure repeats the card has run out of spare rows: NVIDIA "
                   "support / replace it",
            nvidia_action="RESET_GPU", nvidia_investigate="CONTACT_SUPPORT", source=_CATALOG),
    XidInfo(code=74, mnemonic="NVLINK_ERROR", meaning="NVLink error (the link to another GPU or NVSwitch; "
            "the fault may be at the remote end)", side=FaultSide.HARDWARE, fatal=True,
            action=GpuAction.RESET_GPU,
            advice="a GPU reset or node reboot clears it (catalogue); check the link with nvidia-smi "
                   "nvlink; the card at the other end may be the one that failed",
            nvidia_action="WORKFLOW_NVLINK_ERR", nvidia_investigate="CONTACT_SUPPORT", source=_CATALOG),
    XidInfo(code=79, mnemonic="ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", meaning="GPU has fallen off "
            "the bus", side=FaultSide.HARDWARE, fatal=True, action=GpuAction.DRAIN_NODE,
            advice="drain the node and restart it (catalogue: RESTART_BM); check the PCIe link, power, "
                   "seating and cooling in the system and kernel PCI event logs",
            nvidia_action="RESTART_BM", nvidia_investigate="CONTACT_SUPPORT", source=_CATALOG),
    XidInfo(code=92, mnemonic="EXCESSIVE_SBE_INTERRUPTS", meaning="high single-bit ECC error rate",
            side=FaultSide.HARDWARE, fatal=False, action=GpuAction.NONE,
            advice="corrected errors, nothing to do now (catalogue: IGNORE); watch the rate, NVIDIA "
                   "support if it persists",
            nvidia_action="IGNORE", nvidia_investigate="CONTACT_SUPPORT", source=_CATALOG),
    XidInfo(code=94, mnemonic="ROBUST_CHANNEL_CONTAINED_ERROR", meaning="contained memory error (only "
            "the application that hit it is affected)", side=FaultSide.HARDWARE, fatal=False,
            action=GpuAction.RESTART_APP,
            advice="the engine had to die; relaunching works, reset the card when convenient "
                   "(catalogue)",
            nvidia_action="RESTART_APP", nvidia_investigate="IGNORE (sympathetic)", source=_CATALOG),
    XidInfo(code=95, mnemonic="ROBUST_CHANNEL_UNCONTAINED_ERROR", meaning="uncontained memory error "
            "(every application on the card is affected)", side=FaultSide.HARDWARE, fatal=True,
            action=GpuAction.RESET_GPU, advice="reset the card before any relaunch on it (catalogue)",
            nvidia_action="RESET_GPU", nvidia_investigate="IGNORE (sympathetic)", source=_CATALOG),
    XidInfo(code=119, mnemonic="GSP_RPC_TIMEOUT", meaning="GSP RPC timeout (the GPU's GSP core did not "
            "answer the driver)", side=FaultSide.HARDWARE, fatal=True, action=GpuAction.RESET_GPU,
            advice="reset the card (a node power cycle if it persists); if it recurs after a power "
                   "cycle, follow NVIDIA's GPU debug guidelines, update driver/firmware",
            nvidia_action="RESET_GPU", nvidia_investigate="INVESTIGATE_SW", source=_CATALOG),
    XidInfo(code=120, mnemonic="GSP_ERROR", meaning="GSP error (code on the GPU's GSP core failed)",
            side=FaultSide.HARDWARE, fatal=True, action=GpuAction.RESET_GPU,
            advice="reset the card (a node power cycle if it persists); if it recurs after a power "
                   "cycle, follow NVIDIA's GPU debug guidelines, update driver/firmware",
            nvidia_action="RESET_GPU", nvidia_investigate="INVESTIGATE_SW", source=_CATALOG),
)}


class GpuEventKind(StrEnum):
    XID = "xid"  # NVIDIA
    RESET = "reset"  # amdgpu: GPU reset begin
    RING_TIMEOUT = "ring_timeout"  # amdgpu: a ring (queue) stopped signalling
    RAS = "ras"  # amdgpu: RAS-reported (un)correctable errors
    PAGE_FAULT = "page_fault"  # amdgpu: VM fault (the amdgpu analogue of Xid 31)
    UNKNOWN = "unknown"  # a GPU fault line that could not be read whole


class GpuEvent(BaseModel):
    model_config = ConfigDict(frozen=True)

    vendor: str  # nvidia | amd (amdgpu and Hygon's hydcu print the same)
    kind: GpuEventKind
    pci: str | None = None  # normalised domain:bus:device, e.g. "0000:3b:00" (see `pci_key`)
    xid: int | None = None
    pid: int | None = None
    process: str | None = None
    ring: str | None = None
    block: str | None = None  # RAS block (umc, gfx, …)
    count: int | None = None  # RAS error count
    side: FaultSide = FaultSide.UNKNOWN
    fatal: bool = False
    action: GpuAction = GpuAction.NONE
    meaning: str = ""
    known: bool = True  # False: recognised as a GPU fault line but not understood (see `text`)
    text: str = ""
    seq: int | None = None
    ts_usec: int | None = None
    card: int | None = None  # the card index, once attributed (`attribute_card`)

    def describe(self) -> str:
        where = f"GPU {self.card}" if self.card is not None else f"PCI {self.pci or '?'}"
        what = f"Xid {self.xid}" if self.xid is not None else self.kind.value.replace("_", " ")
        who = f" (pid {self.pid}{' ' + self.process if self.process else ''})" if self.pid else ""
        return f"{where}: {what}{': ' + self.meaning if self.meaning else ''}{who}"


def pci_key(address: str) -> str | None:
    """domain:bus:device in lower case with a 4-digit domain: NVML's "00000000:3B:00.0", the Xid line's
    "0000:3b:00", amdgpu's "0000:28:00.0" and a bare "3b:00.0" all name the same card."""
    m = re.fullmatch(r"(?:PCI:)?(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})(?:\.[0-7])?",
                     address.strip())
    if m is None:
        return None
    domain = int(m.group(1) or "0", 16)
    return f"{domain:04x}:{int(m.group(2), 16):02x}:{int(m.group(3), 16):02x}"


_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F:.]+)\): (?P<xid>\d+)(?:,\s*(?P<rest>.*))?$")
_XID_START = re.compile(r"NVRM: Xid\b")
_PID = re.compile(r"\bpid=(?:'?)(?P<pid>\d+|<unknown>)'?")
_NAME = re.compile(r"\bname=(?P<name>[^,]*)")
_NV_OFF_BUS = re.compile(r"NVRM: (?:The NVIDIA )?GPU (?:at )?(?:PCI:)?(?P<pci>[0-9a-fA-F:.]+)\b.*"
                         r"(?:has )?fallen off the bus")
_AMD_PREFIX = re.compile(r"\b(?:amdgpu|hydcu) (?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]): "
                         r"(?:(?:amdgpu|hydcu): )?")
_RING_TIMEOUT = re.compile(r"ring (?P<ring>\S+) timeout, signaled seq=\d+, emitted seq=\d+")
_RESET_BEGIN = re.compile(r"GPU reset begin!")
_PAGE_FAULT = re.compile(r"\[(?P<hub>\w+)\] (?:retry |no-retry )?page fault \(src_id:\d+ ring:\d+ vmid:\d+ "
                         r"pasid:\d+")
_RAS = re.compile(r"(?P<count>\d+) (?P<un>un)?correctable hardware errors detected in (?:total in )?"
                  r"(?P<block>\S+) block")
_AMD_PROCESS = re.compile(r"Process(?: information:)? (?:process )?(?P<name>.*?) pid (?P<pid>\d+) thread")
_AMD_MARKERS = ("amdgpu", "hydcu")


def _xid_event(text: str) -> GpuEvent:
    m = _XID.search(text)
    if m is None:
        # "NVRM: Xid (PCI:0000:3b:0" — the record was cut: keep what can be read, and the text.
        pci = re.search(r"\((?:PCI:)?([0-9a-fA-F:.]+)\)", text)
        return GpuEvent(vendor="nvidia", kind=GpuEventKind.UNKNOWN, known=False, text=text,
                        pci=pci_key(pci.group(1)) if pci else None,
                        meaning="an Xid line that could not be read whole")
    xid = int(m.group("xid"))
    rest = m.group("rest") or ""
    pid_m, name_m = _PID.search(rest), _NAME.search(rest)
    pid = int(pid_m.group("pid")) if pid_m and pid_m.group("pid").isdigit() else None
    name = name_m.group("name").strip() if name_m else None
    info = XID_TABLE.get(xid)
    base = GpuEvent(vendor="nvidia", kind=GpuEventKind.XID, pci=pci_key(m.group("pci")), xid=xid,
                    pid=pid or None, process=name if name and name != "<unknown>" else None, text=text)
    if info is None:
        return base.model_copy(update={"known": False,
                                       "meaning": f"Xid {xid} is not in the appliance's table"})
    return base.model_copy(update={"side": info.side, "fatal": info.fatal, "action": info.action,
                                   "meaning": info.meaning})


def parse_gpu_line(message: str) -> GpuEvent | None:
    """One kernel message → a GPU event, or None when it is not a GPU fault line."""
    text = message.strip()
    if "NVRM" in text:
        if _XID_START.search(text):
            return _xid_event(text)
        off = _NV_OFF_BUS.search(text)
        if off is not None:
            info = XID_TABLE[79]
            return GpuEvent(vendor="nvidia", kind=GpuEventKind.XID, pci=pci_key(off.group("pci")), xid=79,
                            side=info.side, fatal=True, action=info.action, meaning=info.meaning, text=text)
        return None
    if not any(marker in text for marker in _AMD_MARKERS):
        return None
    prefix = _AMD_PREFIX.search(text)  # also behind a journal or syslog prefix
    pci = pci_key(prefix.group("pci")) if prefix else None
    if (m := _RING_TIMEOUT.search(text)) is not None:
        return GpuEvent(vendor="amd", kind=GpuEventKind.RING_TIMEOUT, pci=pci, ring=m.group("ring"),
                        side=FaultSide.UNKNOWN, fatal=False, action=GpuAction.RESTART_APP,
                        meaning=f"ring {m.group('ring')} timed out (a job hung; the driver resets the ring "
                                "or the card)", text=text)
    if _RESET_BEGIN.search(text):
        return GpuEvent(vendor="amd", kind=GpuEventKind.RESET, pci=pci, side=FaultSide.HARDWARE, fatal=True,
                        action=GpuAction.RESET_GPU,
                        meaning="GPU reset: every process on the card lost its context (VRAM may be lost)",
                        text=text)
    if (m := _PAGE_FAULT.search(text)) is not None:
        return GpuEvent(vendor="amd", kind=GpuEventKind.PAGE_FAULT, pci=pci, side=FaultSide.APPLICATION,
                        action=GpuAction.RESTART_APP,
                        meaning=f"GPU page fault in {m.group('hub')} (an illegal address, like Xid 31)",
                        text=text)
    if (m := _RAS.search(text)) is not None:
        uncorrectable = m.group("un") is not None
        return GpuEvent(vendor="amd", kind=GpuEventKind.RAS, pci=pci, block=m.group("block"),
                        count=int(m.group("count")), side=FaultSide.HARDWARE, fatal=uncorrectable,
                        action=GpuAction.RESET_GPU if uncorrectable else GpuAction.NONE,
                        meaning=f"{'un' if uncorrectable else ''}correctable hardware errors in the "
                                f"{m.group('block')} block (RAS)", text=text)
    return None


def amd_process(message: str) -> tuple[int, str] | None:
    """The `Process <name> pid N thread …` line that follows an amdgpu ring timeout or page fault."""
    m = _AMD_PROCESS.search(message)
    return (int(m.group("pid")), m.group("name").strip()) if m else None


class GpuEventReader:
    """Fold kernel records into GPU events, in order: the process line that amdgpu prints after a
    ring timeout or page fault is joined to the event before it (same card, next record)."""

    def __init__(self) -> None:
        self._last: GpuEvent | None = None
        # Cards already reported off the bus: the driver prints the Xid 79 line and its companion
        # `GPU 0000:2b:00.0: GPU has fallen off the bus.` (NVIDIA/open-gpu-kernel-modules#1151), and a
        # card that fell off stays off until a reboot — one incident, one event.
        self._off_bus: set[str] = set()

    def feed_message(self, message: str, *, seq: int | None = None,
                     ts_usec: int | None = None) -> list[GpuEvent]:
        event = parse_gpu_line(message)
        if event is None:
            last = self._last
            self._last = None
            proc = amd_process(message) if last is not None else None
            if last is not None and proc is not None and last.pid is None:
                return [last.model_copy(update={"pid": proc[0], "process": proc[1]})]
            return [last] if last is not None else []
        out: list[GpuEvent] = [self._last] if self._last is not None else []
        if event.xid == 79 and event.pci is not None:
            if event.pci in self._off_bus:
                self._last = None
                return out
            self._off_bus.add(event.pci)
        event = event.model_copy(update={"seq": seq, "ts_usec": ts_usec})
        if event.vendor == "amd" and event.kind in (GpuEventKind.RING_TIMEOUT, GpuEventKind.PAGE_FAULT):
            self._last = event  # wait one record for its process line
        else:
            self._last = None
            out.append(event)
        return out

    def flush(self) -> list[GpuEvent]:
        last, self._last = self._last, None
        return [last] if last is not None else []


def gpu_events_in_text(lines: list[str] | tuple[str, ...]) -> list[GpuEvent]:
    """Every GPU event in saved kernel-log text (kmsg records, dmesg, journal: prefixes are the
    caller's to strip, see appliance.diagnosis.scan.kernel_message)."""
    reader = GpuEventReader()
    out: list[GpuEvent] = []
    for line in lines:
        out.extend(reader.feed_message(line))
    out.extend(reader.flush())
    return out


def attribute_card(event: GpuEvent, cards_by_pci: dict[str, int]) -> GpuEvent:
    """The event with its card index, from the PCI → index map of the GPU watch (NVML's bus id on
    NVIDIA, the drm card's device link on AMD/Hygon)."""
    if event.pci is None or event.pci not in cards_by_pci:
        return event
    return event.model_copy(update={"card": cards_by_pci[event.pci]})


def launch_cards(env: dict[str, str]) -> frozenset[int]:
    """The cards a launch was given (CUDA_/HIP_VISIBLE_DEVICES, always explicit on GPUs, DOMAIN §2).

    These are the runtime's indices; the GPU watch's are NVML's (PCI bus order) and drm's cardN. They
    agree when CUDA_DEVICE_ORDER=PCI_BUS_ID and on hosts whose drm cards are only the GPUs (the
    reference host's four DCUs); an event is also matched by the engine's pids, which needs neither."""
    out: set[int] = set()
    for name in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        for part in env.get(name, "").split(","):
            if part.strip().isdigit():
                out.add(int(part.strip()))
    return frozenset(out)


def xid_label(event: GpuEvent) -> str:
    """A bounded metric label: a code of the table, "other" for the rest, "" when not an Xid."""
    if event.xid is None:
        return ""
    return str(event.xid) if event.xid in XID_TABLE else "other"

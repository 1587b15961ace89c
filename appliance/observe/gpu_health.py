"""A card's health: temperature, power, throttling, ECC, retired/remapped memory, PCIe link. Pure.

Where the numbers come from:

- NVIDIA: NVML (`nvidia-ml-py`, module `pynvml`), through the `CardQueries` seam: one named query per
  fact (`NVML_QUERIES`), each answering a JSON-able value or raising. controller/watch/gpu_health.py
  answers them from pynvml; `ReplayQueries` answers them from a recording (tests/fixtures/gpu_health/,
  written by scripts/gpu_h200/record_gpu_health.py on a real card) with faults injected on top for what a
  healthy card cannot show. MEASURED.md (H200, driver 580): 33 °C (slowdown 89, shutdown 95), 78 of
  700 W, ECC on with 0 errors, remapped rows 0, the retired-pages query not supported (row remapping
  replaces it on this generation), PCIe gen 5 ×16.
- AMD/Hygon: amdgpu sysfs, `parse_amdgpu_health` over the files of /sys/class/drm/cardN/device:
  `hwmon/hwmon*/temp1_input` (m°C), `temp1_crit`, `temp1_emergency`, `power1_average` /
  `power1_input` (µW), `power1_cap`, `ras/<block>_err_count` (`ue: N` / `ce: N` lines),
  `current_link_speed` ("16.0 GT/s PCIe"), `max_link_speed`, `current_link_width`, `max_link_width`,
  `gpu_busy_percent` (Documentation/gpu/amdgpu/thermal.rst and ras.rst; the link files are the PCI
  core's, Documentation/ABI/testing/sysfs-bus-pci).

A fact that cannot be read is None and its name goes into `blind`: "not supported" is not "healthy".
`assess` turns a card into findings — warn (throttling, hot, uncorrectable ECC, pending remaps, a
link below its maximum) or refuse (a fatal pending state: the card is lost, a remap failed, at its
shutdown temperature, or a fatal kernel event since the card was last reset).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict

from appliance.observe.gpu_events import GpuEvent, pci_key

Verdict = Literal["admit", "warn", "refuse"]

# NVML's clocks event (throttle) reason bits, nvml.h `nvmlClocksEventReason*` /
# `nvmlClocksThrottleReason*` (the same values; the API renamed them in 12.x).
THROTTLE_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# Reasons that are the card doing its job, not losing speed to heat or power: idle, clocks an
# administrator set, a sync-boost group, the display clock.
BENIGN_THROTTLE = frozenset({"gpu_idle", "applications_clocks_setting", "sync_boost",
                             "display_clock_setting"})

# Degrees below the card's own slowdown threshold at which it counts as hot (a warning before it
# throttles; the H200 slows at 89 °C, MEASURED.md).
HOT_MARGIN_C = 5.0


class CardQueries(Protocol):
    """The seam: the card count and one named query per card (see NVML_QUERIES). A query the card
    does not support, or that fails, raises; its name becomes one of the card's blind spots."""

    def count(self) -> int: ...

    def query(self, index: int, name: str) -> Any: ...


# The queries, in the order the recorder and the reader ask them, with the pynvml call behind each
# (controller/watch/gpu_health.py implements them).
NVML_QUERIES: tuple[str, ...] = (
    "name",  # nvmlDeviceGetName
    "pci_bus_id",  # nvmlDeviceGetPciInfo().busId
    "temperature_c",  # nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)
    "temperature_slowdown_c",  # nvmlDeviceGetTemperatureThreshold(NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
    "temperature_shutdown_c",  # nvmlDeviceGetTemperatureThreshold(NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)
    "power_w",  # nvmlDeviceGetPowerUsage (mW)
    "power_limit_w",  # nvmlDeviceGetEnforcedPowerLimit (mW)
    "throttle_reasons",  # nvmlDeviceGetCurrentClocksEventReasons / …ThrottleReasons (bitmask)
    "ecc_volatile_corrected",  # nvmlDeviceGetTotalEccErrors(CORRECTED, VOLATILE_ECC)
    "ecc_volatile_uncorrected",  # nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE_ECC)
    "ecc_aggregate_corrected",  # nvmlDeviceGetTotalEccErrors(CORRECTED, AGGREGATE_ECC)
    "ecc_aggregate_uncorrected",  # nvmlDeviceGetTotalEccErrors(UNCORRECTED, AGGREGATE_ECC)
    "retired_pages",  # len(nvmlDeviceGetRetiredPages(SBE)) + len(…(DBE))
    "retired_pages_pending",  # nvmlDeviceGetRetiredPagesPendingStatus
    "remapped_rows",  # nvmlDeviceGetRemappedRows → [corrected, uncorrected, pending, failure]
    "pcie_gen",  # nvmlDeviceGetCurrPcieLinkGeneration
    "pcie_gen_max",  # nvmlDeviceGetMaxPcieLinkGeneration
    "pcie_width",  # nvmlDeviceGetCurrPcieLinkWidth
    "pcie_width_max",  # nvmlDeviceGetMaxPcieLinkWidth
    "utilization_percent",  # nvmlDeviceGetUtilizationRates().gpu
)


class CardHealth(BaseModel):
    model_config = ConfigDict(frozen=True)

    index: int
    vendor: str  # nvidia | amd | hygon | unknown
    name: str | None = None
    pci: str | None = None  # pci_key form, "0000:3b:00"
    temperature_c: float | None = None
    temperature_slowdown_c: float | None = None
    temperature_shutdown_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    throttle_reasons: tuple[str, ...] = ()
    ecc_volatile_corrected: int | None = None
    ecc_volatile_uncorrected: int | None = None
    ecc_aggregate_corrected: int | None = None
    ecc_aggregate_uncorrected: int | None = None
    retired_pages: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_corrected: int | None = None
    remapped_rows_uncorrected: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    utilization_percent: float | None = None
    lost: bool = False  # the card stopped answering (NVML: GPU is lost) — fell off the bus
    blind: tuple[str, ...] = ()  # the facts that could not be read
    unsupported: tuple[str, ...] = ()  # of those, the ones the card says it does not support

    @property
    def slowing(self) -> tuple[str, ...]:
        """Throttle reasons that cost speed (heat, power), not the benign ones."""
        return tuple(r for r in self.throttle_reasons if r not in BENIGN_THROTTLE)


def throttle_names(mask: int) -> tuple[str, ...]:
    names = tuple(name for bit, name in THROTTLE_REASONS.items() if mask & bit)
    unknown = mask & ~sum(THROTTLE_REASONS)
    return names + ((f"unknown_0x{unknown:x}",) if unknown else ())


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def card_from_queries(index: int, queries: CardQueries, *, skip: Iterable[str] = ()) -> CardHealth:
    """Ask every query of NVML_QUERIES (those in `skip` are known blind: not asked again)."""
    answers: dict[str, Any] = {}
    blind: list[str] = []
    unsupported: list[str] = []
    lost = False
    skipped = set(skip)
    for name in NVML_QUERIES:
        if name in skipped:
            blind.append(name)
            unsupported.append(name)
            continue
        try:
            answers[name] = queries.query(index, name)
        except Exception as exc:  # noqa: BLE001 - NVMLError_NotSupported, _GpuIsLost, …: blind, not fatal
            blind.append(name)
            said = f"{type(exc).__name__} {exc}".lower().replace("_", " ")
            if "lost" in said:
                lost = True
            elif "not supported" in said or "notsupported" in said:
                unsupported.append(name)
    card = card_from_answers(index, answers, blind=tuple(blind), lost=lost)
    return card.model_copy(update={"unsupported": tuple(unsupported)})


def card_from_answers(index: int, answers: Mapping[str, Any], *, blind: tuple[str, ...] = (),
                      lost: bool = False) -> CardHealth:
    rows = answers.get("remapped_rows")
    rows = rows if isinstance(rows, (list, tuple)) and len(rows) == 4 else None
    mask = _int(answers.get("throttle_reasons"))
    pending = answers.get("retired_pages_pending")
    bus = answers.get("pci_bus_id")
    return CardHealth(
        index=index, vendor="nvidia", name=str(answers["name"]) if answers.get("name") else None,
        pci=pci_key(bus) if isinstance(bus, str) else None,
        temperature_c=_num(answers.get("temperature_c")),
        temperature_slowdown_c=_num(answers.get("temperature_slowdown_c")),
        temperature_shutdown_c=_num(answers.get("temperature_shutdown_c")),
        power_w=_num(answers.get("power_w")), power_limit_w=_num(answers.get("power_limit_w")),
        throttle_reasons=throttle_names(mask) if mask is not None else (),
        ecc_volatile_corrected=_int(answers.get("ecc_volatile_corrected")),
        ecc_volatile_uncorrected=_int(answers.get("ecc_volatile_uncorrected")),
        ecc_aggregate_corrected=_int(answers.get("ecc_aggregate_corrected")),
        ecc_aggregate_uncorrected=_int(answers.get("ecc_aggregate_uncorrected")),
        retired_pages=_int(answers.get("retired_pages")),
        retired_pages_pending=bool(pending) if isinstance(pending, (bool, int)) else None,
        remapped_rows_corrected=_int(rows[0]) if rows else None,
        remapped_rows_uncorrected=_int(rows[1]) if rows else None,
        remap_pending=bool(rows[2]) if rows else None,
        remap_failure=bool(rows[3]) if rows else None,
        pcie_gen=_int(answers.get("pcie_gen")), pcie_gen_max=_int(answers.get("pcie_gen_max")),
        pcie_width=_int(answers.get("pcie_width")), pcie_width_max=_int(answers.get("pcie_width_max")),
        utilization_percent=_num(answers.get("utilization_percent")),
        lost=lost, blind=blind,
    )


class ReplayQueries:
    """A recording (scripts/gpu_h200/record_gpu_health.py's JSON: {"samples": [{"cards": [{query: value |
    {"error": text}}]}]}, one sample picked) answered back, with `inject` overriding answers
    ({index: {query: value}}) for the faults a healthy card cannot show. An `{"error": …}` answer
    raises, as NVML did when it was recorded."""

    def __init__(self, recording: Mapping[str, Any], inject: Mapping[int, Mapping[str, Any]] | None = None,
                 *, sample: int = 0) -> None:
        cards = (recording["samples"][sample]["cards"] if "samples" in recording
                 else recording.get("cards", ()))
        self.cards: list[dict[str, Any]] = [dict(c) for c in cards]
        for index, answers in (inject or {}).items():
            self.cards[index].update(answers)

    def count(self) -> int:
        return len(self.cards)

    def query(self, index: int, name: str) -> Any:
        if name not in self.cards[index]:
            raise LookupError(f"{name} was not recorded")
        answer = self.cards[index][name]
        if isinstance(answer, dict) and "error" in answer:
            raise RuntimeError(str(answer["error"]))
        return answer


# The raw recorder's keys (tests/fixtures/gpu_health/h200-2026-12-01/recorded-with-nvml_raw.py) → the
# queries they answer.
_RAW_KEYS: dict[str, str] = {
    "temperature_c": "temperature_gpu",
    "temperature_slowdown_c": "temperature_threshold_slowdown",
    "temperature_shutdown_c": "temperature_threshold_shutdown",
    "ecc_volatile_corrected": "ecc_volatile_corrected",
    "ecc_volatile_uncorrected": "ecc_volatile_uncorrected",
    "ecc_aggregate_corrected": "ecc_aggregate_corrected",
    "ecc_aggregate_uncorrected": "ecc_aggregate_uncorrected",
    "retired_pages_pending": "retired_pages_pending",
    "remapped_rows": "remapped_rows",
    "pcie_gen": "pcie_link_gen_curr",
    "pcie_gen_max": "pcie_link_gen_max",
    "pcie_width": "pcie_link_width_curr",
    "pcie_width_max": "pcie_link_width_max",
    "name": "name",
}


def recording_from_raw(raw_card: Mapping[str, Any]) -> dict[str, Any]:
    """One card of a raw NVML recording ({call: {"ok": v} | {"error": e}}) as `CardQueries` answers."""
    def get(key: str) -> Any:
        entry = raw_card.get(key)
        if not isinstance(entry, Mapping):
            return {"error": f"{key} was not recorded"}
        return entry["ok"] if "ok" in entry else {"error": entry.get("error", "?")}

    out: dict[str, Any] = {query: get(key) for query, key in _RAW_KEYS.items()}
    pci, util = get("pci"), get("utilization")
    out["pci_bus_id"] = pci.get("busId", pci) if isinstance(pci, Mapping) and "error" not in pci else pci
    out["utilization_percent"] = util.get("gpu", util) if isinstance(util, Mapping) and "error" not in util \
        else util
    for query, key in (("power_w", "power_usage_mw"), ("power_limit_w", "enforced_power_limit_mw")):
        value = get(key)
        out[query] = value / 1000.0 if isinstance(value, (int, float)) else value
    # Drivers with the renamed API record both; they are the same bits.
    out["throttle_reasons"] = get("clocks_event_reasons" if "clocks_event_reasons" in raw_card
                                  else "clocks_throttle_reasons")
    sbe, dbe = get("retired_pages_sbe"), get("retired_pages_dbe")
    out["retired_pages"] = (len(sbe) + len(dbe) if isinstance(sbe, list) and isinstance(dbe, list)
                            else sbe if isinstance(sbe, Mapping) else dbe)
    return out


# --- AMD / Hygon sysfs --------------------------------------------------------------------------

_SPEED = re.compile(r"([\d.]+)\s*GT/s")
# PCIe transfer rate per lane → generation (PCI-SIG: 2.5, 5, 8, 16, 32, 64 GT/s).
_GEN_BY_GTS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}


def pcie_gen(speed: str | None) -> int | None:
    m = _SPEED.search(speed or "")
    return _GEN_BY_GTS.get(float(m.group(1))) if m else None


def _sysfs_int(text: str | None) -> int | None:
    try:
        return int((text or "").strip(), 0)
    except ValueError:
        return None


def ras_counts(text: str) -> tuple[int | None, int | None]:
    """(uncorrectable, correctable) from a `ras/<block>_err_count` file ("ue: 0\\nce: 3")."""
    values = dict(re.findall(r"^\s*(ue|ce)\s*:\s*(\d+)", text, re.MULTILINE))
    return (int(values["ue"]) if "ue" in values else None, int(values["ce"]) if "ce" in values else None)


def parse_amdgpu_health(index: int, vendor: str, files: Mapping[str, str], pci: str | None = None
                        ) -> CardHealth:
    """One amdgpu/DCU card from its sysfs files (path relative to the card's `device/` → content)."""
    blind: list[str] = []

    def hwmon(name: str, scale: float) -> float | None:
        raw = next((v for k, v in sorted(files.items()) if k.startswith("hwmon/") and k.endswith("/" + name)),
                   None)
        value = _sysfs_int(raw)
        return value / scale if value is not None else None

    temp = hwmon("temp1_input", 1000)
    power = hwmon("power1_average", 1e6)
    if power is None:
        power = hwmon("power1_input", 1e6)
    ue = ce = None
    for path, text in files.items():
        if path.startswith("ras/") and path.endswith("_err_count"):
            u, c = ras_counts(text)
            ue = (ue or 0) + u if u is not None else ue
            ce = (ce or 0) + c if c is not None else ce
    busy = _sysfs_int(files.get("gpu_busy_percent"))
    card = CardHealth(
        index=index, vendor=vendor, pci=pci,
        temperature_c=temp, temperature_slowdown_c=hwmon("temp1_crit", 1000),
        temperature_shutdown_c=hwmon("temp1_emergency", 1000),
        power_w=power, power_limit_w=hwmon("power1_cap", 1e6),
        ecc_aggregate_uncorrected=ue, ecc_aggregate_corrected=ce,
        pcie_gen=pcie_gen(files.get("current_link_speed")),
        pcie_gen_max=pcie_gen(files.get("max_link_speed")),
        pcie_width=_sysfs_int(files.get("current_link_width")),
        pcie_width_max=_sysfs_int(files.get("max_link_width")),
        utilization_percent=float(busy) if busy is not None and 0 <= busy <= 100 else None,
    )
    for name in ("temperature_c", "power_w", "ecc_aggregate_uncorrected", "pcie_gen", "pcie_width"):
        if getattr(card, name) is None:
            blind.append(name)
    return card.model_copy(update={"blind": tuple(blind)})


# --- assessment ---------------------------------------------------------------------------------


class HealthFinding(BaseModel):
    model_config = ConfigDict(frozen=True)

    card: int
    check: str  # throttling | hot | ecc-uncorrectable | remap-pending | … (bounded: a metric label)
    verdict: Verdict
    message: str


def assess(card: CardHealth, fatal_events: Iterable[GpuEvent] = ()) -> list[HealthFinding]:
    """What an operator must hear about one card before a launch on it. `fatal_events`: fatal kernel
    events on this card since it was last reset (the watch keeps them)."""
    out: list[HealthFinding] = []

    def add(check: str, verdict: Verdict, message: str) -> None:
        out.append(HealthFinding(card=card.index, check=check, verdict=verdict, message=f"GPU {card.index}: "
                                 + message))

    if card.lost:
        add("lost", "refuse", "the card does not answer (fallen off the bus): drain the node and reboot it")
    for event in fatal_events:
        add("fatal-event", "refuse", f"{event.describe()} since the card was last reset: reset the card "
            f"(nvidia-smi -r / a reboot), then `appliance gpu reset-done {card.index}`")
    if card.remap_failure:
        add("remap-failure", "refuse", "a row remapping failed (no spare rows): the card needs service")
    t, slow, stop = card.temperature_c, card.temperature_slowdown_c, card.temperature_shutdown_c
    if t is not None and stop is not None and t >= stop:
        add("overheat", "refuse", f"{t:.0f} °C is at its shutdown temperature {stop:.0f} °C: check cooling")
    elif t is not None and slow is not None and t >= slow - HOT_MARGIN_C:
        add("hot", "warn", f"{t:.0f} °C, slowdown at {slow:.0f} °C: check cooling")
    # A busy card at its software power cap is doing its job (the cap is what it is set to draw);
    # idle at the cap, or any thermal/hardware slowdown, costs speed nobody asked for.
    busy = (card.utilization_percent or 0) > 0
    slowing = [r for r in card.slowing if not (busy and r == "sw_power_cap")]
    if slowing:
        add("throttling", "warn", f"clocks held back by {', '.join(slowing)}"
            + (f" ({card.power_w:.0f} of {card.power_limit_w:.0f} W)" if card.power_w is not None
               and card.power_limit_w is not None else ""))
    ue = max(card.ecc_volatile_uncorrected or 0, card.ecc_aggregate_uncorrected or 0)
    if ue:
        add("ecc-uncorrectable", "warn", f"{ue} uncorrectable ECC error(s) recorded: reset the card and "
            "watch for more (repeated ones: replace it)")
    if card.remap_pending or card.retired_pages_pending:
        add("remap-pending", "warn", "memory rows/pages are waiting to be remapped or retired: reset the "
            "card when it is idle")
    width, width_max = card.pcie_width, card.pcie_width_max
    if width is not None and width_max is not None and width < width_max:
        add("pcie-link", "warn", f"PCIe link x{width} of x{width_max}: reseat the card "
            "or check the slot (cross-card copies and P2P depend on the link, DOMAIN §6)")
    # NVIDIA and AMD lower the link *generation* at idle to save power: only a busy card's gen counts.
    elif (card.pcie_gen is not None and card.pcie_gen_max is not None and card.pcie_gen < card.pcie_gen_max
          and (card.utilization_percent or 0) > 0):
        add("pcie-link", "warn", f"PCIe gen {card.pcie_gen} of {card.pcie_gen_max} while busy: check the "
            "slot and BIOS link settings (P2P depends on the link, DOMAIN §6)")
    return out


def verdict_of(findings: Iterable[HealthFinding]) -> Verdict:
    rank = {"admit": 0, "warn": 1, "refuse": 2}
    return max((f.verdict for f in findings), key=rank.__getitem__, default="admit")


def card_line(card: CardHealth) -> str:
    """One line an operator reads: `appliance plan`, the console's GPU health panel."""
    def num(value: float | None, unit: str) -> str:
        return "?" if value is None else f"{value:.0f}{unit}"

    parts = [f"GPU {card.index}" + (f" {card.name}" if card.name else "") + f" ({card.vendor})"]
    if card.lost:
        return parts[0] + ": LOST (does not answer)"
    parts.append(f"{num(card.temperature_c, ' °C')} (slowdown {num(card.temperature_slowdown_c, '')})")
    parts.append(f"{num(card.power_w, '')}/{num(card.power_limit_w, ' W')}")
    if card.pcie_gen is not None or card.pcie_width is not None:
        parts.append(f"PCIe gen{card.pcie_gen or '?'} x{card.pcie_width or '?'} of "
                     f"gen{card.pcie_gen_max or '?'} x{card.pcie_width_max or '?'}")
    ue = [v for v in (card.ecc_volatile_uncorrected, card.ecc_aggregate_uncorrected) if v is not None]
    parts.append(f"ECC uncorrectable {max(ue)}" if ue else "ECC ?")
    if card.remap_pending is not None or card.retired_pages_pending is not None:
        pending = card.remap_pending or card.retired_pages_pending
        parts.append("remap pending" if pending else "no remap pending")
    if card.slowing:
        parts.append("throttling: " + ", ".join(card.slowing))
    if card.blind:
        parts.append(f"{len(card.blind)} fact(s) unreadable")
    return f"{parts[0]}: {', '.join(parts[1:])}"

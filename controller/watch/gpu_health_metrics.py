"""Prometheus series of card health and GPU kernel events (registered into ControllerMetrics' registry).

Labels are bounded: `gpu` is a card index (or "unknown" for an event whose card is not known), `vendor`
one of four, `reason` one of NVML's nine throttle reasons, `check` one of `assess`'s checks, `xid` a
code of the Xid table or "other", `kind` one of GpuEventKind's six.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge

from appliance.observe.gpu_events import GpuEvent, xid_label
from appliance.observe.gpu_health import THROTTLE_REASONS, CardHealth, HealthFinding

CHECKS = ("lost", "fatal-event", "remap-failure", "overheat", "hot", "throttling", "ecc-uncorrectable",
          "remap-pending", "pcie-link")
_VERDICT = {"admit": 0, "warn": 1, "refuse": 2}


class GpuHealthMetrics:
    def __init__(self, r: CollectorRegistry) -> None:
        self.temperature = Gauge("appliance_gpu_temperature_celsius", "Card temperature.",
                                 ["gpu", "vendor"], registry=r)
        self.temperature_slowdown = Gauge(
            "appliance_gpu_temperature_slowdown_celsius",
            "The card's own slowdown threshold (NVML) or hwmon temp1_crit (amdgpu).", ["gpu", "vendor"],
            registry=r)
        self.power = Gauge("appliance_gpu_power_watts", "Card power draw.", ["gpu", "vendor"], registry=r)
        self.power_limit = Gauge("appliance_gpu_power_limit_watts", "Card power limit.", ["gpu", "vendor"],
                                 registry=r)
        self.throttling = Gauge(
            "appliance_gpu_throttle_reason",
            "1 while the card's clocks are held back for this reason (NVML clocks event reasons).",
            ["gpu", "reason"], registry=r)
        self.ecc = Gauge("appliance_gpu_ecc_errors", "ECC error counts (volatile: since the driver loaded).",
                         ["gpu", "vendor", "type", "counter"], registry=r)
        self.remap_pending = Gauge("appliance_gpu_row_remap_pending",
                                   "1 while rows/pages wait for a card reset to be remapped/retired.",
                                   ["gpu"], registry=r)
        self.pcie = Gauge("appliance_gpu_pcie_link", "PCIe link generation and width, current and max.",
                          ["gpu", "what", "which"], registry=r)
        self.lost = Gauge("appliance_gpu_lost", "1 when the card stopped answering (fallen off the bus).",
                          ["gpu"], registry=r)
        self.verdict = Gauge("appliance_gpu_health_verdict",
                             "What admission would say of the card: 0 admit, 1 warn, 2 refuse.",
                             ["gpu"], registry=r)
        self.finding = Gauge("appliance_gpu_health_finding", "1 while the card has this finding.",
                             ["gpu", "check"], registry=r)
        self.blind = Gauge("appliance_gpu_health_blind_facts",
                           "How many health facts of the card could not be read.", ["gpu"], registry=r)
        self.events = Counter(
            "appliance_gpu_kernel_events", "GPU events in the kernel log (Xid, amdgpu reset/ring "
            "timeout/RAS/page fault).", ["gpu", "kind", "xid", "side", "fatal"], registry=r)
        self.events_fatal_last = Gauge(
            "appliance_gpu_kernel_event_fatal_timestamp_seconds",
            "Wall-clock time of the last fatal GPU kernel event on the card.", ["gpu"], registry=r)

    def observe(self, cards: Iterable[CardHealth], findings: Iterable[HealthFinding]) -> None:
        by_card: dict[int, list[HealthFinding]] = {}
        for f in findings:
            by_card.setdefault(f.card, []).append(f)
        for c in cards:
            gpu, vendor = str(c.index), c.vendor
            for gauge, value in ((self.temperature, c.temperature_c),
                                 (self.temperature_slowdown, c.temperature_slowdown_c),
                                 (self.power, c.power_w), (self.power_limit, c.power_limit_w)):
                if value is not None:
                    gauge.labels(gpu, vendor).set(value)
            if c.vendor == "nvidia" and "throttle_reasons" not in c.blind:
                for reason in THROTTLE_REASONS.values():
                    self.throttling.labels(gpu, reason).set(1 if reason in c.throttle_reasons else 0)
            for typ, counter, value in (("corrected", "volatile", c.ecc_volatile_corrected),
                                        ("uncorrected", "volatile", c.ecc_volatile_uncorrected),
                                        ("corrected", "aggregate", c.ecc_aggregate_corrected),
                                        ("uncorrected", "aggregate", c.ecc_aggregate_uncorrected)):
                if value is not None:
                    self.ecc.labels(gpu, vendor, typ, counter).set(value)
            if c.remap_pending is not None or c.retired_pages_pending is not None:
                self.remap_pending.labels(gpu).set(1 if (c.remap_pending or c.retired_pages_pending) else 0)
            for what, which, value in (("generation", "current", c.pcie_gen),
                                       ("generation", "max", c.pcie_gen_max),
                                       ("width", "current", c.pcie_width),
                                       ("width", "max", c.pcie_width_max)):
                if value is not None:
                    self.pcie.labels(gpu, what, which).set(value)
            self.lost.labels(gpu).set(1 if c.lost else 0)
            mine = by_card.get(c.index, [])
            self.verdict.labels(gpu).set(max((_VERDICT[f.verdict] for f in mine), default=0))
            present = {f.check for f in mine}
            for check in CHECKS:
                self.finding.labels(gpu, check).set(1 if check in present else 0)
            self.blind.labels(gpu).set(len(c.blind))

    def record_event(self, event: GpuEvent, now: float) -> None:
        gpu = str(event.card) if event.card is not None else "unknown"
        self.events.labels(gpu, event.kind.value, xid_label(event), event.side.value,
                           "true" if event.fatal else "false").inc()
        if event.fatal:
            self.events_fatal_last.labels(gpu).set(now)

"""Every Prometheus metric of the controller, in one module and one registry (prefix `appliance_`).

The dashboards (`monitoring/grafana/dashboards/`) and alert rules (`monitoring/prometheus/rules/`)
query exactly these names; the gateway has its own (`appliance_gateway_*`,
`controller/gateway/metrics.py`); the engine exports vLLM's own `vllm:*`.

One `ControllerMetrics` object holds them, each with its own registry (as the gateway's
`GatewayMetrics`): `controller/service.py` builds one and hands it to the Driver, the host watch
(`HostWatchLink`), the GPU watch and the evaluation router; `GET /metrics` renders it. A unit test
builds a fresh one and asserts on its values. The supervisor and the watchers call these methods
(nothing else touches the metric objects):

- `set_engine_state(state)` → `appliance_engine_state{state}`: 1 for the current state, 0 for the
  others. The states are the supervisor's own (`controller.supervisor.machine.State`: idle,
  preflight, starting, ready, draining, stopping, backoff, failed), all present at 0 from start-up.
- `begin_launch(recipe, cache, *, ready_budget_s, min_mem_available_bytes, started_at)` → counts
  `appliance_engine_launches_total{recipe,cache}` (cache "cold"/"warm"), sets
  `appliance_engine_launch_start_timestamp_seconds{recipe}` (wall clock),
  `appliance_engine_ready_budget_seconds{recipe}`, `appliance_launch_memory_available_target_bytes{recipe}`,
  `appliance_engine_ready{recipe}` = 0, and drops the previous launch's per-launch series.
- `set_engine_phase(recipe, phase, since_start_s)` → `appliance_engine_phase{phase}` (1 for the
  latest, 0 for earlier ones) and `appliance_engine_phase_reached_seconds{recipe,phase}`.
- `record_ready(recipe, cache, seconds)` → histogram `appliance_engine_ready_seconds{recipe,cache}`,
  `appliance_engine_last_ready_seconds{recipe,cache}`, `appliance_engine_ready{recipe}` = 1.
- `adopt_launch(recipe, *, min_mem_available_bytes)` → an adopted engine: `appliance_engine_ready{recipe}`
  = 0 until it answers, and the recipe's MemAvailable target (its start time and budget were the
  launching controller's). `set_mem_available_target(recipe, bytes)` sets the target alone (None clears).
- `set_engine_ready(recipe)` → `appliance_engine_ready{recipe}` = 1 without a ready-time sample (an
  adopted engine: its start was measured by the controller that launched it).
- `end_launch(recipe)` → the engine is gone (exited, stopped, never started):
  `appliance_engine_ready{recipe}` = 0, and the start timestamp / ready budget / MemAvailable target
  series are dropped, so "not ready past its budget" and "MemAvailable below the recipe's target"
  cannot fire for an engine that no longer exists.
- `record_compile_cache(recipe, start, result)` → `appliance_engine_compile_cache_total{recipe,start,result}`
  (start: cold/warm; result: hit/miss/unknown, as `appliance.observe.log_phases.CacheOutcome`).
- `record_compile_cache_miss(reason)` → `appliance_compile_cache_misses_total{reason}`: why a start
  missed (`appliance.recipe.compile_factors.MissReason`: env, flag, version, model, cache_emptied,
  cold_first, unknown), every reason present at 0 from start-up. Not labelled by recipe: the launch
  record names the launch and the factor; the alert needs only "a warm restart missed, and why".
- `record_restart(recipe, reason)` → `appliance_engine_restarts_total{recipe,reason}`.
- `record_switch(path, cut)` → `appliance_engine_switches_total{path}` (how a planned switch went:
  `hold` = drain, stop, start with the gateway holding new requests; `stop` = drain and stop, nothing
  follows; `blue_green` = the new engine started beside the old one, the gateway switched with no
  hold, then the old one drained and stopped) and `appliance_drain_cut_requests_total` (in-flight
  requests cut at the drain deadline).
- `record_oom_event(event)` → kills only (not reaper lines): `appliance_oom_kills_total{constraint}`,
  `appliance_oom_victim_kills_total{constraint,victim}`,
  `appliance_oom_last_kill_timestamp_seconds{constraint}`.
- `record_cgroup_oom_kills(n)` → `appliance_cgroup_oom_kills_total` (memory.events/oom_control witness).
- `record_kmsg_gap(gap)` → `appliance_kmsg_lost_records_total`.
- `record_console_login_failure(reason)` → `appliance_console_login_failures_total{reason}` (refused,
  throttled = refused with the answer held back; both present at 0 from start-up): failed console log-ins.
- `observe_host(sample)` → `appliance_host_memory_total_bytes`, `appliance_host_memory_available_bytes`,
  `appliance_host_swap_total_bytes`, `appliance_host_swap_used_bytes`, `appliance_host_swappiness`,
  `appliance_host_memory_pressure_ratio{kind,window}` (kind some/full, window 10s/60s/300s),
  `appliance_engine_process_{anon,rss,swap}_bytes{pid,comm}`, `appliance_engine_anon_bytes`.
- `observe_watermarks(recipe, marks)` → `appliance_launch_memory_available_min_bytes{recipe}`,
  `appliance_launch_swap_used_peak_bytes{recipe}`, `appliance_launch_engine_anon_peak_bytes{recipe}`,
  `appliance_launch_memory_pressure_peak_ratio{recipe,kind}`.
- `observe_gpus(samples)` → `appliance_gpu_memory_used_bytes{gpu,vendor}`,
  `appliance_gpu_memory_total_bytes{gpu,vendor}`, `appliance_gpu_utilization_ratio{gpu,vendor}` (NVML or
  amdgpu sysfs, controller/watch/gpu.py).
- `render()` → `(body, content_type)`: this registry alone. The admin API's `GET /metrics` renders the
  primary engine's registry merged with the `PER_ENGINE_FAMILIES` of every engine beside it, each of
  their samples labelled `model` (`controller/supervisor/engine_metrics.py`).

Why two OOM counters: a counter series that is born at 1 (a new `victim` label value) has no
earlier sample, so `increase()` cannot see its first kill; `appliance_oom_kills_total{constraint}`
exists at 0 from start-up for every constraint and is what alerts use, the victim-labelled one is
for dashboards. Label values are bounded: constraint ∈ {global, cgroup, cpuset, mempolicy,
unknown}, victim = the kernel's 15-character comm.

Units are Prometheus base units: bytes, seconds, ratios 0..1 (PSI percentages / 100).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from appliance.observe.gpu_mem import GpuSample
from appliance.observe.kmsg import OomEvent, OomEventKind, OomScope, SeqGap
from appliance.observe.procfs import ProcessMemory
from appliance.recipe.compile_factors import MissReason
from controller.watch.gpu_health_metrics import GpuHealthMetrics
from controller.watch.sampler import HostSample, Watermarks

# The supervisor's states by name (controller.supervisor.machine.State's values, in its order): alert
# rules and dashboards select these label values. Names, not the enum: metrics sit below the
# supervisor, which hands them `state.value`; tests/unit/test_monitoring_rules.py holds this tuple
# to State. Unknown states are added on use.
ENGINE_STATES = ("idle", "preflight", "starting", "ready", "draining", "stopping", "backoff", "failed",
                 "exited")
CACHE_KINDS = ("cold", "warm")
COMPILE_RESULTS = ("hit", "miss", "unknown")  # appliance.observe.log_phases.CacheOutcome values
LOGIN_FAILURE_REASONS = ("refused", "throttled")  # console log-ins (controller/console/routes/login.py)
# Ready times span 36 s (CPU engine warm, MEASURED) to 1645 s (recipe C′) and the 2700 s budget.
READY_BUCKETS = (15, 30, 45, 60, 90, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600, 5400)


# How a planned switch of the engine went (`record_switch`).
SWITCH_PATHS = ("hold", "stop", "blue_green")

# The families a driver writes for its own engine (launch_recorder.py, hold_keeper.py, the driver's
# state): an engine beside the primary records them into a registry of its own, and `GET /metrics`
# exports them beside the primary's under the same family, labelled with its model. The rest are the
# host's, kept in the primary's registry only: host memory, PSI, OOM kills, GPUs, the launch watermarks
# and engine process memory (the host watch attributes them to the primary's launch), console log-ins,
# choices, benchmarks. tests/unit/test_engine_metrics.py drives a driver through its launches and
# fails when it writes a family not named here.
PER_ENGINE_FAMILIES = frozenset({
    "appliance_engine_state", "appliance_engine_phase", "appliance_engine_phase_reached_seconds",
    "appliance_engine_launches", "appliance_engine_restarts",
    "appliance_engine_launch_start_timestamp_seconds", "appliance_engine_ready_budget_seconds",
    "appliance_engine_ready", "appliance_engine_ready_seconds", "appliance_engine_last_ready_seconds",
    "appliance_engine_compile_cache", "appliance_compile_cache_misses",
    "appliance_launch_memory_available_target_bytes", "appliance_engine_switches",
    "appliance_drain_cut_requests",
})


class _EngineProcessCollector(Collector):
    """Per-process memory of the engine from the latest sample. A snapshot collector, not gauges
    with labels: exited pids must vanish at once instead of lingering as stale series."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: tuple[ProcessMemory, ...] = ()
        self._sampled = False

    def set(self, procs: Iterable[ProcessMemory]) -> None:
        with self._lock:
            self._procs = tuple(procs)
            self._sampled = True

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            procs, sampled = self._procs, self._sampled
        families = {
            "anon": GaugeMetricFamily("appliance_engine_process_anon_bytes",
                                      "RssAnon of each engine process (smaps_rollup Anonymous).",
                                      labels=["pid", "comm"]),
            "rss": GaugeMetricFamily("appliance_engine_process_rss_bytes", "RSS of each engine process.",
                                     labels=["pid", "comm"]),
            "swap": GaugeMetricFamily("appliance_engine_process_swap_bytes",
                                      "Swapped-out memory of each engine process.", labels=["pid", "comm"]),
        }
        for p in procs:
            labels = [str(p.pid), p.comm or "?"]
            families["anon"].add_metric(labels, p.anon_bytes)
            families["rss"].add_metric(labels, p.rss_bytes)
            families["swap"].add_metric(labels, p.swap_bytes)
        yield from families.values()
        total = GaugeMetricFamily("appliance_engine_anon_bytes", "Summed RssAnon of the engine's processes.")
        if sampled:
            total.add_metric([], sum(p.anon_bytes for p in procs))
        yield total


# --- benchmarks and fingerprints (controller/evaluation/) ---------------------------------------------
# Read from the store at scrape time, so results recorded by `appliance bench|compare|fingerprint`
# (which write the database directly) show up as well as those of `POST /compare`.
#   appliance_bench_score{recipe}                         latest weighted score (output tokens/s, DOMAIN §7)
#   appliance_bench_p99_ttft_seconds{recipe}, appliance_bench_p99_tpot_seconds{recipe}
#   appliance_bench_decode_seconds_per_token{recipe}      single-stream decode median
#   appliance_bench_last_timestamp_seconds{recipe}
#   appliance_reproducibility_mismatch{recipe,measured}   1 when the latest fingerprint contradicts
#                                                         the recipe's declared expect.reproducibility

EvaluationSource = Callable[[], dict[str, dict[str, Any]]]


class _EvaluationCollector(Collector):
    def __init__(self) -> None:
        self.source: EvaluationSource | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        latest = self.source() if self.source is not None else {}
        fams = {
            "score": GaugeMetricFamily("appliance_bench_score", "Latest benchmark score "
                                       "0.20*thr(4-8K)+0.50*thr(8-16K)+0.30*thr(16-32K), output tokens/s.",
                                       labels=["recipe"]),
            "ttft": GaugeMetricFamily("appliance_bench_p99_ttft_seconds", "Latest benchmark P99 TTFT.",
                                      labels=["recipe"]),
            "tpot": GaugeMetricFamily("appliance_bench_p99_tpot_seconds", "Latest benchmark P99 TPOT.",
                                      labels=["recipe"]),
            "decode": GaugeMetricFamily("appliance_bench_decode_seconds_per_token",
                                        "Latest single-stream decode median per token.", labels=["recipe"]),
            "at": GaugeMetricFamily("appliance_bench_last_timestamp_seconds", "When the latest bench ended.",
                                    labels=["recipe"]),
            "mismatch": GaugeMetricFamily("appliance_reproducibility_mismatch",
                                          "1: latest fingerprint contradicts the declared reproducibility.",
                                          labels=["recipe", "measured"]),
        }
        for recipe, row in sorted(latest.items()):
            if row.get("score") is not None:
                fams["score"].add_metric([recipe], float(row["score"]))
                fams["at"].add_metric([recipe], float(row["created_at"]))
            columns = (("ttft", "p99_ttft_ms"), ("tpot", "p99_tpot_ms"), ("decode", "decode_ms_median"))
            for key, col in columns:
                if row.get(col) is not None:
                    fams[key].add_metric([recipe], float(row[col]) / 1000.0)
            if "mismatch" in row:
                fams["mismatch"].add_metric([recipe, str(row["measured"])], 1.0 if row["mismatch"] else 0.0)
        yield from fams.values()


CHOICE_OUTCOMES = ("done", "stopped-budget", "failed", "interrupted", "none-admitted")


class ControllerMetrics:
    """The controller's metrics in a registry of their own (one per instance: a unit test gets clean
    series, and two controllers in one process do not share counters)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.gpu_health = GpuHealthMetrics(r)  # card health and GPU kernel events (its own module)

        # --- engine lifecycle
        self.engine_state = Gauge(
            "appliance_engine_state", "Supervisor state of the engine slot: 1 for the current state.",
            ["state"], registry=r,
        )
        self.engine_phase = Gauge(
            "appliance_engine_phase", "Start-up phase from the engine log: 1 for the latest phase reached.",
            ["phase"], registry=r,
        )
        self.engine_phase_reached_seconds = Gauge(
            "appliance_engine_phase_reached_seconds",
            "Seconds after launch at which the current launch reached each phase.", ["recipe", "phase"],
            registry=r,
        )
        self.engine_launches_total = Counter(
            "appliance_engine_launches", "Engine launches by recipe and compile cache state (cold/warm).",
            ["recipe", "cache"], registry=r,
        )
        self.engine_restarts_total = Counter(
            "appliance_engine_restarts", "Engine restarts by the supervisor, by reason.",
            ["recipe", "reason"], registry=r,
        )
        self.engine_launch_start = Gauge(
            "appliance_engine_launch_start_timestamp_seconds", "Wall-clock start of the current launch.",
            ["recipe"], registry=r,
        )
        self.engine_ready_budget = Gauge(
            "appliance_engine_ready_budget_seconds", "How long the current launch may take to become ready.",
            ["recipe"], registry=r,
        )
        self.engine_ready = Gauge(
            "appliance_engine_ready", "1 once the current launch answered health and a real completion.",
            ["recipe"], registry=r,
        )
        self.engine_ready_seconds = Histogram(
            "appliance_engine_ready_seconds", "Launch to ready, by recipe and cache state.",
            ["recipe", "cache"], buckets=READY_BUCKETS, registry=r,
        )
        self.engine_last_ready_seconds = Gauge(
            "appliance_engine_last_ready_seconds",
            "Launch to ready of the latest launch per recipe and cache state.", ["recipe", "cache"],
            registry=r,
        )
        self.engine_compile_cache_total = Counter(
            "appliance_engine_compile_cache",
            "Compile cache outcome per start from the engine log "
            "(start: cold/warm; result: hit/miss/unknown).",
            ["recipe", "start", "result"], registry=r,
        )
        self.compile_cache_misses_total = Counter(
            "appliance_compile_cache_misses",
            "Compile cache misses by why (the launch record's compare with the earlier launch on its root).",
            ["reason"], registry=r,
        )

        # --- OOM
        self.oom_kills_total = Counter(
            "appliance_oom_kills", "Kernel OOM kills seen in /dev/kmsg, by constraint (global, cgroup, ...).",
            ["constraint"], registry=r,
        )
        self.oom_victim_kills_total = Counter(
            "appliance_oom_victim_kills", "Kernel OOM kills by constraint and victim task name.",
            ["constraint", "victim"], registry=r,
        )
        self.oom_last_kill = Gauge(
            "appliance_oom_last_kill_timestamp_seconds",
            "Wall-clock time the latest OOM kill was seen, by constraint.", ["constraint"], registry=r,
        )
        self.cgroup_oom_kills_total = Counter(
            "appliance_cgroup_oom_kills",
            "OOM kills counted by the engine container's cgroup (memory.events).",
            registry=r,
        )
        self.kmsg_lost_records_total = Counter(
            "appliance_kmsg_lost_records", "Kernel log records overwritten before the watcher read them.",
            registry=r,
        )
        self.console_login_failures_total = Counter(
            "appliance_console_login_failures",
            "Console log-ins refused: refused (wrong or unconfigured token, answered at once), throttled "
            "(the same, answered after a delay: too many failures from the client's address).", ["reason"],
            registry=r,
        )
        for reason in LOGIN_FAILURE_REASONS:
            self.console_login_failures_total.labels(reason)
        self.engine_switches_total = Counter(
            "appliance_engine_switches", "Planned switches of the engine by path: hold (drain, stop, start "
            "with the gateway holding new requests), stop (drain and stop, nothing follows), blue_green "
            "(the new engine started beside the old one, then the gateway switched with no hold).", ["path"],
            registry=r,
        )
        for path in SWITCH_PATHS:
            self.engine_switches_total.labels(path)
        self.drain_cut_requests_total = Counter(
            "appliance_drain_cut_requests", "In-flight requests cut at the drain deadline before a stop.",
            registry=r,
        )

        # --- host memory
        self.host_mem_total = Gauge("appliance_host_memory_total_bytes", "MemTotal.", registry=r)
        self.host_mem_available = Gauge("appliance_host_memory_available_bytes", "MemAvailable.", registry=r)
        self.host_swap_total = Gauge("appliance_host_swap_total_bytes", "Swap areas' total size.", registry=r)
        self.host_swap_used = Gauge("appliance_host_swap_used_bytes", "Swap in use.", registry=r)
        self.host_swappiness = Gauge("appliance_host_swappiness", "vm.swappiness (0..200).", registry=r)
        self.host_pressure = Gauge(
            "appliance_host_memory_pressure_ratio",
            "Memory PSI: share of time some/all tasks stalled on memory, averaged over 10/60/300 s.",
            ["kind", "window"], registry=r,
        )
        self.launch_mem_available_min = Gauge(
            "appliance_launch_memory_available_min_bytes",
            "Lowest MemAvailable seen during the current launch.",
            ["recipe"], registry=r,
        )
        self.launch_mem_available_target = Gauge(
            "appliance_launch_memory_available_target_bytes",
            "The recipe's floor for MemAvailable (expectations.min_mem_available_gib).", ["recipe"],
            registry=r,
        )
        self.launch_swap_peak = Gauge(
            "appliance_launch_swap_used_peak_bytes", "Highest swap use seen during the current launch.",
            ["recipe"], registry=r,
        )
        self.launch_engine_anon_peak = Gauge(
            "appliance_launch_engine_anon_peak_bytes",
            "Highest summed RssAnon of the engine's processes during the current launch.", ["recipe"],
            registry=r,
        )
        self.launch_pressure_peak = Gauge(
            "appliance_launch_memory_pressure_peak_ratio",
            "Highest memory PSI avg10 during the current launch.",
            ["recipe", "kind"], registry=r,
        )

        # --- GPUs
        self.gpu_mem_used = Gauge("appliance_gpu_memory_used_bytes",
                                  "GPU memory in use (NVML / amdgpu sysfs).", ["gpu", "vendor"], registry=r)
        self.gpu_mem_total = Gauge("appliance_gpu_memory_total_bytes", "GPU memory in total.",
                                   ["gpu", "vendor"], registry=r)
        self.gpu_utilization = Gauge("appliance_gpu_utilization_ratio",
                                     "GPU busy, 0..1 (NVML utilization.gpu / amdgpu gpu_busy_percent).",
                                     ["gpu", "vendor"], registry=r)

        # --- choices (`appliance choose`, controller/evaluation/choose.py)
        self.choice_candidates_total = Counter(
            "appliance_choice_candidates",
            "Candidates a choice tried, by outcome (the gate's verdict, failed-start, stale, error).",
            ["outcome"], registry=r,
        )
        self.choice_runs_total = Counter(
            "appliance_choice_runs",
            "Choices that ended, by how (done, stopped-budget, failed, none-admitted: no recipe admitted).",
            ["outcome"], registry=r,
        )
        self.choice_duration = Gauge(
            "appliance_choice_duration_seconds", "How long the latest choice took, start to end.", registry=r,
        )
        self.choice_running = Gauge("appliance_choice_running", "1 while a choice runs.", registry=r)

        self._engine_processes = _EngineProcessCollector()
        r.register(self._engine_processes)
        self._evaluation = _EvaluationCollector()
        r.register(self._evaluation)

        self._lock = threading.Lock()
        self._states_seen: set[str] = set(ENGINE_STATES)
        self._phases_seen: set[str] = set()
        for s in ENGINE_STATES:
            self.engine_state.labels(s).set(0)
        for reason in MissReason:
            self.compile_cache_misses_total.labels(reason.value)
        for outcome in CHOICE_OUTCOMES:  # present at 0, so `increase()` sees the first one
            self.choice_runs_total.labels(outcome)
        for scope in OomScope:
            self.oom_kills_total.labels(scope.value)
            self.oom_last_kill.labels(scope.value).set(0)

    # --- the supervisor ------------------------------------------------------------------------

    def set_engine_state(self, state: str) -> None:
        state = state.lower()
        with self._lock:
            self._states_seen.add(state)
            for s in self._states_seen:
                self.engine_state.labels(s).set(1 if s == state else 0)

    def begin_launch(
        self,
        recipe: str,
        cache: str,
        *,
        ready_budget_s: float,
        min_mem_available_bytes: int | None,
        started_at: float,
    ) -> None:
        """A new launch of `recipe` starts (cache: "cold" or "warm"). Per-launch series of the previous
        launch are dropped, so alerts compare against the current recipe only."""
        with self._lock:
            for g in (self.engine_launch_start, self.engine_ready_budget, self.engine_ready,
                      self.launch_mem_available_target, self.launch_mem_available_min, self.launch_swap_peak,
                      self.launch_engine_anon_peak, self.launch_pressure_peak,
                      self.engine_phase_reached_seconds, self.engine_phase):
                g.clear()
            self._phases_seen.clear()
        self.engine_launches_total.labels(recipe, cache).inc()
        # Create the outcome series at 0 before the log says anything: a counter born at 1 is invisible
        # to increase() (the warm-miss alert).
        for start in CACHE_KINDS:
            for result in COMPILE_RESULTS:
                self.engine_compile_cache_total.labels(recipe, start, result)
        self.engine_launch_start.labels(recipe).set(started_at)
        self.engine_ready_budget.labels(recipe).set(ready_budget_s)
        self.engine_ready.labels(recipe).set(0)
        if min_mem_available_bytes is not None:
            self.launch_mem_available_target.labels(recipe).set(min_mem_available_bytes)

    def adopt_launch(self, recipe: str, *, min_mem_available_bytes: int | None) -> None:
        """An engine of `recipe` is adopted (a controller restart): the current launch again, not
        ready until it answers its probes, with the recipe's MemAvailable floor. Its start time,
        budget and ready time were the launching controller's and are not re-published."""
        with self._lock:
            for g in (self.engine_ready, self.launch_mem_available_target):
                g.clear()
        self.engine_ready.labels(recipe).set(0)
        self.set_mem_available_target(recipe, min_mem_available_bytes)

    def set_mem_available_target(self, recipe: str, target_bytes: int | None) -> None:
        """The running recipe's MemAvailable floor (`MemAvailableBelowRecipeTarget`); None clears it."""
        with self._lock:
            self.launch_mem_available_target.clear()
        if target_bytes is not None:
            self.launch_mem_available_target.labels(recipe).set(target_bytes)

    def set_engine_phase(self, recipe: str, phase: str, since_start_s: float) -> None:
        with self._lock:
            self._phases_seen.add(phase)
            for p in self._phases_seen:
                self.engine_phase.labels(p).set(1 if p == phase else 0)
        self.engine_phase_reached_seconds.labels(recipe, phase).set(since_start_s)

    def record_ready(self, recipe: str, cache: str, seconds: float) -> None:
        self.engine_ready_seconds.labels(recipe, cache).observe(seconds)
        self.engine_last_ready_seconds.labels(recipe, cache).set(seconds)
        self.engine_ready.labels(recipe).set(1)

    def set_engine_ready(self, recipe: str) -> None:
        """The current launch of `recipe` serves (an adopted engine that answered its probes)."""
        self.engine_ready.labels(recipe).set(1)

    def end_launch(self, recipe: str) -> None:
        """The launch of `recipe` ended (exit, stop, failed start): not ready any more, no start in
        progress whose budget could run out, and no MemAvailable floor of an engine that is gone."""
        with self._lock:
            self.engine_ready.labels(recipe).set(0)
            self.engine_launch_start.remove(recipe)  # absent series: nothing to do
            self.engine_ready_budget.remove(recipe)
            self.launch_mem_available_target.clear()

    def record_compile_cache(self, recipe: str, start: str, result: str) -> None:
        """One start's compile cache outcome from the log (DOMAIN §4: a warm start must say `Directly
        load AOT compilation`; `Source code has changed … Recompiling` is a miss)."""
        self.engine_compile_cache_total.labels(recipe, start, result).inc()

    def record_compile_cache_miss(self, reason: MissReason) -> None:
        """One start that missed, by why (cold_first: nothing earlier to reuse, not a fault)."""
        self.compile_cache_misses_total.labels(reason.value).inc()

    def record_restart(self, recipe: str, reason: str) -> None:
        self.engine_restarts_total.labels(recipe, reason).inc()

    def record_switch(self, path: str, cut: int) -> None:
        self.engine_switches_total.labels(path).inc()
        if cut > 0:
            self.drain_cut_requests_total.inc(cut)

    # --- the host watch ------------------------------------------------------------------------

    def record_oom_event(self, event: OomEvent, *, now: float | None = None) -> None:
        """Count a kill (reaper confirmations are not kills and are ignored)."""
        if event.kind is not OomEventKind.KILL:
            return
        constraint = event.scope.value
        self.oom_kills_total.labels(constraint).inc()
        self.oom_victim_kills_total.labels(constraint, event.task or "?").inc()
        self.oom_last_kill.labels(constraint).set(time.time() if now is None else now)

    def record_cgroup_oom_kills(self, n: int) -> None:
        if n > 0:
            self.cgroup_oom_kills_total.inc(n)

    def record_kmsg_gap(self, gap: SeqGap) -> None:
        self.kmsg_lost_records_total.inc(gap.lost)

    def record_console_login_failure(self, reason: str) -> None:
        """`reason`: one of LOGIN_FAILURE_REASONS."""
        self.console_login_failures_total.labels(reason).inc()

    def observe_host(self, sample: HostSample) -> None:
        self.host_mem_total.set(sample.meminfo.mem_total_bytes)
        self.host_mem_available.set(sample.mem_available_bytes)
        self.host_swap_total.set(sample.swap_total_bytes)
        self.host_swap_used.set(sample.swap_used_bytes)
        if sample.swappiness is not None:
            self.host_swappiness.set(sample.swappiness)
        if sample.pressure is not None:
            lines = [("some", sample.pressure.some), ("full", sample.pressure.full)]
            for kind, line in lines:
                if line is None:
                    continue
                self.host_pressure.labels(kind, "10s").set(line.avg10)
                self.host_pressure.labels(kind, "60s").set(line.avg60)
                self.host_pressure.labels(kind, "300s").set(line.avg300)
        self._engine_processes.set(sample.processes)

    def observe_watermarks(self, recipe: str, marks: Watermarks) -> None:
        if marks.mem_available_min_bytes is not None:
            self.launch_mem_available_min.labels(recipe).set(marks.mem_available_min_bytes)
        self.launch_swap_peak.labels(recipe).set(marks.swap_used_peak_bytes)
        self.launch_engine_anon_peak.labels(recipe).set(marks.engine_anon_peak_bytes)
        self.launch_pressure_peak.labels(recipe, "some").set(marks.pressure_some_avg10_peak)
        self.launch_pressure_peak.labels(recipe, "full").set(marks.pressure_full_avg10_peak)

    def observe_gpus(self, samples: Iterable[GpuSample]) -> None:
        for s in samples:
            labels = (str(s.index), s.vendor)
            if s.used_bytes is not None:
                self.gpu_mem_used.labels(*labels).set(s.used_bytes)
            if s.total_bytes is not None:
                self.gpu_mem_total.labels(*labels).set(s.total_bytes)
            if s.busy_percent is not None:
                self.gpu_utilization.labels(*labels).set(s.busy_percent / 100.0)

    # --- evaluation and exposition -------------------------------------------------------------

    def record_choice_candidate(self, outcome: str) -> None:
        self.choice_candidates_total.labels(outcome).inc()

    def choice_started(self) -> None:
        self.choice_running.set(1)

    def choice_ended(self, outcome: str, seconds: float | None) -> None:
        self.choice_running.set(0)
        self.choice_runs_total.labels(outcome).inc()
        if seconds is not None:
            self.choice_duration.set(seconds)

    def set_evaluation_source(self, source: EvaluationSource | None) -> None:
        """Where the benchmark gauges come from (the evaluation store's latest rows per recipe)."""
        self._evaluation.source = source

    def value(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        """One sample's value (tests, the console): None when the series does not exist."""
        return self.registry.get_sample_value(name, labels or {})

    def render(self) -> tuple[bytes, str]:
        """The exposition body and its content type, for `GET /metrics`."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

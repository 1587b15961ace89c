"""The host watch, the effectful half: samples of memory, PSI, swap, GPU memory and health, and kernel OOM
records; the parsing is in `appliance/observe/`.

Modules by role:

- ``cgroup_witness``: The container's own OOM counter: a second witness next to the kernel log
  (effectful).
- ``gpu``: Reading GPU memory and utilisation: NVML on NVIDIA, amdgpu sysfs on AMD/Hygon.
- ``gpu_health``: Reading card health: NVML on NVIDIA (the `CardQueries` seam answered by pynvml), amdgpu
  sysfs on AMD/Hygon. Parsing and judging are appliance/observe/gpu_health.py.
- ``gpu_health_metrics``: Prometheus series of card health and GPU kernel events (registered into
  ControllerMetrics' registry).
- ``grants``: Start-up check of what the host watch and the Docker runtime were granted (effectful,
  read-only).
- ``history``: A bounded in-process history of host samples, for the operator console's memory charts.
- ``kmsg_follower``: Follow `/dev/kmsg` and report OOM kills as they happen (effectful; parsing in
  `appliance.observe.kmsg`).
- ``load_sampler``: The gateway's and the ready engine's `/metrics` sampled into a bounded ring (how busy
  the appliance is: `GET /load`); the figures are `appliance.observe.load_figures`.
- ``procreader``: Read the host's memory files through an injected proc root (effectful; parsing is in
  `appliance.observe.procfs`).
- ``recipe_target``: The running recipe's MemAvailable floor, for the `MemAvailableBelowRecipeTarget`
  alert.
- ``sample_policy``: When the host sampler reads the expensive sources. A pure decision over (clock,
  MemAvailable, launch).
- ``sampler``: Host samples and per-launch low-water marks (effectful sampling; the marks are plain
  folds).
"""

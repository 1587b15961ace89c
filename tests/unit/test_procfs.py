"""procfs/cgroup parsers on text, and the readers over fixture trees (tests/fixtures/procfs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.observe.procfs import (
    MemoryEvents,
    ProcParseError,
    memory_cgroup_of,
    parse_meminfo,
    parse_memory_events,
    parse_oom_control,
    parse_pressure,
    parse_proc_cgroup,
    parse_smaps_rollup,
    parse_stat,
    parse_swappiness,
    parse_swaps,
)
from controller.watch.cgroup_witness import CgroupOomWitness, read_oom_kills, resolve_oom_file
from controller.watch.procreader import ProcReader
from controller.watch.sampler import HostSampler, Watermarks

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "procfs"
TP4 = FIX / "tp4_graph_host" / "proc"
OLD = FIX / "old_kernel_3.10" / "proc"
ID = "3f1c9a7be0d24c56a8e1f2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7"
GIB = 1024**3
KB = 1024


# --- parsers --------------------------------------------------------------------------------------


def test_meminfo_recipe_c_numbers() -> None:
    m = parse_meminfo((TP4 / "meminfo").read_text())
    assert round(m.mem_total_bytes / GIB, 2) == 31.26
    assert round(m.available_bytes / GIB, 2) == 2.35  # DOMAIN §3: recipe C's minimum
    assert round(m.swap_used_bytes / GIB, 2) == 5.40  # and its swap peak
    assert m.fields["HugePages_Total"] == 0  # a count, not kB
    assert m.fields["Active(anon)"] == 21200112 * KB


def test_meminfo_without_memavailable_estimates_it() -> None:
    m = parse_meminfo((OLD / "meminfo").read_text())
    assert m.mem_available_bytes is None
    assert m.available_bytes == (1048576 + 204800 + 2097152) * KB
    assert m.swap_used_bytes == 0


@pytest.mark.parametrize("text", ["", "garbage\n", "MemFree: 1 kB\n"])
def test_meminfo_missing_required_keys(text: str) -> None:
    with pytest.raises(ProcParseError, match="MemTotal"):
        parse_meminfo(text)


def test_swaps_with_escaped_path_and_header_only() -> None:
    areas = parse_swaps((TP4 / "swaps").read_text())
    assert [(a.filename, a.type, a.priority) for a in areas] == [
        ("/swap.img", "file", -2),
        ("/mnt/swap area/swapfile2", "file", -3),
    ]
    assert areas[0].used_bytes == areas[0].size_bytes == 4194300 * KB
    assert parse_swaps((OLD / "swaps").read_text()) == []
    assert parse_swaps("Filename Type Size Used Priority\nbroken line\n/x file a b c\n") == []


def test_swaps_partition_and_deleted_file() -> None:
    text = (
        "Filename Type Size Used Priority\n"
        "/dev/sda2 partition 1000 10 -2\n/swapfile (deleted) file 8 0 -3\n"
    )
    areas = parse_swaps(text)
    assert [(a.filename, a.type, a.size_bytes) for a in areas] == [
        ("/dev/sda2", "partition", 1000 * KB),
        ("/swapfile (deleted)", "file", 8 * KB),
    ]


def test_pressure_ratios_and_seconds() -> None:
    p = parse_pressure((TP4 / "pressure" / "memory").read_text())
    assert p.some.avg10 == pytest.approx(0.2351)
    assert p.some.total_seconds == pytest.approx(48.211932)
    assert p.full is not None and p.full.avg300 == pytest.approx(0.0152)
    only_some = parse_pressure("some avg10=1.00 avg60=0.50 avg300=0.10 total=5\n")
    assert only_some.full is None
    with pytest.raises(ProcParseError):
        parse_pressure("full avg10=1.00 avg60=0.50 avg300=0.10 total=5\n")


def test_smaps_rollup_anonymous_is_rssanon() -> None:
    pm = parse_smaps_rollup((TP4 / "1001" / "smaps_rollup").read_text(), 1001, "VLLM::EngineCor")
    assert round(pm.anon_bytes / GIB, 2) == 1.49
    assert pm.swap_bytes == 1523 * 1024 * KB  # DOMAIN §3: the main swapped process, 1523 MiB
    assert pm.pss_bytes is not None and pm.rss_bytes > pm.anon_bytes
    with pytest.raises(ProcParseError):
        parse_smaps_rollup("", 2)


def test_stat_with_hostile_comm() -> None:
    st = parse_stat((TP4 / "1006" / "stat").read_text())
    assert (st.pid, st.comm, st.state, st.ppid) == (1006, "odd) (name", "S", 1)
    with pytest.raises(ProcParseError):
        parse_stat("garbage")


def test_proc_cgroup_v1_and_v2() -> None:
    v1 = parse_proc_cgroup("4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n")
    assert memory_cgroup_of(v1) == "/docker/abc" and v1["cpuacct"] == "/docker/abc"
    v2 = parse_proc_cgroup((TP4 / "1002" / "cgroup").read_text())
    assert memory_cgroup_of(v2) == f"/system.slice/docker-{ID}.scope"


def test_memory_events_and_oom_control() -> None:
    text = (FIX / "cgroup" / "v2" / "system.slice" / f"docker-{ID}.scope" / "memory.events").read_text()
    assert parse_memory_events(text) == MemoryEvents(max=1733, oom=2, oom_kill=2)
    assert parse_memory_events("oom 1\noom_kill 1\nnew_future_key 9\n").oom_kill == 1
    with pytest.raises(ProcParseError):
        parse_memory_events("low 0\n")
    v1 = parse_oom_control("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    assert (v1.oom_kill_disable, v1.under_oom, v1.oom_kill) == (False, False, 3)
    assert parse_oom_control("oom_kill_disable 1\nunder_oom 1\n").oom_kill is None


def test_swappiness() -> None:
    assert parse_swappiness("200\n") == 200
    with pytest.raises(ProcParseError):
        parse_swappiness("sixty")


# --- readers over fixture trees -------------------------------------------------------------------


def test_process_tree_from_the_engine_root() -> None:
    reader = ProcReader(TP4)
    assert reader.process_tree([1000]) == {1000, 1001, 1002, 1003, 1004, 1005}
    assert reader.process_tree([1001]) == {1001, 1002, 1003, 1004, 1005}
    assert reader.process_tree([]) == set()
    assert reader.process_tree([99999]) == set()  # gone


def test_process_memory_falls_back_to_status_and_skips_kernel_threads() -> None:
    reader = ProcReader(TP4)
    from_status = reader.process_memory(1005)
    assert from_status is not None
    assert from_status.comm == "VLLM::Worker_TP" and from_status.pss_bytes is None
    assert round(from_status.anon_bytes / GIB, 2) == 5.88
    assert reader.process_memory(2) is None  # kthreadd
    assert reader.process_memory(99999) is None


def test_sampler_and_watermarks_over_a_fixture_host() -> None:
    clock = iter([10.0, 11.0]).__next__
    sample = HostSampler(ProcReader(TP4), clock=clock).sample([1000])
    assert sample.at == 10.0
    assert [p.pid for p in sample.processes] == [1000, 1001, 1002, 1003, 1004, 1005]
    assert round(sample.engine_anon_bytes / GIB, 2) == round((0.70 + 1.49 + 5.95 + 5.91 + 6.02 + 5.88), 2)
    assert sample.swap_total_bytes == 2 * 4194300 * KB
    assert sample.swappiness == 200
    assert sample.pressure is not None

    marks = Watermarks("launch-1")
    marks.update(sample, phase="kv_cache")
    later = sample.model_copy(update={
        "at": 11.0,
        "meminfo": sample.meminfo.model_copy(update={"mem_available_bytes": 3 * GIB, "swap_free_bytes": 0}),
        "processes": sample.processes[:2],
    })
    marks.update(later, phase="graph_capture")
    s = marks.summary()
    assert s.samples == 2
    assert round(s.mem_available_min_bytes / GIB, 2) == 2.35  # type: ignore[operator]
    assert s.mem_available_min_at == 10.0
    assert s.mem_available_min_by_phase == {"kv_cache": sample.mem_available_bytes, "graph_capture": 3 * GIB}
    assert s.swap_used_peak_bytes == 2 * 4194300 * KB  # the second sample had swap full
    assert s.engine_anon_peak_bytes == sample.engine_anon_bytes
    assert s.pressure_full_avg10_peak == pytest.approx(0.1207)
    assert s.process_anon_peak_bytes["VLLM::EngineCor[1001]"] == sample.processes[1].anon_bytes
    assert marks.pids_seen == {1000, 1001, 1002, 1003, 1004, 1005}


def test_sampler_on_an_old_kernel() -> None:
    sample = HostSampler(ProcReader(OLD)).sample([4321])
    assert sample.pressure is None
    assert sample.swaps == () and sample.swap_total_bytes == 0
    assert sample.swappiness == 60
    (proc,) = sample.processes
    assert (proc.pid, proc.comm, proc.anon_bytes) == (4321, "python", 921600 * KB)


# --- the cgroup witness over fixture trees --------------------------------------------------------


@pytest.mark.parametrize(("tree", "version", "kills"), [("v2", 2, 2), ("v1", 1, 1), ("v1_4.9", 1, None)])
def test_resolve_and_read_oom_counter(tree: str, version: int, kills: int | None) -> None:
    f = resolve_oom_file(container_id=ID, cgroup_root=FIX / "cgroup" / tree)
    assert f is not None and f.version == version
    assert read_oom_kills(f) == kills


def test_witness_counts_deltas_and_notices_removal(tmp_path: Path) -> None:
    cg = tmp_path / "docker" / ID
    cg.mkdir(parents=True)
    events = cg / "memory.events"
    events.write_text("oom 0\noom_kill 0\n")
    f = resolve_oom_file(f"/docker/{ID}", cgroup_root=tmp_path)
    assert f is not None
    w = CgroupOomWitness(f)
    assert w.poll() == 0
    events.write_text("oom 2\noom_kill 2\n")
    assert w.poll() == 2
    assert w.poll() == 0
    events.write_text("oom 3\noom_kill 3\n")
    assert w.poll() == 1 and w.total_new == 3
    events.unlink()
    assert w.poll() is None
    assert resolve_oom_file(f"/docker/{ID}", cgroup_root=tmp_path) is None

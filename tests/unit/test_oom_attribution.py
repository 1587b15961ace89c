"""Attribution of OOM events to launches, and the diagnosis text (DOMAIN §3, §5)."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.observe.kmsg import OomEvent, OomEventKind, OomScope, oom_events, parse_stream
from appliance.observe.oom_attribution import (
    LaunchTarget,
    MatchKind,
    attribute_oom,
    container_ids_in,
    diagnose_oom,
    event_container_id,
    phase_words,
)

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "kmsg"
ID = "3f1c9a7be0d24c56a8e1f2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7"
REAL_ID = "f90dce4547d80006ce3231b0f64500bc520ca75fbd45946e1c1e55269bdf3273"
OTHER = "0" * 64


def kill_of(name: str) -> OomEvent:
    return next(e for e in oom_events(parse_stream((FIX / name).read_text())) if e.kind is OomEventKind.KILL)


@pytest.mark.parametrize(
    ("path", "ids"),
    [
        (f"/docker/{ID}", [ID]),
        (f"/system.slice/docker-{ID}.scope", [ID]),
        (f"/kubepods.slice/kubepods-pod1.slice/cri-containerd-{ID}.scope", [ID]),
        (f"/machine.slice/libpod-{ID}.scope/container", [ID]),
        (f"/docker/{OTHER}/docker/{ID}", [OTHER, ID]),  # docker in docker: innermost last
        ("/user.slice/user-1000.slice", []),
        (f"/docker/{ID}x", []),
        ("/", []),
        (None, []),
    ],
)
def test_container_ids_in_cgroup_paths(path: str | None, ids: list[str]) -> None:
    assert container_ids_in(path) == ids


def test_real_event_attributed_by_container_id() -> None:
    ev = kill_of("memcg_v1_kernel_6.18_docker.txt")
    assert event_container_id(ev) == REAL_ID
    launches = [
        LaunchTarget(launch_id="other", container_id=OTHER, pids=frozenset({5582})),
        LaunchTarget(launch_id="hit", container_id=REAL_ID),
    ]
    got = attribute_oom(ev, launches)
    assert got is not None
    assert (got.launch.launch_id, got.matched_by) == ("hit", MatchKind.CONTAINER_ID)


def test_short_container_id_matches_but_too_short_does_not() -> None:
    ev = kill_of("memcg_v1_kernel_6.18_docker.txt")
    short = LaunchTarget(launch_id="short", container_id=REAL_ID[:12])
    assert attribute_oom(ev, [short]) is not None
    too_short = LaunchTarget(launch_id="tiny", container_id=REAL_ID[:6])
    assert attribute_oom(ev, [too_short]) is None


def test_global_oom_attributed_through_the_victims_cgroup() -> None:
    ev = kill_of("global_oom_5.15_cgroup2_tp4_graph.txt")
    got = attribute_oom(ev, [LaunchTarget(launch_id="tp4", container_id=ID)])
    assert got is not None and got.matched_by is MatchKind.CONTAINER_ID


def test_cgroup_path_match_for_non_container_launches() -> None:
    ev = OomEvent(kind=OomEventKind.KILL, scope=OomScope.CGROUP, pid=5,
                  oom_memcg="/appliance.slice/engine", task_memcg="/appliance.slice/engine/worker")
    launches = [
        LaunchTarget(launch_id="root-claims-all", cgroup_paths=("/",)),
        LaunchTarget(launch_id="sibling", cgroup_paths=("/appliance.slice/engine2",)),
        LaunchTarget(launch_id="engine", cgroup_paths=("/appliance.slice/engine/",)),
    ]
    got = attribute_oom(ev, launches)
    assert got is not None
    assert (got.launch.launch_id, got.matched_by) == ("engine", MatchKind.CGROUP)


def test_pid_match_for_a_process_runtime_launch() -> None:
    ev = kill_of("global_rate_limited_kill_only.txt")  # no cgroup information at all
    launches = [LaunchTarget(launch_id="a", pids=frozenset({1, 2})),
                LaunchTarget(launch_id="b", pids=frozenset({4242}))]
    got = attribute_oom(ev, launches)
    assert got is not None and (got.launch.launch_id, got.matched_by) == ("b", MatchKind.PID)


def test_unrelated_kill_is_not_attributed() -> None:
    ev = kill_of("memcg_reordered_keys.txt")
    assert attribute_oom(ev, [LaunchTarget(launch_id="x", container_id=OTHER, pids=frozenset({1}))]) is None
    assert attribute_oom(ev, []) is None


def test_attribution_keeps_the_callers_type() -> None:
    class Record:  # any object with the LaunchLike attributes
        def __init__(self) -> None:
            self.launch_id = "rec"
            self.container_id: str | None = ID
            self.cgroup_paths: tuple[str, ...] = ()
            self.pids: frozenset[int] = frozenset()
            self.extra = "kept"

    got = attribute_oom(kill_of("memcg_reordered_keys.txt"), [Record()])
    assert got is not None and got.launch.extra == "kept"


def test_diagnosis_global_oom_during_graph_capture() -> None:
    ev = kill_of("global_oom_5.15_cgroup2_tp4_graph.txt")
    d = diagnose_oom(ev, phase="graph_capture", launch_id="tp4")
    assert d.code == "global_oom"
    assert d.title == "global OOM during graph capture"
    assert "VLLM::Worker_TP (pid 412879)" in d.detail and "6.76 GiB" in d.detail
    assert "CONSTRAINT_NONE" in d.detail
    assert "swappiness=200" in d.action and "Not a container limit" in d.action
    assert d.launch_id == "tp4"


def test_diagnosis_container_memory_limit() -> None:
    d = diagnose_oom(kill_of("memcg_v1_kernel_6.18_docker.txt"), phase="weights_loading")
    assert d.code == "cgroup_oom"
    assert d.title == "container memory limit"
    assert f"/docker/{REAL_ID}" in d.detail and "during weights load" in d.detail
    assert "no memory limit" in d.action and "--memory=0" in d.action


def test_diagnosis_without_phase_or_scope() -> None:
    assert diagnose_oom(kill_of("global_rate_limited_kill_only.txt")).title == "global OOM"
    unknown = OomEvent(kind=OomEventKind.KILL, scope=OomScope.UNKNOWN, pid=1, task="x")
    d = diagnose_oom(unknown, phase="api_up")
    assert (d.code, d.title) == ("oom_unknown_scope", "OOM kill during serving")
    cpuset = OomEvent(kind=OomEventKind.KILL, scope=OomScope.CPUSET, constraint="CONSTRAINT_CPUSET")
    assert diagnose_oom(cpuset).code == "node_constrained_oom"


@pytest.mark.parametrize(
    ("phase", "words"),
    [("graph_capture", "graph capture"), ("graph_capture_done", "after graph capture"),
     ("kv_cache", "KV cache allocation"), ("compile_started", "torch.compile"),
     ("weights_loaded", "after weights load"), ("api_up", "serving"), ("something_new", "something new"),
     (None, None), ("", None)],
)
def test_phase_words(phase: str | None, words: str | None) -> None:
    assert phase_words(phase) == words


@pytest.mark.parametrize("phase", ["weights_loaded", "graph_capture_done", "compile_finished"])
def test_a_finished_phase_reads_after_never_during_after(phase: str) -> None:
    ev = kill_of("global_oom_5.15_cgroup2_tp4_graph.txt")
    d = diagnose_oom(ev, phase=phase)
    assert "during after" not in d.title and d.title.startswith("global OOM after ")
    cg = diagnose_oom(kill_of("memcg_v1_kernel_6.18_docker.txt"), phase=phase)
    assert "during after" not in cg.detail and " hit after " in cg.detail

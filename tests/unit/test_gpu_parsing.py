"""Parser and doctor fixes found on the real H200 logs (docs/gpu-h200.md)."""

from __future__ import annotations

from appliance.diagnosis.diagnose import FailureFacts, diagnose
from appliance.diagnosis.signatures import DiagnosisCode
from appliance.observe.log_phases import Phase, track_text

AOT_OFF_COMPILE = ("(EngineCore pid=2) INFO 11-30 08:01:02 [monitor.py:48] torch.compile and initial "
                   "profiling/warmup run together took 22.42 s in total")


def test_the_aot_off_compile_line_finishes_the_compile_phase() -> None:
    tracker = track_text("(EngineCore pid=2) INFO [backends.py:1] Dynamo bytecode transform time: 5.1 s\n"
                         + AOT_OFF_COMPILE + "\n")
    assert Phase.COMPILE_FINISHED in tracker.reached
    assert tracker.summary().compile_seconds == 22.42


MISSING = """\
(EngineCore pid=2) ERROR 11-30 08:01:02 [core.py:1] EngineCore failed to start.
(EngineCore pid=2) ERROR Traceback (most recent call last):
(EngineCore pid=2) ERROR   File "/root/site/vllm/v1/sample/ops/topk_topp_sampler.py", line 30, in __init__
(EngineCore pid=2) ERROR     import flashinfer
(EngineCore pid=2) ERROR ModuleNotFoundError: No module named 'flashinfer'
(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above.
"""


def test_a_missing_module_is_a_broken_image_named_and_not_retried() -> None:
    d = diagnose(FailureFacts(exit_code=1, log_tail=tuple(MISSING.splitlines())))
    assert d.code is DiagnosisCode.MODULE_NOT_FOUND
    assert "'flashinfer'" in d.summary and "broken" in d.summary
    assert d.retryable is False

"""The load figures' arithmetic (appliance/observe/load_scrape.py, load_figures.py) on exposition text:
a real vLLM `/metrics` answer (tests/fixtures/engine_logs/vllm_metrics.txt), the gateway's own
rendering (GatewayMetrics), and small hand-written texts where a boundary is the point. Counter
resets, series that appear late, missing families and histogram quantile boundaries."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from appliance.observe.load_figures import (
    ENGINE_WANTED,
    GATEWAY_WANTED,
    LoadRing,
    Sample,
    errors_at,
    figures_at,
)
from appliance.observe.load_scrape import (
    Hist,
    LabelKey,
    histogram_increase,
    histogram_quantile,
    increase,
    parse,
)
from controller.gateway.metrics import GatewayMetrics

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "engine_logs" / "vllm_metrics.txt"
INF = float("inf")


def _engine(text: str, at: float, source: str = "launch-a") -> Sample:
    return Sample(at, None, parse(text, source, at, ENGINE_WANTED))


def _set(text: str, sample: str, value: float) -> str:
    """The fixture with one sample line (`name{labels}` exactly as written) given another value."""
    pattern = re.compile("^" + re.escape(sample) + r" \S+$", re.M)
    assert pattern.search(text), sample
    return pattern.sub(f"{sample} {value}", text)


TOKENS = 'vllm:generation_tokens_total{engine="0",model_name="smollm2"}'


# -- histogram_quantile: Prometheus' interpolation and its edges


def test_quantile_interpolates_inside_the_bucket_the_rank_falls_in() -> None:
    h = Hist((0.1, 0.2, 0.4, INF), (0.0, 10.0, 20.0, 20.0))
    # rank 10 (p50 of 20) is exactly the top of the (0.1, 0.2] bucket: its upper bound
    assert histogram_quantile(0.5, h) == pytest.approx(0.2)
    # rank 15 is half way through (0.2, 0.4]
    assert histogram_quantile(0.75, h) == pytest.approx(0.3)


def test_quantile_in_the_lowest_bucket_starts_at_zero() -> None:
    h = Hist((0.1, INF), (4.0, 4.0))
    assert histogram_quantile(0.5, h) == pytest.approx(0.05)


def test_quantile_in_the_inf_bucket_is_the_highest_finite_bound() -> None:
    h = Hist((0.1, 0.2, INF), (1.0, 1.0, 100.0))
    assert histogram_quantile(0.99, h) == 0.2


def test_quantile_of_an_empty_or_missing_histogram_is_none() -> None:
    assert histogram_quantile(0.5, Hist((0.1, INF), (0.0, 0.0))) is None
    assert histogram_quantile(0.5, None) is None


# -- counters: resets and late series


def test_a_counter_that_went_down_was_reset_and_counts_from_zero() -> None:
    assert increase({(): 100.0}, {(): 7.0}) == 7.0
    assert increase({(): 100.0}, {(): 107.0}) == 7.0


def test_a_series_absent_from_the_older_scrape_counts_from_zero() -> None:
    old: dict[LabelKey, float] = {(("status", "200"),): 5.0}
    new: dict[LabelKey, float] = {(("status", "200"),): 6.0, (("status", "429"),): 2.0}
    assert increase(old, new) == 3.0


def test_a_family_missing_from_the_newer_scrape_is_no_figure() -> None:
    assert increase({(): 1.0}, None) is None


def test_a_histogram_reset_takes_the_newer_one_whole() -> None:
    old: dict[LabelKey, Hist] = {(): Hist((1.0, INF), (50.0, 60.0))}
    new: dict[LabelKey, Hist] = {(): Hist((1.0, INF), (3.0, 4.0))}
    assert histogram_increase(old, new) == Hist((1.0, INF), (3.0, 4.0))
    grown: dict[LabelKey, Hist] = {(): Hist((1.0, INF), (53.0, 64.0))}
    assert histogram_increase(old, grown) == Hist((1.0, INF), (3.0, 4.0))


# -- the figures over a real vLLM exposition


def test_parse_keeps_the_wanted_series_of_a_real_engine_answer() -> None:
    s = parse(FIXTURE.read_text(), "launch-a", 0.0, ENGINE_WANTED)
    assert sum(s.values["vllm:generation_tokens_total"].values()) == 8.0
    assert "vllm:time_to_first_token_seconds" in s.histograms
    assert "vllm:num_requests_running" in s.values and "vllm:kv_cache_usage_perc" in s.values
    assert "python_gc_objects_collected_total" not in s.values


def test_token_rate_and_ttft_from_two_engine_scrapes() -> None:
    text = FIXTURE.read_text()
    later = _set(text, TOKENS, 108.0)
    for le in ("0.06", "0.08", "0.1"):  # one more first token, in (0.1, 0.25]
        later = _set(later, f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="{le}",'
                            'model_name="smollm2"}', 1.0)
    later = re.sub(r'^(vllm:time_to_first_token_seconds_bucket\{engine="0",le="(?!0\.0|0\.06|0\.08|0\.1")'
                   r'[^"]*",model_name="smollm2"\}) 1\.0$', r"\1 2.0", later, flags=re.M)
    samples = [_engine(text, 100.0), _engine(later, 110.0)]
    f = figures_at(samples, 1)
    assert f.output_tokens_per_s == pytest.approx(10.0)
    assert f.window_s == pytest.approx(10.0)
    # the one new observation lies in (0.1, 0.25]: every quantile interpolates inside that bucket
    assert f.ttft_p50_s is not None and 0.1 < f.ttft_p50_s <= 0.25
    assert f.engine_running == 0.0 and f.kv_cache_pct == 0.0
    assert f.requests_per_s == 0.0  # no gateway: the engine's successes, none new


def test_a_switched_engine_starts_a_new_window_instead_of_a_reset() -> None:
    text = FIXTURE.read_text()
    samples = [_engine(_set(text, TOKENS, 5000.0), 100.0, "launch-a"), _engine(text, 110.0, "launch-b")]
    f = figures_at(samples, 1)
    assert f.output_tokens_per_s is None  # one scrape of launch-b: no rate yet, not 8 / 10 s
    assert f.engine_running == 0.0  # gauges are the newest sample's


def test_one_sample_has_gauges_but_no_rates() -> None:
    f = figures_at([_engine(FIXTURE.read_text(), 1.0)], 0)
    assert f.output_tokens_per_s is None and f.requests_per_s is None and f.ttft_p50_s is None
    assert f.engine_waiting == 0.0


def test_an_engine_without_a_figure_leaves_it_none() -> None:
    text = "\n".join(line for line in FIXTURE.read_text().splitlines() if "kv_cache_usage" not in line) + "\n"
    f = figures_at([_engine(text, 1.0)], 0)
    assert f.kv_cache_pct is None


# -- the gateway: requests by status class, lazily created series


def _gateway(m: GatewayMetrics, at: float) -> Sample:
    return Sample(at, parse(m.render().decode(), "http://gw", at, GATEWAY_WANTED), None)


def test_gateway_requests_and_error_classes() -> None:
    m = GatewayMetrics()
    first = _gateway(m, 0.0)  # no request yet: the family is declared, no series
    for status, n in ((200, 6), (404, 1), (429, 2), (503, 3), (499, 1)):
        for _ in range(n):
            m.count_request("/v1/chat/completions", status, "k1")
    m.in_flight.set(2)
    m.hold_waiting.set(1)
    samples = [first, _gateway(m, 10.0)]
    f = figures_at(samples, 1)
    assert f.requests == 13.0 and f.requests_per_s == pytest.approx(1.3)
    assert f.in_flight == 2.0 and f.gateway_held == 1.0
    e = errors_at(samples, 1)
    assert (e.client_4xx, e.too_many_429, e.server_5xx, e.client_gone_499) == (1.0, 2.0, 3.0, 1.0)


def test_a_restarted_gateway_counts_from_zero_again() -> None:
    m = GatewayMetrics()
    for _ in range(50):
        m.count_request("/v1/completions", 200, "k1")
    before = _gateway(m, 0.0)
    m2 = GatewayMetrics()  # the same URL, a new process
    for _ in range(4):
        m2.count_request("/v1/completions", 500, "k1")
    f = figures_at([before, _gateway(m2, 8.0)], 1)
    assert f.requests == 4.0
    assert errors_at([before, _gateway(m2, 8.0)], 1).server_5xx == 4.0


def test_no_scrape_of_a_source_is_no_figure_not_zero() -> None:
    f = figures_at([Sample(0.0, None, None), Sample(5.0, None, None)], 1)
    assert f.requests_per_s is None and f.in_flight is None and f.gateway_held is None
    assert errors_at([Sample(0.0, None, None)], 0).server_5xx is None


# -- the ring


def test_the_ring_keeps_only_its_window_and_one_point_per_sample() -> None:
    ring = LoadRing(keep_s=60.0)
    text = FIXTURE.read_text()
    for i in range(30):
        ring.add(_engine(_set(text, TOKENS, 8.0 + 10 * i), 5.0 * i))
    assert len(ring.samples) == len(ring.points) == 13  # 60 s at 5 s: both ends
    report = ring.report()
    assert report["now"]["output_tokens_per_s"] == pytest.approx(2.0)
    assert len(report["series"]["output_tokens_per_s"]) == 13
    assert report["sources"] == {"gateway": None, "engine": "launch-a"}


def test_an_empty_ring_reports_nothing_measured() -> None:
    report = LoadRing().report()
    assert report["sampled_at"] is None and report["now"]["requests_per_s"] is None

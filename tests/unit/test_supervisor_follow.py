"""Following a log by byte offset: partial lines, tqdm redraws, the tail."""

from __future__ import annotations

from controller.supervisor.follow import TAIL_LINES, LogFollower

COLD = [
    "INFO 11-29 07:34:40 [default_loader.py:291] Loading weights took 0.82 seconds\n",
    "INFO 11-29 07:39:17 [kv_cache_utils.py:2327] CPU KV cache size: 46,592 tokens, Maximum conc 22.75x\n",
    "INFO 11-29 07:39:33 [launcher.py:40] Application startup complete.\n",
]


def test_a_line_split_across_reads_is_seen_once_whole() -> None:
    f = LogFollower("L1", started_at=0.0)
    text = "".join(COLD)
    cut = text.index("took 0.8") + 3
    first = f.feed(text[:cut], cut, 1.0)
    assert first == []  # half a line is not a phase
    rest = f.feed(text[cut:], len(text), 2.0)
    assert [e.phase.value for e in rest] == ["weights_loaded", "kv_cache", "api_up"]
    assert rest[0].seconds == 0.82 and rest[1].tokens == 46592
    assert f.offset == len(text)
    assert f.tail_lines()[-1].endswith("Application startup complete.")


def test_a_progress_bar_redrawn_without_newline_shows_progress_as_it_goes() -> None:
    f = LogFollower("L1", started_at=0.0)
    bar = "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): {pct}%|### | {n}/51 [00:10<00:20]\r"
    events = f.feed(bar.format(pct=10, n=5), 100, 1.0)
    assert [(e.phase.value, e.n) for e in events] == [("graph_capture", 5)]
    events = f.feed(bar.format(pct=37, n=19) + bar.format(pct=37, n=19), 200, 2.0)
    assert [e.n for e in events] == [19]  # a redraw without progress is not progress
    # The bar ends with a newline: only the part not yet seen is fed again.
    events = f.feed(bar.format(pct=100, n=51) + "\n", 300, 3.0)
    assert [e.n for e in events] == [51]
    assert f.tail_lines()[-1].startswith("Capturing CUDA graphs") and "51/51" in f.tail_lines()[-1]


def test_the_tail_is_bounded_and_keeps_the_last_lines() -> None:
    f = LogFollower("L1", started_at=0.0)
    text = "".join(f"line {i}\n" for i in range(TAIL_LINES + 50))
    f.feed(text, len(text), 1.0)
    lines = f.tail_lines()
    assert len(lines) == TAIL_LINES and lines[-1] == f"line {TAIL_LINES + 49}"
    assert f.tail_text(max_lines=2) == f"line {TAIL_LINES + 48}\nline {TAIL_LINES + 49}"


def test_garbage_and_empty_reads_are_harmless() -> None:
    f = LogFollower("L1", started_at=0.0)
    assert f.feed("", 0, 1.0) == []
    assert f.feed("\x00\xff garbage \r\r\n\n", 20, 1.0) == []
    assert f.offset == 20

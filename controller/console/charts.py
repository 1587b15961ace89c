"""Charts as plain SVG, rendered on the server.

Why not a JavaScript charting library: the console's charts are a few time series, markers and
bars; SVG built here needs no vendored bundle, no licence file, no client-side data API, and works
under the console's strict Content-Security-Policy (no inline script, no inline `style=`): every
colour is an SVG presentation attribute (`fill`, `stroke`), which CSP does not treat as a style.
Every piece of text goes through `markupsafe.escape`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from markupsafe import Markup, escape

PALETTE = ("#2563eb", "#d97706", "#7c3aed", "#059669", "#dc2626", "#0891b2")


@dataclass(frozen=True)
class Series:
    name: str
    points: Sequence[tuple[float, float | None]]  # (x, y); y None = a gap
    color: str = PALETTE[0]
    # How points that fall into one pixel column are folded: `min` keeps low-water marks visible
    # (DOMAIN §3: the minimum MemAvailable is what decides an OOM, not the average).
    fold: Callable[[Sequence[float]], float] = max


@dataclass(frozen=True)
class Marker:
    """A vertical line at x: a launch boundary, an OOM kill."""

    x: float
    label: str
    color: str = "#6b7280"
    dashed: bool = True


@dataclass(frozen=True)
class HLine:
    """A horizontal reference, e.g. the recipe's MemAvailable target."""

    y: float
    label: str
    color: str = "#dc2626"


@dataclass(frozen=True)
class Bar:
    label: str
    start: float
    end: float
    color: str = PALETTE[0]
    detail: str = ""


@dataclass
class _Frame:
    width: int
    height: int
    left: int = 64
    right: int = 16
    top: int = 12
    bottom: int = 28
    parts: list[str] = field(default_factory=list)

    @property
    def plot_w(self) -> int:
        return self.width - self.left - self.right

    @property
    def plot_h(self) -> int:
        return self.height - self.top - self.bottom


def _num(v: float) -> str:
    return f"{v:.1f}"


def _svg(frame: _Frame, title: str) -> Markup:
    body = "".join(frame.parts)
    return Markup(
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {frame.width} {frame.height}" '
        f'width="{frame.width}" height="{frame.height}" role="img" aria-label="{escape(title)}">'
        f"<title>{escape(title)}</title>{body}</svg>"
    )


NICE_MULTIPLES = (1.0, 2.0, 5.0, 10.0)
MAX_INTERVALS = 7  # at most this many grid steps on a value axis
OOM_ENGINE = "#dc2626"  # an OOM kill of the engine
OOM_OTHER = "#9ca3af"  # an OOM kill of another process: grey, told apart in the legend
GPU_EVENT = "#7c2d12"  # a GPU kernel event (Xid, amdgpu reset) of the launch


def nice_step(span: float, max_intervals: int = MAX_INTERVALS) -> float:
    """The smallest step of 1, 2 or 5 × 10^n that covers `span` in at most `max_intervals` steps."""
    if span <= 0 or not math.isfinite(span):
        return 1.0
    raw = span / max_intervals
    magnitude = 10.0 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in NICE_MULTIPLES if m * magnitude >= raw * (1 - 1e-9))


def nice_ticks(top: float, max_intervals: int = MAX_INTERVALS) -> list[float]:
    """Round tick values from 0 to the first multiple of a nice step at or above `top`:
    23.6 → 0, 5, 10, 15, 20, 25; 10 → 0, 2, 4, 6, 8, 10 (never 5.9, 11.8 or 2.5, 7.5)."""
    step = nice_step(top, max_intervals)
    n = max(1, math.ceil(top / step - 1e-9)) if top > 0 else 1
    return [round(i * step, 10) for i in range(n + 1)]


def tick_number(v: float) -> str:
    """A tick value without float noise or a needless `.0`: 2, 2.5, 0.1."""
    return f"{round(v, 6):g}"


def place_labels(spans: Sequence[tuple[float, float]], rows: int = 3, gap: float = 4.0) -> list[int | None]:
    """A row for each label given as (left, right) pixels, so no two labels in one row overlap:
    each goes to the first row where it clears the row's last label by `gap`; one that fits no
    row gets None (it is not drawn; its line keeps the text as a tooltip). Labels are taken in
    order of their left edge; the answer is in the order given."""
    ends: list[float] = [-math.inf] * rows
    placed: list[int | None] = [None] * len(spans)
    for i in sorted(range(len(spans)), key=lambda i: spans[i][0]):
        left, right = spans[i]
        for row in range(rows):
            if left >= ends[row] + gap:
                ends[row] = right
                placed[i] = row
                break
    return placed


def label_width(text: str, px_per_char: float = 6.2) -> float:
    """About how wide a label is at the charts' 11 px font (no font metrics on the server)."""
    return len(text) * px_per_char + 2


def _y_grid(frame: _Frame, py: Callable[[float], float], ticks: Sequence[float], fmt: Callable[[float], str],
            unit: float = 1.0) -> None:
    """A horizontal grid line at each tick (in `unit`s), each labelled on the left axis."""
    for t in ticks:
        y = t * unit
        frame.parts.append(f'<line x1="{frame.left}" x2="{frame.width - frame.right}" y1="{_num(py(y))}" '
                           f'y2="{_num(py(y))}" stroke="#e5e7eb" stroke-width="1"/>')
        frame.parts.append(f'<text x="{frame.left - 6}" y="{_num(py(y) + 4)}" text-anchor="end" class="tick">'
                           f"{escape(fmt(y))}</text>")


def _x_grid(frame: _Frame, px: Callable[[float], float], total: float, fmt: Callable[[float], str]) -> None:
    """Four vertical grid steps from 0 to `total`, each labelled under the plot."""
    for i in range(5):
        x = total * i / 4
        frame.parts.append(f'<line x1="{_num(px(x))}" x2="{_num(px(x))}" y1="{frame.top}" '
                           f'y2="{frame.height - frame.bottom}" stroke="#e5e7eb" stroke-width="1"/>')
        frame.parts.append(f'<text x="{_num(px(x))}" y="{frame.height - 8}" text-anchor="middle" '
                           f'class="tick">{escape(fmt(x))}</text>')


def _fold(points: Sequence[tuple[float, float | None]], x0: float, x1: float, columns: int,
          fold: Callable[[Sequence[float]], float]) -> list[tuple[float, float | None]]:
    """At most one point per pixel column (a day of 1 Hz samples must not become 86,400 nodes)."""
    if len(points) <= columns or x1 <= x0:
        return list(points)
    span = (x1 - x0) / columns
    buckets: dict[int, list[float]] = {}
    gaps: set[int] = set()
    for x, y in points:
        col = min(columns - 1, max(0, int((x - x0) / span)))
        if y is None:
            gaps.add(col)
        else:
            buckets.setdefault(col, []).append(y)
    out: list[tuple[float, float | None]] = []
    for col in range(columns):
        if col in buckets:
            out.append((x0 + (col + 0.5) * span, fold(buckets[col])))
        elif col in gaps:
            out.append((x0 + (col + 0.5) * span, None))
    return out


def count_tick(v: float) -> str:
    """A count on nice ticks, short enough for the axis: 800, 1.5k, 2M (not 1.5e+06)."""
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= size:
            return f"{tick_number(v / size)}{suffix}"
    return tick_number(v)


def gib_tick(v: float) -> str:
    """A GiB axis value in bytes, on nice ticks: 0 GiB, 5 GiB, 0.5 GiB."""
    return f"{tick_number(v / 2**30)} GiB"


_MIN, _HOUR, _DAY = 60, 3600, 86400
# Round steps of a time axis, in seconds: a tick lands on a whole 10 s, 5 min, hour, 6 h or day.
TIME_STEPS: tuple[int, ...] = (1, 2, 5, 10, 15, 30, _MIN, 2 * _MIN, 5 * _MIN, 10 * _MIN, 15 * _MIN, 30 * _MIN,
                               _HOUR, 2 * _HOUR, 3 * _HOUR, 6 * _HOUR, 12 * _HOUR, _DAY, 2 * _DAY, 7 * _DAY)
MAX_TIME_TICKS = 6  # labels of ~14 characters side by side on the narrowest chart


def time_step(span: float, max_ticks: int = MAX_TIME_TICKS) -> int:
    """The smallest round step (TIME_STEPS) that puts at most `max_ticks` ticks on a `span` of seconds."""
    for step in TIME_STEPS:
        if span / step < max_ticks:  # at most floor(span/step) + 1 multiples fall in the span
            return step
    return TIME_STEPS[-1] * max(1, math.ceil(span / (TIME_STEPS[-1] * max_ticks)))


def time_ticks(x0: float, x1: float, max_ticks: int = MAX_TIME_TICKS) -> tuple[list[float], int]:
    """Ticks at round local times between x0 and x1 (both included when round): whole minutes,
    hours or days, never 10:03:17; and the step, which says how to label them (time_label)."""
    if not (math.isfinite(x0) and math.isfinite(x1)) or x1 <= x0:
        return [], 1
    step = time_step(x1 - x0, max_ticks)
    # Hours and days are round in local time: shift by the zone's offset (a whole number of minutes
    # or half-hours), so a 6-hour step lands on 00:00, 06:00 … of the clock the operator reads.
    offset = time.localtime(x0).tm_gmtoff if step >= _HOUR else 0
    first = math.ceil((x0 + offset) / step - 1e-9) * step - offset
    ticks: list[float] = []
    t = float(first)
    while t <= x1 + 1e-6:
        ticks.append(t)
        t += step
    return ticks, step


def time_label(step: int) -> Callable[[float], str]:
    """How ticks `step` seconds apart read: seconds only when they differ, the date once a day."""
    fmt = "%H:%M:%S" if step < _MIN else "%H:%M" if step < _DAY else "%m-%d"
    return lambda t: time.strftime(fmt, time.localtime(t))


def line_chart(
    series: Sequence[Series],
    *,
    title: str,
    x_range: tuple[float, float] | None = None,
    y_max: float | None = None,
    y_format: Callable[[float], str] = tick_number,
    y_unit: float = 1.0,
    x_format: Callable[[float], str] | None = None,
    markers: Sequence[Marker] = (),
    hlines: Sequence[HLine] = (),
    marker_legend: Sequence[tuple[str, str]] = (),
    width: int = 880,
    height: int = 220,
) -> Markup:
    """Time series with vertical markers and horizontal reference lines; empty series say so.
    The value axis has round ticks (nice_ticks) in `y_unit`s (2**30 for a GiB axis in bytes), its top
    the first tick at or above the data; the time axis ticks at round times (time_ticks); marker
    labels are staggered over three rows and a label with no room is left out (place_labels).
    `marker_legend`: (label, colour) entries for kinds of markers (an engine's OOM kill, another's)."""
    frame = _Frame(width, height + 18, top=30)  # the legend has a band of its own above the plot
    height += 18
    xs = [x for s in series for x, _ in s.points]
    if x_range is None:
        if not xs:
            frame.parts.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" '
                               'class="empty">no samples yet</text>')
            return _svg(frame, title)
        x_range = (min(xs), max(xs))
    x0, x1 = x_range
    if x1 <= x0:
        x1 = x0 + 1.0
    ys = [y for s in series for _, y in s.points if y is not None] + [h.y for h in hlines]
    wanted = y_max if y_max is not None else (max(ys) * 1.05 if ys and max(ys) > 0 else 1.0)
    ticks = nice_ticks(wanted / y_unit)
    top = ticks[-1] * y_unit

    def px(x: float) -> float:
        return frame.left + (x - x0) / (x1 - x0) * frame.plot_w

    def py(y: float) -> float:
        return frame.top + frame.plot_h - max(0.0, min(1.0, y / top)) * frame.plot_h

    p = frame.parts
    # axes and four horizontal grid lines with their values
    _y_grid(frame, py, ticks, y_format, y_unit)
    # The time axis: ticks at round times (time_ticks), labelled as their step reads (x_format: None).
    x_ticks, x_step = time_ticks(x0, x1)
    label = x_format or time_label(x_step)
    for x in x_ticks:
        near = (px(x) - frame.left) / frame.plot_w
        anchor = "start" if near < 0.05 else "end" if near > 0.95 else "middle"
        p.append(f'<line x1="{_num(px(x))}" x2="{_num(px(x))}" y1="{frame.top + frame.plot_h}" '
                 f'y2="{frame.top + frame.plot_h + 4}" stroke="#9ca3af" stroke-width="1" class="x-tick"/>')
        p.append(f'<text x="{_num(px(x))}" y="{height - 8}" text-anchor="{anchor}" class="tick">'
                 f"{escape(label(x))}</text>")
    for h in hlines:
        hy = _num(py(h.y))
        p.append(f'<line x1="{frame.left}" x2="{width - frame.right}" y1="{hy}" y2="{hy}" '
                 f'stroke="{escape(h.color)}" stroke-width="1.5" stroke-dasharray="6 4" class="hline"/>')
        p.append(f'<text x="{width - frame.right - 4}" y="{_num(py(h.y) - 4)}" text-anchor="end" '
                 f'fill="{escape(h.color)}" class="label">{escape(h.label)}</text>')
    for s in series:
        for path in _paths(_fold(s.points, x0, x1, frame.plot_w, s.fold), px, py):
            p.append(f'<polyline fill="none" stroke="{escape(s.color)}" stroke-width="1.6" points="{path}">'
                     f"<title>{escape(s.name)}</title></polyline>")
    shown = [m for m in markers if x0 <= m.x <= x1]
    spans: list[tuple[float, float]] = []
    for m in shown:
        dash = ' stroke-dasharray="3 3"' if m.dashed else ""
        p.append(f'<line x1="{_num(px(m.x))}" x2="{_num(px(m.x))}" y1="{frame.top}" '
                 f'y2="{frame.top + frame.plot_h}" stroke="{escape(m.color)}" stroke-width="1.2"{dash} '
                 f'class="marker"><title>{escape(m.label)}</title></line>')
        # near the right edge the label goes to the left of its line, so it is not cut off
        w = label_width(m.label)
        spans.append((px(m.x) - 3 - w, px(m.x) - 3) if px(m.x) > frame.left + frame.plot_w * 0.8
                     else (px(m.x) + 3, px(m.x) + 3 + w))
    for m, (left, right), row in zip(shown, spans, place_labels(spans), strict=True):
        if row is None:
            continue
        right_side = right <= px(m.x)
        lx, anchor = (right, "end") if right_side else (left, "start")
        p.append(f'<text x="{_num(lx)}" y="{frame.top + 10 + 12 * row}" text-anchor="{anchor}" '
                 f'fill="{escape(m.color)}" class="label">{escape(m.label)}</text>')
    # legend
    lx = frame.left + 8
    for s in series:
        p.append(f'<rect x="{lx}" y="12" width="10" height="3" fill="{escape(s.color)}"/>'
                 f'<text x="{lx + 14}" y="17" class="legend">{escape(s.name)}</text>')
        lx += 22 + 7 * len(s.name)
    for name, color in marker_legend:
        p.append(f'<line x1="{lx}" x2="{lx}" y1="8" y2="18" stroke="{escape(color)}" '
                 f'stroke-width="2" class="legend-marker"/>'
                 f'<text x="{lx + 6}" y="17" class="legend">{escape(name)}</text>')
        lx += 22 + 7 * len(name)
    return _svg(frame, title)


def _paths(points: Sequence[tuple[float, float | None]], px: Callable[[float], float],
           py: Callable[[float], float]) -> list[str]:
    """Polyline point lists, split at gaps."""
    runs: list[list[str]] = [[]]
    for x, y in points:
        if y is None:
            if runs[-1]:
                runs.append([])
            continue
        runs[-1].append(f"{_num(px(x))},{_num(py(y))}")
    return [" ".join(r) for r in runs if r]


def waterfall(bars: Sequence[Bar], *, title: str, width: int = 880, row_h: int = 22,
              x_format: Callable[[float], str] = lambda s: f"{s:.0f} s") -> Markup:
    """One row per phase: where it began and how long it lasted, on one time axis from 0."""
    frame = _Frame(width, 24 + row_h * max(1, len(bars)) + 28, left=190, right=64)
    p = frame.parts
    if not bars:
        p.append(f'<text x="{width / 2}" y="40" text-anchor="middle" class="empty">no phases recorded</text>')
        return _svg(frame, title)
    total = max(b.end for b in bars) or 1.0

    def px(x: float) -> float:
        return frame.left + x / total * frame.plot_w

    _x_grid(frame, px, total, x_format)
    for i, b in enumerate(bars):
        y = frame.top + i * row_h
        w = max(2.0, px(b.end) - px(b.start))
        tip = f"{b.label}: {b.start:.1f}–{b.end:.1f} s ({b.end - b.start:.1f} s)" + (
            f" — {b.detail}" if b.detail else "")
        p.append(f'<text x="{frame.left - 8}" y="{y + row_h - 8}" text-anchor="end" class="label">'
                 f"{escape(b.label)}</text>")
        p.append(f'<rect class="bar" x="{_num(px(b.start))}" y="{y + 3}" width="{_num(w)}" '
                 f'height="{row_h - 6}" fill="{escape(b.color)}"><title>{escape(tip)}</title></rect>')
        p.append(f'<text x="{_num(px(b.start) + w + 4)}" y="{y + row_h - 8}" class="tick">'
                 f"{escape(f'{b.end - b.start:.1f} s')}</text>")
    return _svg(frame, title)


def gib(v: float) -> str:
    return f"{v / 2**30:.1f} GiB"


def nice_top(v: float, intervals: int = 4) -> float:
    """An axis end at or above v whose `intervals` grid steps are round numbers (1, 1.5, 2, … 8 × 10^k),
    so ticks read 0, 10, 20, 30, 40 rather than 0, 11.5, 23, 34.5, 46."""
    if v <= 0:
        return 1.0
    raw = v / intervals
    magnitude = 10.0 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10) if m * magnitude >= raw)
    return step * intervals


@dataclass(frozen=True)
class BarGroup:
    """One cluster of bars: a label (a benchmark tier) and one value per legend entry (a recipe)."""

    label: str
    values: Sequence[float | None]  # in legend order; None = no figure (no bar, a dash)


def grouped_bars(groups: Sequence[BarGroup], legend: Sequence[str], *, title: str,
                 y_format: Callable[[float], str] = tick_number,
                 value_format: Callable[[float], str] = lambda v: f"{v:.1f}",
                 width: int = 880, height: int = 260) -> Markup:
    """Vertical bars side by side per group, one colour per legend entry (e.g. eager vs graph per tier)."""
    frame = _Frame(width, height, top=30)
    p = frame.parts
    if not groups or not legend:
        p.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" class="empty">'
                 "nothing measured yet</text>")
        return _svg(frame, title)
    values = [v for g in groups for v in g.values if v is not None]
    ticks = nice_ticks(max(values) * 1.08) if values else [0.0, 1.0]  # room for the value labels
    top = ticks[-1]

    def py(y: float) -> float:
        return frame.top + frame.plot_h - max(0.0, min(1.0, y / top)) * frame.plot_h

    _y_grid(frame, py, ticks, y_format)
    slot = frame.plot_w / len(groups)
    bar_w = min(48.0, slot * 0.8 / len(legend))
    for gi, g in enumerate(groups):
        x0 = frame.left + gi * slot + (slot - bar_w * len(legend)) / 2
        p.append(f'<g class="bar-group"><title>{escape(g.label)}</title>')
        for si, name in enumerate(legend):
            v = g.values[si] if si < len(g.values) else None
            x = x0 + si * bar_w
            if v is None:
                p.append(f'<text x="{_num(x + bar_w / 2)}" y="{_num(py(0) - 4)}" text-anchor="middle" '
                         f'class="tick">—</text>')
                continue
            color = PALETTE[si % len(PALETTE)]
            p.append(f'<rect class="gbar" x="{_num(x + 1)}" y="{_num(py(v))}" width="{_num(bar_w - 2)}" '
                     f'height="{_num(py(0) - py(v))}" fill="{color}">'
                     f"<title>{escape(f'{name} · {g.label}: {value_format(v)}')}</title></rect>")
            p.append(f'<text x="{_num(x + bar_w / 2)}" y="{_num(py(v) - 3)}" text-anchor="middle" '
                     f'class="tick">{escape(value_format(v))}</text>')
        p.append("</g>")
        p.append(f'<text x="{_num(frame.left + (gi + 0.5) * slot)}" y="{height - 8}" text-anchor="middle" '
                 f'class="label">{escape(g.label)}</text>')
    lx = frame.left + 8
    for si, name in enumerate(legend):
        p.append(f'<rect x="{lx}" y="8" width="10" height="10" fill="{PALETTE[si % len(PALETTE)]}"/>'
                 f'<text x="{lx + 14}" y="17" class="legend">{escape(name)}</text>')
        lx += 28 + 7 * len(name)
    return _svg(frame, title)


@dataclass(frozen=True)
class Dot:
    """One request on a strip: its value (None = it failed, drawn as a cross) and a tooltip."""

    value: float | None
    tip: str


@dataclass(frozen=True)
class Strip:
    label: str
    dots: Sequence[Dot]


def strip_chart(strips: Sequence[Strip], *, title: str, width: int = 880, row_h: int = 30,
                x_format: Callable[[float], str] = lambda v: f"{v:,.0f} ms",
                color: str = PALETTE[0]) -> Markup:
    """One row per group (a tier), one dot per item (a request) on a shared axis from 0; a failed
    item is a red cross at the row's start, so failures are seen, not silently missing."""
    frame = _Frame(width, 12 + row_h * max(1, len(strips)) + 28, left=150, right=40)
    p = frame.parts
    values = [d.value for s in strips for d in s.dots if d.value is not None]
    if not strips or not any(s.dots for s in strips):
        p.append(f'<text x="{width / 2}" y="30" text-anchor="middle" class="empty">'
                 "no requests recorded</text>")
        return _svg(frame, title)
    total = nice_top(max(values) * 1.02) if values else 1.0

    def px(x: float) -> float:
        return frame.left + x / total * frame.plot_w

    _x_grid(frame, px, total, x_format)
    for i, s in enumerate(strips):
        cy = frame.top + i * row_h + row_h / 2
        p.append(f'<text x="{frame.left - 8}" y="{_num(cy + 4)}" text-anchor="end" class="label">'
                 f"{escape(s.label)}</text>")
        p.append('<g class="strip">')
        for d in s.dots:
            if d.value is None:
                x = frame.left + 4
                p.append(f'<path class="dot-failed" d="M{_num(x - 4)} {_num(cy - 4)} l8 8 m0 -8 l-8 8" '
                         f'stroke="#dc2626" stroke-width="2"><title>{escape(d.tip)}</title></path>')
            else:
                p.append(f'<circle class="dot" cx="{_num(px(d.value))}" cy="{_num(cy)}" r="5" '
                         f'fill="{escape(color)}" fill-opacity="0.7"><title>{escape(d.tip)}</title></circle>')
        p.append("</g>")
    return _svg(frame, title)


def sparkline(points: Sequence[tuple[float, float | None]], *, title: str, width: int = 160, height: int = 28,
              color: str = PALETTE[0]) -> Markup:
    """A figure's recent course in a line the height of a table row: no axes, scaled from 0 to its own
    maximum (the exact value sits beside it), gaps where nothing was measured. The title (a tooltip and
    the accessible name) says the range."""
    frame = _Frame(width, height, left=1, right=1, top=2, bottom=2)
    xs = [x for x, _ in points]
    ys = [y for _, y in points if y is not None]
    if not ys or len(xs) < 2:
        frame.parts.append(f'<text x="{width / 2}" y="{height / 2 + 4}" text-anchor="middle" '
                           'class="empty">no data yet</text>')
        return _svg_spark(frame, title)
    x0, x1 = min(xs), max(xs)
    top = max(ys) if max(ys) > 0 else 1.0

    def px(x: float) -> float:
        return frame.left + (x - x0) / (x1 - x0 or 1.0) * frame.plot_w

    def py(y: float) -> float:
        return frame.top + frame.plot_h - max(0.0, min(1.0, y / top)) * frame.plot_h

    frame.parts.append(f'<line x1="{frame.left}" x2="{width - frame.right}" y1="{_num(py(0))}" '
                       f'y2="{_num(py(0))}" stroke="#e5e7eb" stroke-width="1"/>')
    for path in _paths(_fold(points, x0, x1, frame.plot_w, max), px, py):
        frame.parts.append(f'<polyline fill="none" stroke="{escape(color)}" stroke-width="1.4" '
                           f'points="{path}"/>')
    return _svg_spark(frame, title)


def _svg_spark(frame: _Frame, title: str) -> Markup:
    return Markup(
        f'<svg xmlns="http://www.w3.org/2000/svg" class="spark" viewBox="0 0 {frame.width} {frame.height}" '
        f'width="{frame.width}" height="{frame.height}" role="img" aria-label="{escape(title)}">'
        f"<title>{escape(title)}</title>{''.join(frame.parts)}</svg>"
    )

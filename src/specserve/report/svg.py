"""Inline SVG charts (no JavaScript, no network): ECDFs, step/line plots, bar charts,
x-y curves with a marked x position, scatter plots.

Each function returns one ``<svg>`` element as a string. Coordinates: a plot area of
``W × H`` pixels inside margins; linear or log10 x scale; "nice" ticks (1, 2, 5 × 10^k).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

W, H = 560, 300
LEFT, RIGHT, TOP, BOTTOM = 64, 150, 28, 44
PALETTE = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#ff7f0e",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values covering [low, high]."""
    if not math.isfinite(low) or not math.isfinite(high):
        return [0.0]
    if high <= low:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    start = math.floor(low / step) * step
    ticks = [round(start + i * step, 12) for i in range(int((high - start) / step + 1e-9) + 1)]
    if ticks[-1] < high:
        ticks.append(round(ticks[-1] + step, 12))
    return ticks


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if 1000 <= abs(v) < 1e6:
        return f"{v:.0f}"
    if abs(v) >= 1e6 or abs(v) < 0.01:
        return f"{v:.2g}"
    return f"{v:.3g}"


class _Frame:
    """Axes of one chart; maps data to pixels and collects SVG elements."""

    def __init__(
        self,
        title: str,
        xlabel: str,
        ylabel: str,
        xr: tuple[float, float],
        yr: tuple[float, float],
        x_ticks: bool = True,
    ) -> None:
        self.xt = nice_ticks(*xr)
        self.yt = nice_ticks(*yr)
        self.x0, self.x1 = min(self.xt[0], xr[0]), max(self.xt[-1], xr[1])
        self.y0, self.y1 = min(self.yt[0], yr[0]), max(self.yt[-1], yr[1])
        if self.x1 == self.x0:
            self.x1 = self.x0 + 1
        if self.y1 == self.y0:
            self.y1 = self.y0 + 1
        self.parts: list[str] = [
            f'<text x="{(LEFT + W - RIGHT) / 2}" y="18" text-anchor="middle" '
            f'font-weight="bold">{escape(title)}</text>',
            f'<text x="{(LEFT + W - RIGHT) / 2}" y="{H - 6}" text-anchor="middle">'
            f"{escape(xlabel)}</text>",
            f'<text x="14" y="{(TOP + H - BOTTOM) / 2}" text-anchor="middle" '
            f'transform="rotate(-90 14 {(TOP + H - BOTTOM) / 2})">{escape(ylabel)}</text>',
        ]
        for t in self.xt if x_ticks else []:
            x = self.px(t)
            self.parts.append(
                f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{H - BOTTOM}" '
                f'stroke="#e5e5e5"/><text x="{x:.1f}" y="{H - BOTTOM + 14}" '
                f'text-anchor="middle">{_fmt(t)}</text>'
            )
        for t in self.yt:
            y = self.py(t)
            self.parts.append(
                f'<line x1="{LEFT}" y1="{y:.1f}" x2="{W - RIGHT}" y2="{y:.1f}" '
                f'stroke="#e5e5e5"/><text x="{LEFT - 4}" y="{y + 4:.1f}" '
                f'text-anchor="end">{_fmt(t)}</text>'
            )
        self.parts.append(
            f'<rect x="{LEFT}" y="{TOP}" width="{W - LEFT - RIGHT}" '
            f'height="{H - TOP - BOTTOM}" fill="none" stroke="#444"/>'
        )
        self.legend_y = TOP + 4

    def px(self, x: float) -> float:
        return LEFT + (x - self.x0) / (self.x1 - self.x0) * (W - LEFT - RIGHT)

    def py(self, y: float) -> float:
        return H - BOTTOM - (y - self.y0) / (self.y1 - self.y0) * (H - TOP - BOTTOM)

    def legend(self, label: str, color: str, dashed: bool = False) -> None:
        x, y = W - RIGHT + 8, self.legend_y
        mark = (
            f'<line x1="{x}" y1="{y + 4}" x2="{x + 12}" y2="{y + 4}" stroke="{color}" '
            'stroke-width="2" stroke-dasharray="3 2"/>'
            if dashed
            else f'<rect x="{x}" y="{y}" width="12" height="8" fill="{color}"/>'
        )
        self.parts.append(f'{mark}<text x="{x + 16}" y="{y + 8}">{escape(label[:22])}</text>')
        self.legend_y += 14

    def svg(self) -> str:
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
            f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="10">'
            + "".join(self.parts)
            + "</svg>"
        )


def empty_chart(title: str, message: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="60" font-size="11" '
        f'font-family="sans-serif"><text x="8" y="20" font-weight="bold">{escape(title)}'
        f'</text><text x="8" y="42">{escape(message)}</text></svg>'
    )


def _path(f: _Frame, points: Sequence[tuple[float, float]], step: bool) -> str:
    """SVG path data through ``points`` in order: straight segments, or with ``step``
    horizontal-then-vertical ones."""
    out = []
    for j, (x, y) in enumerate(points):
        if j == 0:
            out.append(f"M{f.px(x):.1f},{f.py(y):.1f}")
        elif step:
            out.append(f"H{f.px(x):.1f}V{f.py(y):.1f}")
        else:
            out.append(f"L{f.px(x):.1f},{f.py(y):.1f}")
    return "".join(out)


def step_chart(
    title: str,
    xlabel: str,
    ylabel: str,
    series: Mapping[str, Sequence[tuple[float, float]]],
    step: bool = True,
    markers: bool = False,
) -> str:
    """Lines through (x, y) points per series; ``step`` draws horizontal-then-vertical."""
    pts = [p for s in series.values() for p in s]
    if not pts:
        return empty_chart(title, "no data")
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    f = _Frame(title, xlabel, ylabel, (min(0.0, min(xs)), max(xs)), (min(0.0, min(ys)), max(ys)))
    for i, (label, s) in enumerate(series.items()):
        color = PALETTE[i % len(PALETTE)]
        f.parts.append(
            f'<path d="{_path(f, s, step)}" fill="none" stroke="{color}" stroke-width="1.6"/>'
        )
        if markers:
            f.parts += [
                f'<circle cx="{f.px(x):.1f}" cy="{f.py(y):.1f}" r="2.5" fill="{color}"/>'
                for x, y in s
            ]
        f.legend(label, color)
    return f.svg()


def ecdf_chart(title: str, xlabel: str, samples: Mapping[str, Sequence[float]]) -> str:
    """Empirical CDF of each sample (fraction of values ≤ x)."""
    series = {}
    for label, values in samples.items():
        v = sorted(values)
        if v:
            n = len(v)
            series[f"{label} (n={n})"] = [(v[0], 0.0)] + [(x, (i + 1) / n) for i, x in enumerate(v)]
    if not series:
        return empty_chart(title, "no samples")
    return step_chart(title, xlabel, "fraction ≤ x", series, step=True)


def bar_chart(
    title: str,
    ylabel: str,
    groups: Sequence[str],
    bars: Mapping[str, Sequence[tuple[float | None, float | None, float | None]]],
    reference: float | None = None,
) -> str:
    """Grouped bars: ``bars[label][g] = (value, ci_low, ci_high)``; optional dashed line."""
    vals = [v for s in bars.values() for t in s for v in t if v is not None and math.isfinite(v)]
    if not vals or not groups:
        return empty_chart(title, "no data")
    hi = max([*vals, reference or 0.0])
    f = _Frame(title, "", ylabel, (0.0, 1.0), (0.0, hi * 1.05), x_ticks=False)
    width = (W - LEFT - RIGHT) / len(groups)
    bw = width * 0.8 / max(1, len(bars))
    for g, name in enumerate(groups):
        x = LEFT + g * width + width / 2
        f.parts.append(
            f'<text x="{x:.1f}" y="{H - BOTTOM + 14}" text-anchor="middle">'
            f"{escape(name[: max(3, int(width / 6))])}</text>"
        )
    for i, (label, s) in enumerate(bars.items()):
        color = PALETTE[i % len(PALETTE)]
        for g, (value, low, high) in enumerate(s):
            if value is None or not math.isfinite(value):
                continue
            x = LEFT + g * width + width * 0.1 + i * bw
            y = f.py(value)
            f.parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bw * 0.9:.1f}" '
                f'height="{f.py(0) - y:.1f}" fill="{color}"/>'
            )
            if low is not None and high is not None and math.isfinite(low + high):
                cx = x + bw * 0.45
                f.parts.append(
                    f'<line x1="{cx:.1f}" x2="{cx:.1f}" y1="{f.py(low):.1f}" '
                    f'y2="{f.py(high):.1f}" stroke="#000"/>'
                )
        f.legend(label, color)
    if reference is not None:
        y = f.py(reference)
        f.parts.append(
            f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
            'stroke="#000" stroke-dasharray="4 3"/>'
        )
    return f.svg()


def xy_chart(
    title: str,
    xlabel: str,
    ylabel: str,
    series: Mapping[str, Sequence[tuple[float, float]]],
    colors: Mapping[str, str] | None = None,
    dashed: Sequence[str] = (),
    lines: bool = True,
    vline: tuple[float, str] | None = None,
    labels: Sequence[tuple[float, float, str]] = (),
) -> str:
    """Points (and lines through them, in order) per series; ``dashed`` series are drawn
    dashed; ``vline`` = (x, text) marks an x position; ``labels`` = (x, y, text) annotations."""
    pts = [p for s in series.values() for p in s]
    if not pts:
        return empty_chart(title, "no data")
    xs = [p[0] for p in pts] + ([vline[0]] if vline else [])
    ys = [p[1] for p in pts]
    # 4 % headroom: points on the largest value stay off the frame
    xr, yr = (min(0.0, min(xs)), max(xs) * 1.04), (min(0.0, min(ys)), max(ys) * 1.04)
    f = _Frame(title, xlabel, ylabel, xr, yr)
    for i, (label, s) in enumerate(series.items()):
        color = (colors or {}).get(label, PALETTE[i % len(PALETTE)])
        dash = ' stroke-dasharray="5 3"' if label in dashed else ""
        if lines and len(s) > 1:
            d = _path(f, s, step=False)
            f.parts.append(f'<path d="{d}" fill="none" stroke="{color}" stroke-width="1.6"{dash}/>')
        f.parts += [
            f'<circle cx="{f.px(x):.1f}" cy="{f.py(y):.1f}" r="{3 if lines else 2}" '
            f'fill="{color}" fill-opacity="{1 if lines else 0.6}"/>'
            for x, y in s
        ]
        f.legend(label, color, dashed=label in dashed)
    for x, y, text in labels:
        f.parts.append(
            f'<text x="{f.px(x) + 4:.1f}" y="{f.py(y) - 4:.1f}" fill="#555">{escape(text)}</text>'
        )
    if vline is not None:
        x = f.px(vline[0])
        f.parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{H - BOTTOM}" stroke="#000" '
            'stroke-width="1.2" stroke-dasharray="4 3"/>'
            f'<text x="{x + 3:.1f}" y="{TOP + 12}" font-weight="bold">{escape(vline[1])}</text>'
        )
    return f.svg()


def scatter_chart(
    title: str,
    xlabel: str,
    ylabel: str,
    series: Mapping[str, Sequence[tuple[float, float]]],
    colors: Mapping[str, str] | None = None,
) -> str:
    """Points only, one colour per series (e.g. each request of each arm)."""
    return xy_chart(title, xlabel, ylabel, series, colors=colors, lines=False)

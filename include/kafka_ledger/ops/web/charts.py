"""Small inline SVG charts for the ledger page: drawn on the server, no script and nothing fetched."""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

WIDTH, HEIGHT, PAD_LEFT, PAD_BOTTOM, PAD_TOP = 640, 160, 56, 22, 10


@dataclass(frozen=True)
class Point:
    """One bar: its label under the axis (a batch id), its value (None: not known), its hover text."""

    label: str
    value: int | None
    title: str


def bar_chart(points: list[Point], caption: str, colour: str = "#3b82f6") -> str:
    """An SVG bar chart with a zero-based axis and the maximum labelled; unknown values are left as gaps."""
    known = [p.value for p in points if p.value is not None]
    if not known:
        return f'<p class="empty">{escape(caption)}: nothing to show yet.</p>'
    top = max(max(known), 1)
    plot_w, plot_h = WIDTH - PAD_LEFT - 4, HEIGHT - PAD_BOTTOM - PAD_TOP
    step = plot_w / len(points)
    bar_w = min(max(1.0, step * 0.8), 40.0)
    parts = [
        f"<figure><figcaption>{escape(caption)}</figcaption>",
        f'<svg class="chart" role="img" aria-label="{escape(caption)}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(caption)}</title>",
        f'<line x1="{PAD_LEFT}" y1="{PAD_TOP + plot_h}" x2="{WIDTH}" y2="{PAD_TOP + plot_h}" stroke="#888"/>',
        f'<text x="{PAD_LEFT - 4}" y="{PAD_TOP + 8}" text-anchor="end" font-size="10">{top:,}</text>',
        f'<text x="{PAD_LEFT - 4}" y="{PAD_TOP + plot_h}" text-anchor="end" font-size="10">0</text>',
    ]
    label_every = max(1, len(points) // 12)
    for i, p in enumerate(points):
        x = PAD_LEFT + i * step + (step - bar_w) / 2
        if p.value is not None:
            h = plot_h * p.value / top
            parts.append(f'<rect x="{x:.1f}" y="{PAD_TOP + plot_h - h:.1f}" width="{bar_w:.1f}" height="{h:.1f}" '
                         f'fill="{colour}"><title>{escape(p.title)}</title></rect>')
        if i % label_every == 0:
            parts.append(f'<text x="{x + bar_w / 2:.1f}" y="{HEIGHT - 6}" text-anchor="middle" font-size="10">'
                         f"{escape(p.label)}</text>")
    parts.append("</svg></figure>")
    return "".join(parts)

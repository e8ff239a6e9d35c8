"""PNG plots with matplotlib (Agg, no pyplot): fields over time and method durations.

Plots are described as jobs (`FieldPlot`, `StripPlot`, `DurationPlot`, `CallCountPlot`)
that the report's helper processes draw with `draw_here`, each next to the pages that
show them; each process keeps one figure and reuses it, since building figures and ticks
is most of matplotlib's cost.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from ctracer.event import Layout

#: one sober look for every plot
_INK = "#1d2733"
_GRID = "#e3e7ec"
_BLUE = "#2b5d8a"
_PALETTE = ("#2b5d8a", "#c0392b", "#2e8b57", "#8e44ad", "#d35400", "#16a085", "#7f8c8d",
            "#b7950b", "#34495e", "#a93226")
_PALETTE_LIGHT = ("#8fb3d9", "#f1948a", "#82e0aa", "#c39bd3", "#f0b27a", "#76d7c4",
                  "#bfc9ca", "#f7dc6f", "#85929e", "#e6b0aa")
_WIDTH_IN, _DPI = 8.0, 100
_LEFT_PX, _RIGHT_PX, _TOP_PX, _BOTTOM_PX = 150, 20, 34, 46
_LEGEND_PX = 150  # right margin when a legend names the objects
MAX_DOTS = 4000   # dots in a duration plot


def envelope(values: Sequence[float], budget: int) -> list[int]:
    """Indices of at most ``budget`` of ``values`` that keep their shape: the values in
    ``budget // 4`` equal stretches, each kept by its first, last, lowest and highest
    (all of them when there are no more than ``budget``)."""
    n = len(values)
    if n <= budget:
        return list(range(n))
    stretches = max(1, budget // 4)
    keep: set[int] = set()
    for k in range(stretches):
        lo, hi = k * n // stretches, (k + 1) * n // stretches
        if lo == hi:
            continue
        part = range(lo, hi)
        keep.update((lo, hi - 1, min(part, key=values.__getitem__),
                     max(part, key=values.__getitem__)))
    return sorted(keep)


#: rows of a strip plot's image at most (one object a row): its axes are ~390 pixels
#: high, so beyond ~1000 rows matplotlib drew one of several anyway, after colouring
#: and resampling every row (a third of the plot's time at 2,700 objects)
MAX_STRIPS = 1000


@dataclass
class Series:
    """One object's values of a field: at ``times`` (ns since trace start, or since the
    object's first event in a strip plot) the ``values``, the first value then each
    change; kept as a column of times and a list of values, not a tuple per point (a
    strip plot of every object of a big trace holds millions)."""

    label: str
    times: Any        # numpy int64 array, or a list of ints
    values: list
    end_ns: int       # the last time the object was seen

    @classmethod
    def of_points(cls, label: str, points: Sequence[tuple[int, Any]], end_ns: int) -> "Series":
        """A series from (time, value) points."""
        return cls(label, [t for t, _ in points], [v for _, v in points], end_ns)

    @property
    def points(self) -> list[tuple[int, Any]]:
        """The series as (time, value) points."""
        times = self.times.tolist() if hasattr(self.times, "tolist") else self.times
        return list(zip(times, self.values))


class DrawnLater(list):
    """A plot's series made when the plot is drawn (`filled`), not when its page is
    written, and let go after: every field's series of a kernel trace's few objects
    with millions of changes each were gigabytes of Python values held together until
    the plots were drawn.  ``of``: how many objects they stand for."""

    def __init__(self, of: int, fill: Optional[Callable[[list], None]] = None):
        super().__init__()
        self.of = of
        self.fill = fill

    @contextmanager
    def filled(self) -> Iterator["DrawnLater"]:
        """The series made (by ``fill``) while the block draws them, then let go."""
        if self.fill is None:
            yield self
            return
        self.fill(self)
        try:
            yield self
        finally:
            self.clear()


class Strips(DrawnLater):
    """The series of a strip plot: one per object, of the ``of`` objects whose field
    changed; beyond `MAX_STRIPS` of them only every `sampling`-th object's series is
    kept (every object's values of a 10M-event trace were 150 MB in a helper)."""

    @staticmethod
    def sampling(objects: int) -> int:
        """Every how many objects one strip is drawn."""
        return max(1, -(-objects // MAX_STRIPS))


def ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``4th``, ``11th``, ``12th``, ``13th``, ``21st``..."""
    last = n % 10 if n % 100 not in (11, 12, 13) else 0
    return f"{n}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(last, 'th')}"


def objects_in(series: list) -> int:
    """How many objects a plot's series stand for (`Strips` may hold some of them)."""
    return series.of if isinstance(series, DrawnLater) else len(series)


@dataclass
class FieldPlot:
    """A PNG plot of one field over time, one series per object."""

    path: str
    field: str
    title: str
    series: list[Series]


@dataclass
class StripPlot:
    """A field across many objects: a strip per object (rows, in order of first
    appearance), time since that object was first seen across, the value as colour.
    Series points are (ns since the object's first event, value); ``end_ns`` is the
    object's last event on the same clock."""

    path: str
    field: str
    title: str
    series: list[Series]


@dataclass
class DurationPlot:
    """A PNG plot of one method's call durations over time."""

    path: str
    title: str
    call_times: Any  # ns since trace start (an array or a list)
    durations: Any   # ns


@dataclass
class CallCountPlot:
    """A PNG bar chart of calls (or tracepoint hits) per function."""

    path: str
    title: str
    bars: list[tuple[str, int]] = field(default_factory=list)  # (function, calls)
    unit: str = "calls"   # "hits" for tracepoints


def literal(text: str) -> str:
    """``text`` as matplotlib must draw it: literally.  Strings from a trace (char[]
    contents, names) may hold ``$…$``, which matplotlib would otherwise read as mathtext
    (and fail on, or render as formulas); an escaped dollar is drawn as a dollar."""
    return text.replace("$", r"\$")


def _compact(value: float, _pos: object = None) -> str:
    """Tick labels that stay short: 950, 16 k, 72.1 M, 3.4 G; exact below 10 000."""
    magnitude = abs(value)
    if magnitude < 10_000:
        return f"{value:g}"
    for limit, suffix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if magnitude >= limit:
            return f"{value / limit:.3g} {suffix}"
    return f"{value:g}"


class _Painter:
    """A process's figures, one per size, reused from plot to plot."""

    def __init__(self, layout: Optional[Layout] = None):
        from ctracer.report.values import ValueFormatter

        self.fmt = ValueFormatter(layout) if layout is not None else None
        self._canvases: dict[tuple[float, int, int], Any] = {}

    def _frame(self, height_in: float, left_px: int = _LEFT_PX,
               right_px: int = _RIGHT_PX) -> Any:
        """Axes of the wanted size, emptied of the previous plot but keeping their
        styling and ticks (building those is most of matplotlib's cost)."""
        key = (round(height_in * 4) / 4, left_px, right_px)
        ax = self._canvases.get(key)
        if ax is None:
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure

            height = key[0]
            fig = Figure(figsize=(_WIDTH_IN, height), dpi=_DPI, facecolor="white")
            FigureCanvasAgg(fig)
            h, w = height * _DPI, _WIDTH_IN * _DPI
            fig.subplots_adjust(left=left_px / w, right=1 - right_px / w,
                                top=1 - _TOP_PX / h, bottom=_BOTTOM_PX / h)
            ax = fig.add_subplot()
            ax.set_facecolor("white")
            ax.set_axisbelow(True)
            for side in ("top", "right"):
                ax.spines[side].set_visible(False)
            for side in ("left", "bottom"):
                ax.spines[side].set_color("#9aa5b1")
            ax.tick_params(colors=_INK, labelsize=8.5, length=3)
            # axis labels at fixed offsets: matplotlib's own placement measures every tick
            # label on each draw, a good part of the cost of a small plot
            ax._ctracer_xlabel = ax.annotate(  # type: ignore[attr-defined]
                "", xy=(0.5, 0), xycoords="axes fraction", xytext=(0, -22),
                textcoords="offset points", ha="center", va="top", fontsize=8.5, color=_INK)
            ax._ctracer_ylabel = ax.annotate(  # type: ignore[attr-defined]
                "", xy=(0, 0.5), xycoords="axes fraction", xytext=(-left_px + 14, 0),
                textcoords="offset pixels", ha="left", va="center", rotation=90,
                fontsize=8.5, color=_INK)
            self._canvases[key] = ax
        for artist in list(ax.lines) + list(ax.collections) + list(ax.patches):
            artist.remove()
        if ax.get_legend() is not None:
            ax.get_legend().remove()
        if ax.get_yscale() != "linear":
            ax.set_yscale("linear")
        from matplotlib.ticker import AutoLocator, ScalarFormatter

        for axis in (ax.xaxis, ax.yaxis):  # whatever the previous plot on these axes set
            axis.set_major_locator(AutoLocator())
            axis.set_major_formatter(ScalarFormatter())
        ax.grid(True, color=_GRID, linewidth=0.8)
        ax.relim()
        ax.autoscale(True)
        return ax

    @staticmethod
    def _labels(ax: Any, title: str, xlabel: str, ylabel: str = "") -> None:
        # a title at a given height skips matplotlib's search for a free spot
        ax.set_title(literal(title), loc="left", fontsize=10, color=_INK, y=1.0, pad=8)
        ax._ctracer_xlabel.set_text(xlabel)
        ax._ctracer_ylabel.set_text(ylabel)

    def _save(self, ax: Any, path: str) -> None:
        """Draw and write an RGB PNG with fast deflate: half the cost of ``savefig``'s
        RGBA at default compression, for files about as small (plots are flat colour)."""
        from PIL import Image

        canvas = ax.figure.canvas
        canvas.draw()
        pixels = np.asarray(canvas.buffer_rgba())[..., :3]
        Image.fromarray(pixels).save(path, format="PNG", compress_level=1)

    def field_plot(self, job: FieldPlot) -> None:
        from matplotlib.ticker import FixedFormatter, FixedLocator, FuncFormatter, MaxNLocator

        values = [v for s in job.series for v in s.values]
        numbers, ticks = self.fmt.plot_axis(job.field, values)
        levels = len(ticks) if ticks else 6
        many = len(job.series) > 1
        # a few fixed heights, so worker processes reuse a handful of figures
        height = 2.4 if levels <= 6 else 3.4 if levels <= 11 else 4.6 if levels <= 16 else 6.5
        ax = self._frame(height, right_px=_LEGEND_PX if many else _RIGHT_PX)
        at = 0
        for i, s in enumerate(job.series):
            ys = numbers[at:at + len(s.points)]
            at += len(s.points)
            xs = [t / 1e6 for t, _ in s.points]
            end = max(s.end_ns / 1e6, xs[-1])
            color = _PALETTE[i % len(_PALETTE)] if many else _BLUE
            ax.plot(xs + [end], ys + [ys[-1]], drawstyle="steps-post", color=color,
                    linewidth=1.0 if many else 1.5, alpha=0.85 if many else 1.0,
                    label=literal(s.label))
            if len(s.points) <= 80:
                ax.plot(xs, ys, linestyle="none", marker="o", markersize=3 if many else 3.5,
                        color=color)
        if ticks:
            ax.yaxis.set_major_locator(FixedLocator([p for p, _ in ticks]))
            ax.yaxis.set_major_formatter(FixedFormatter([literal(t) for _, t in ticks]))
            lo, hi = min(p for p, _ in ticks), max(p for p, _ in ticks)
            ax.set_ylim(lo - 0.5, hi + 0.5)
        else:
            ax.yaxis.set_major_locator(MaxNLocator(nbins=6, integer=True))
            ax.yaxis.set_major_formatter(FuncFormatter(_compact))
            lo, hi = min(numbers), max(numbers)
            pad = (hi - lo) * 0.08 or max(1.0, abs(hi) * 0.05)
            ax.set_ylim(lo - pad, hi + pad)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5))
        self._labels(ax, job.title, "ms since the trace started")
        if many:
            ax.legend(fontsize=7.5, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                      handlelength=1.2, borderaxespad=0.2)
        self._save(ax, job.path)

    def strip_plot(self, job: StripPlot) -> None:
        from matplotlib.colors import ListedColormap
        from matplotlib.patches import Patch

        values = [v for s in job.series for v in s.values]
        numbers, ticks = self.fmt.plot_axis(job.field, values)
        longest = max((s.end_ns for s in job.series), default=1) or 1
        bins = 400
        edges = np.linspace(0, longest, bins, endpoint=False)
        # the image is a few hundred pixels high: beyond MAX_STRIPS objects every
        # step-th one is drawn (a grid of every object of a 10M-event trace, and
        # matplotlib's copies of it, were gigabytes); `Strips` come sampled already
        total = objects_in(job.series)
        sampled_before = total > len(job.series)
        step = 1 if sampled_before else Strips.sampling(len(job.series))
        grid = np.full((-(-len(job.series) // step), bins), np.nan)
        at = 0
        for i, s in enumerate(job.series):
            n = len(s.values)
            at += n
            if i % step:
                continue
            row = i // step
            ys = np.asarray(numbers[at - n:at], dtype=float)
            ts = np.asarray(s.times, dtype=float)
            idx = np.searchsorted(ts, edges, side="right") - 1
            alive = (idx >= 0) & (edges <= max(s.end_ns, ts[-1]))
            grid[row, alive] = ys[idx[alive]]
        categorical = ticks is not None and len(ticks) <= len(_PALETTE) * 2
        # a figure of its own (a colour bar changes the figure: not one to reuse)
        ax = _Painter()._frame(4.6, right_px=_LEGEND_PX if categorical else 110)
        ax.grid(False)
        if categorical:
            colours = [(_PALETTE + _PALETTE_LIGHT)[i] for i in range(len(ticks))]
            cmap = ListedColormap(colours)
            image = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap=cmap,
                              vmin=-0.5, vmax=len(ticks) - 0.5, origin="upper",
                              extent=(0, longest / 1e6, total, 0))
            ax.legend(handles=[Patch(color=c, label=literal(label))
                               for c, (_, label) in zip(colours, ticks)],
                      fontsize=7.5, frameon=False, loc="upper left",
                      bbox_to_anchor=(1.01, 1.0), handlelength=1.0, borderaxespad=0.2)
        else:
            image = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap="viridis",
                              origin="upper", extent=(0, longest / 1e6, total, 0))
            bar = ax.figure.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
            bar.ax.tick_params(labelsize=7.5)
            if ticks:
                bar.set_ticks([p for p, _ in ticks][::max(1, len(ticks) // 12)])
                bar.set_ticklabels([literal(t) for _, t in ticks][::max(1, len(ticks) // 12)])
        from matplotlib.ticker import MaxNLocator
        ax.yaxis.set_major_locator(MaxNLocator(nbins=6, integer=True))
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5))
        every = Strips.sampling(total)
        sampled = f", every {ordinal(every)} drawn" if every > 1 else ""
        self._labels(ax, job.title, "ms since the object was first seen",
                     f"objects (of {total}{sampled}), by first appearance")
        self._save(ax, job.path)

    def duration_plot(self, job: DurationPlot) -> None:
        ax = self._frame(2.6, left_px=80)
        # arrays, not lists: a method called millions of times has as many durations
        ys_all = np.maximum(np.asarray(job.durations, np.int64), 1) / 1e3
        # beyond a few thousand dots a scatter is ink: every n-th call is drawn (the
        # median line and the title count them all)
        step = max(1, len(job.call_times) // MAX_DOTS)
        xs = np.asarray(job.call_times, np.int64)[::step] / 1e6
        ys = ys_all[::step]
        ax.plot(xs, ys, linestyle="none", marker="o", markersize=3, color=_BLUE,
                alpha=0.6 if len(xs) > 200 else 0.9)
        if len(ys) and ys.max() / ys.min() > 50:
            ax.set_yscale("log")
        title = job.title + (f", every {ordinal(step)} drawn" if step > 1 else "")
        if len(ys_all):
            middle = len(ys_all) // 2
            median = float(np.partition(ys_all, middle)[middle])
            ax.axhline(median, color="#c0392b", linewidth=1, linestyle="--")
            title += f" (dashed: median {median:.1f} µs)"
        self._labels(ax, title, "call start, ms since the trace started", "duration (µs)")
        self._save(ax, job.path)

    def call_count_plot(self, job: CallCountPlot) -> None:
        bars = job.bars[::-1]
        longest = max((len(n) for n, _ in bars), default=8)
        ax = self._frame(min(12.0, 0.22 * len(bars) + 1.1),
                         left_px=min(320, 24 + 7 * longest))
        ax.grid(False, axis="y")
        ax.barh(range(len(bars)), [c for _, c in bars], color=_BLUE, height=0.65)
        ax.set_yticks(range(len(bars)), [literal(n) for n, _ in bars])
        ax.set_ylim(-0.6, len(bars) - 0.4)
        self._labels(ax, job.title, job.unit)
        self._save(ax, job.path)


_painter: Optional[_Painter] = None


def _init_worker(layout_json: str) -> None:
    global _painter
    _painter = _Painter(Layout.from_json(layout_json))


def _draw_chunk(jobs: Sequence[Any]) -> int:
    assert _painter is not None
    for job in jobs:
        if isinstance(job, (FieldPlot, StripPlot)):
            draw = _painter.field_plot if isinstance(job, FieldPlot) else _painter.strip_plot
            if isinstance(job.series, DrawnLater):
                with job.series.filled():
                    draw(job)
            else:
                draw(job)
        elif isinstance(job, DurationPlot):
            _painter.duration_plot(job)
        else:
            _painter.call_count_plot(job)
    return len(jobs)


def draw_here(jobs: list[Any], layout: Layout) -> None:
    """Draw ``jobs`` in this process, with its one figure (made at the first call)."""
    if not jobs:
        return
    if _painter is None:
        _init_worker(layout.to_json())
    _draw_chunk(jobs)

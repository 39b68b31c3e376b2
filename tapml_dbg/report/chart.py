"""The report's chart: every op's error along the model, drawn by matplotlib as inline SVG.

Log scale (errors span 1e-8 to 1); isolated and propagated errors as two series with the
tolerance each was held to; layers as alternating bands; failing ops in red; the culprit as a
vertical line. An exact result (error 0) has no place on a log axis: it sits on the bottom
edge, marked as exact. A unit that did not run (compile error, crash, timeout) is a mark on the
top edge. The noise floor ([8]) is drawn where the report holds one. A second chart draws
[9]'s migration curve: the model output's error per `migrate` step. A generation trace ([15])
gets dashed lines where each step's ops start, and a chart of its own: per step, the worst
propagated op error and the logits' error beside the logits' KL, the first bad token marked.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

from tapml_dbg.engine.report import ErrorReport, GenerationReport, MigrationPoint
from tapml_dbg.judge.verdict import ISOLATED, PROPAGATED

FIGURE_INCHES = (12.0, 4.6)  # about the width of a laptop browser window at 96 dpi
ZOOM_INCHES = (12.0, 3.4)
ZOOM_RADIUS = 12  # ops on each side of the culprit in the zoomed chart
ZOOM_MIN_OPS = 60  # models with more ops than this get a zoomed chart around the culprit
FLOOR_DECADES_BELOW = 1.0  # the exact-result edge sits this many decades below the smallest error
SMALLEST_FLOOR = 1e-12
LARGEST_ERROR = 10.0  # errors above (and NaN) are clipped to the top edge
MAX_STEP_TICKS = 24  # a generation chart with more steps than this labels only some
BAND_LABEL_MIN_OPS = 3  # a band narrower than this many ops gets no label
COLORS = {ISOLATED: "#1f77b4", PROPAGATED: "#ff7f0e", "fail": "#d62728", "culprit": "#d62728",
          "band": ("#e6ebf3", "#f4efe4"), "noise": "#7f7f7f", "failed_run": "#9467bd"}
SVG_ID = "error-chart"  # the element the browser test looks for
MIGRATION_SVG_ID = "migration-chart"
MIGRATION_INCHES = (8.0, 3.0)
GENERATION_SVG_ID = "generation-chart"
GENERATION_INCHES = (12.0, 3.4)
STEP_COLORS = {"worst": COLORS[PROPAGATED], "logits": "#2ca02c", "kl": "#8c564b", "boundary": "#6b6b6b",
               "first_bad": COLORS["culprit"]}


@dataclass
class Axes:
    """The y range the series share."""

    floor: float  # where exact results sit
    top: float


def error_chart_svg(report: ErrorReport, first: int | None = None, last: int | None = None,
                    element_id: str = SVG_ID, inches: tuple[float, float] = FIGURE_INCHES) -> str:
    """The chart of ops [first, last] (default all) as an `<svg>` element with `element_id`."""
    from matplotlib.figure import Figure  # heavy: only when a report is drawn
    from matplotlib.ticker import MaxNLocator

    points = report.points[first:None if last is None else last + 1] if first is not None else report.points
    axes = _axes(points)
    figure = Figure(figsize=inches, layout="constrained")
    ax = figure.add_subplot()
    lo, hi = (points[0].index, points[-1].index) if points else (0, 0)
    _bands(ax, report, lo, hi)
    _step_boundaries(ax, report, lo, hi)
    for mode, marker in ((ISOLATED, "o"), (PROPAGATED, "s")):
        _series(ax, points, mode, marker, axes)
    _noise_floor(ax, points)
    if report.culprit is not None and lo <= report.culprit.index <= hi:
        culprit = report.culprit
        ax.axvline(culprit.index, color=COLORS["culprit"], linewidth=1.2, linestyle="-", alpha=0.8, zorder=1)
        ax.annotate(f"#{culprit.index} {culprit.name} ({culprit.verdict})", xy=(culprit.index, axes.top),
                    xytext=(4, -14), textcoords="offset points", color=COLORS["culprit"], fontsize=9,
                    fontweight="bold", va="top")
    ax.set_yscale("log")
    ax.set_ylim(axes.floor / 2, axes.top * 2)
    ax.set_xlim(lo - 0.5, hi + 0.5)
    ax.set_xlabel("op index (execution order)")
    ax.set_ylabel("max |target - source| / absmax(source)")
    ax.grid(True, which="major", axis="y", color="#dddddd", linewidth=0.6)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    figure.legend(loc="outside lower center", fontsize=8, ncols=4, frameon=False)
    buffer = io.StringIO()
    with _svg_text_as_text():
        figure.savefig(buffer, format="svg")
    return _inline(buffer.getvalue(), element_id)


def migration_chart_svg(points: list[MigrationPoint], element_id: str = MIGRATION_SVG_ID,
                        inches: tuple[float, float] = MIGRATION_INCHES) -> str:
    """[9]'s curve: the model output's error per migration step (log scale; a failing step in red, a
    non-finite error drawn at the top), as an `<svg>` element with `element_id`."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    finite = [p.error for p in points if p.error is not None and p.error > 0]
    floor = min(finite) / 2 if finite else 1e-8
    top = max(finite) * 4 if finite else 1.0
    figure = Figure(figsize=inches, layout="constrained")
    ax = figure.add_subplot()
    steps = list(range(1, len(points) + 1))
    values = [top if p.error is None else max(p.error, floor) for p in points]
    ax.plot(steps, values, color=COLORS[PROPAGATED], linewidth=1.2, zorder=2)
    for step, value, point in zip(steps, values, points):
        ax.scatter([step], [value], color=COLORS["culprit"] if not point.passed else COLORS[ISOLATED],
                   marker="x" if point.error is None else "o", s=28, zorder=3)
    ax.set_yscale("log")
    ax.set_ylim(floor / 2, top * 2)
    ax.set_xlim(0.5, len(points) + 0.5)
    ax.set_xticks(steps, [str(step) for step in steps])
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("migration step (ops offloaded grow left to right; x: not finite)")
    ax.set_ylabel("model output error")
    ax.grid(True, which="major", axis="y", color="#dddddd", linewidth=0.6)
    buffer = io.StringIO()
    with _svg_text_as_text():
        figure.savefig(buffer, format="svg")
    return _inline(buffer.getvalue(), element_id, "migration chart")


def generation_chart_svg(generation: GenerationReport, element_id: str = GENERATION_SVG_ID,
                         inches: tuple[float, float] = GENERATION_INCHES) -> str:
    """[15]'s two charts side by side, one point per step (log scales): the worst propagated error of
    the step's ops and the error of its logits; the KL of its logits. The first bad token's step is a
    red line on both. As an `<svg>` element with `element_id`."""
    from matplotlib.figure import Figure

    steps = generation.steps
    tokens = [(s.step, s.token) for s in steps if s.token is not None]
    figure = Figure(figsize=inches, layout="constrained")
    error_ax, kl_ax = figure.subplots(1, 2)
    errors = [(s.step, s.worst) for s in steps] + [(k, t.error) for k, t in tokens]
    axes = _step_axes([e for _, e in errors], cap=LARGEST_ERROR)
    _step_series(error_ax, [(s.step, s.worst) for s in steps], axes, STEP_COLORS["worst"], "o",
                 "worst op error of the step (propagated)")
    _step_series(error_ax, [(k, t.error) for k, t in tokens], axes, STEP_COLORS["logits"], "s",
                 "the step's logits error")
    kl_axes = _step_axes([t.kl for _, t in tokens])
    _step_series(kl_ax, [(k, t.kl) for k, t in tokens], kl_axes, STEP_COLORS["kl"], "D", "KL(source || target)")
    bad = [(k, kl_axes.top if not math.isfinite(t.kl) else max(t.kl, kl_axes.floor)) for k, t in tokens
           if t.source != t.target]
    if bad:
        kl_ax.scatter(*zip(*bad), s=60, facecolors="none", edgecolors=COLORS["fail"], linewidths=1.6, zorder=4,
                      label="token differs")
    first = generation.first_bad
    numbers = [s.step for s in steps] or [0]
    for ax, ranges, title, ylabel in ((error_ax, axes, "error per step", "max |target - source| / absmax(source)"),
                                      (kl_ax, kl_axes, "KL of the step's logits", "nats")):
        if first is not None:
            ax.axvline(first.step, color=STEP_COLORS["first_bad"], linewidth=1.2, alpha=0.8, zorder=1)
            ax.annotate(f"first bad token: step {first.step} ({first.verdict})", xy=(first.step, ranges.top),
                        xytext=(4, -4), textcoords="offset points", color=STEP_COLORS["first_bad"], fontsize=8,
                        fontweight="bold", va="top")
        ax.set_yscale("log")
        ax.set_ylim(ranges.floor / 2, ranges.top * 2)
        ax.set_xlim(min(numbers) - 0.5, max(numbers) + 0.5)
        ax.set_xticks(numbers, [str(k) for k in numbers])
        if len(numbers) > MAX_STEP_TICKS:
            from matplotlib.ticker import MaxNLocator

            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("generation step (0: the prefill)")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=9)
        ax.grid(True, which="major", axis="y", color="#dddddd", linewidth=0.6)
        if ax.get_legend_handles_labels()[0]:  # a chain that stopped before the first step draws nothing
            ax.legend(fontsize=7, loc="lower right", frameon=False)
    buffer = io.StringIO()
    with _svg_text_as_text():
        figure.savefig(buffer, format="svg")
    return _inline(buffer.getvalue(), element_id, "error and KL per generation step")


def _step_axes(values: list[float | None], cap: float | None = None) -> Axes:
    """The y range of one step chart: a decade below the smallest positive value (where 0 sits) up to
    the largest finite one (`cap` at most; non-finite values sit on the top edge)."""
    finite = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    smallest = min(finite) if finite else 1e-6
    floor = max(SMALLEST_FLOOR, 10 ** (math.floor(math.log10(smallest)) - FLOOR_DECADES_BELOW))
    top = max(finite + [floor * 10])
    return Axes(floor, min(cap, top) if cap is not None else top)


def _step_series(ax, pairs: list[tuple[int, float | None]], axes: Axes, color: str, marker: str, label: str) -> None:
    """One value per step as a line of markers; 0 on the bottom edge, NaN and Inf on the top edge (x)."""
    shown = [(k, _plotted(v, axes)) for k, v in pairs if v is not None]
    if not shown:
        return
    ax.plot(*zip(*shown), color=color, marker=marker, markersize=5, linewidth=1.0, alpha=0.9, label=label, zorder=3)
    off = [(k, axes.top) for k, v in pairs if v is not None and not math.isfinite(v)]
    if off:
        ax.scatter(*zip(*off), marker="X", s=60, color=COLORS["failed_run"], zorder=5, label=f"{label}: not finite")


def _step_boundaries(ax, report: ErrorReport, lo: int, hi: int) -> None:
    """A generation trace's steps on the per-op chart: a dashed line where each step's ops start,
    labelled with its number."""
    if report.generation is None:
        return
    for step in report.generation.steps:
        if step.first is None or not lo <= step.first <= hi:
            continue
        if step.first > lo:
            ax.axvline(step.first - 0.5, color=STEP_COLORS["boundary"], linewidth=0.9, linestyle="--", zorder=1)
        ax.annotate(f"step {step.step}" if step.step else "prefill", xy=(step.first - 0.5, 1.0),
                    xycoords=("data", "axes fraction"), xytext=(3, -3), textcoords="offset points", ha="left",
                    va="top", fontsize=7, color=STEP_COLORS["boundary"], zorder=6, annotation_clip=True,
                    bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.75})


def zoom_range(report: ErrorReport) -> tuple[int, int] | None:
    """The ops a zoomed chart shows (around the culprit), or None when the full chart is enough."""
    if report.culprit is None or len(report.points) <= ZOOM_MIN_OPS:
        return None
    index = report.culprit.index
    return max(0, index - ZOOM_RADIUS), min(len(report.points) - 1, index + ZOOM_RADIUS)


def _axes(points) -> Axes:
    errors = [e for p in points for e in (p.error(ISOLATED), p.error(PROPAGATED)) if e is not None]
    finite = [e for e in errors if math.isfinite(e) and e > 0]
    smallest = min(finite) if finite else 1e-6
    floor = max(SMALLEST_FLOOR, 10 ** (math.floor(math.log10(smallest)) - FLOOR_DECADES_BELOW))
    tolerances = [t for p in points for t in (p.tolerance(ISOLATED), p.tolerance(PROPAGATED)) if t]
    top = min(LARGEST_ERROR, max(finite + tolerances + [floor * 10]))
    return Axes(floor, top)


def _plotted(value: float | None, axes: Axes) -> float | None:
    if value is None:
        return None
    if not math.isfinite(value) or value > axes.top:
        return axes.top
    return max(value, axes.floor)


def _series(ax, points, mode, marker: str, axes: Axes) -> None:
    xs, ys, fails, exact, failed_runs, tol_x, tol_y = [], [], [], [], [], [], []
    for point in points:
        verdict = point.verdict(mode)
        if verdict is None:
            continue
        if point.failed_run(mode):
            failed_runs.append(point.index)
            continue
        error = point.error(mode)
        if error is None:
            continue
        y = _plotted(error, axes)
        xs.append(point.index)
        ys.append(y)
        if error == 0:
            exact.append((point.index, y))
        if verdict.failed:
            fails.append((point.index, y))
        tolerance = point.tolerance(mode)
        if tolerance:
            tol_x.append(point.index)
            tol_y.append(tolerance)
    color = COLORS[mode]
    # isolated errors are independent per op: points; propagated ones flow along the chain: a line
    ax.plot(xs, ys, color=color, linewidth=1.0 if mode == PROPAGATED else 0, alpha=0.85, marker=marker,
            markersize=4 if mode == ISOLATED else 3, label=f"{mode} error", zorder=3)
    if tol_x:
        ax.step(tol_x, tol_y, where="mid", color=color, linestyle=":", linewidth=1.2, alpha=0.9,
                label=f"{mode} tolerance", zorder=2)
    if fails:
        ax.scatter(*zip(*fails), s=46, facecolors="none", edgecolors=COLORS["fail"], linewidths=1.6, zorder=4,
                   label=f"{mode} FAIL")
    if exact and mode == ISOLATED:
        ax.annotate("exact (error 0)", xy=(0, axes.floor), xycoords=("axes fraction", "data"), xytext=(4, 3),
                    textcoords="offset points", fontsize=7, color="#555555")
    if failed_runs:
        ax.scatter(failed_runs, [axes.top] * len(failed_runs), marker="X", s=60, color=COLORS["failed_run"],
                   zorder=5, label=f"{mode}: did not run")


def _noise_floor(ax, points) -> None:
    pairs = [(p.index, p.noise_floor()) for p in points if p.noise_floor() is not None]
    if pairs:
        xs, ys = zip(*pairs)
        ax.step(xs, [max(y, SMALLEST_FLOOR) for y in ys], where="mid", color=COLORS["noise"], linewidth=1.0,
                label="source noise floor", zorder=2)


def _bands(ax, report: ErrorReport, lo: int, hi: int) -> None:
    shades = COLORS["band"]
    for number, band in enumerate(b for b in report.bands if b.last >= lo and b.first <= hi):
        ax.axvspan(band.first - 0.5, band.last + 0.5, color=shades[number % 2], zorder=0, linewidth=0)
        ax.axvline(band.first - 0.5, color="#c9d1de", linewidth=0.5, zorder=0)
        if band.last - band.first + 1 >= BAND_LABEL_MIN_OPS or hi - lo < 40:
            middle = (max(band.first, lo) + min(band.last, hi)) / 2
            ax.text(middle, 1.0, band.path, transform=ax.get_xaxis_transform(), ha="center", va="bottom",
                    fontsize=7, color="#44546a", rotation=0 if band.last - band.first > 8 else 45, clip_on=False)


class _svg_text_as_text:
    """Text as SVG <text> (selectable, small) rather than glyph paths, for this figure only."""

    def __enter__(self):
        import matplotlib

        self._context = matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "tapml-dbg"})
        self._context.__enter__()

    def __exit__(self, *exc):
        self._context.__exit__(*exc)


def _inline(svg: str, element_id: str, label: str = "per-op error chart") -> str:
    """The `<svg ...>` element alone (no XML prolog or doctype), with an id and a scalable width."""
    start = svg.index("<svg")
    element = svg[start:]
    head_end = element.index(">")
    head = element[:head_end]
    head = head.replace("<svg", f'<svg id="{element_id}" role="img" aria-label="{label}"', 1)
    return head + element[head_end:]

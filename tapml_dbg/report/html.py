"""`index.html` of `tapml-dbg report`: one self-contained page (no network, no script).

The page holds the verdict in one sentence, the chart (inline SVG), the culprit's card with the
command that dumps it, a generation trace's steps ([15]: error and KL per step, the first bad
token, a table of the steps), the migration curve ([9]) when the report carries one, the trace's
summary, and every op's two verdicts as a table. Everything from the trace is HTML-escaped.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from pathlib import Path

from tapml_dbg.engine.report import ErrorReport, GenerationReport, OpPoint, StepPoint
from tapml_dbg.errors import UsageError
from tapml_dbg.judge.compare import Metrics
from tapml_dbg.judge.tokens import BUG, DRIFT, SAME
from tapml_dbg.judge.verdict import ISOLATED, PROPAGATED, Status, Verdict
from tapml_dbg.repro.files import human_bytes
from tapml_dbg.report.chart import (ZOOM_INCHES, error_chart_svg, generation_chart_svg, migration_chart_svg,
                                       zoom_range)

INDEX_NAME = "index.html"
NOISE_ROWS = (("source err vs float64", "source_err"), ("target err vs float64", "target_err"),
              ("noise-floor bound", "noise_bound"), ("target / source error", "ratio"))
TITLE_PREFIX = "tapml-dbg report"
TOP = "<top>"  # how an op outside every layer is named
TOKEN_CSS = {SAME: "pass", DRIFT: "other", BUG: "FAIL"}  # a step's token verdict, styled as the op verdicts are
STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5em auto; max-width: 1200px;
       padding: 0 1em; color: #1d2330; }
h1 { font-size: 1.4em; margin-bottom: 0.2em; } h2 { font-size: 1.1em; margin-top: 1.6em; }
.verdict { font-size: 1.1em; padding: 0.6em 0.8em; border-radius: 6px; }
.verdict.diverged { background: #fdecea; border-left: 5px solid #d62728; }
.verdict.clean { background: #eaf6ec; border-left: 5px solid #2ca02c; }
figure { margin: 1em 0; } figure svg { width: 100%; height: auto; }
figcaption { font-size: 0.85em; color: #555; }
.card { border: 1px solid #d8dde6; border-radius: 6px; padding: 0.8em 1em; background: #fafbfd; }
table { border-collapse: collapse; font-size: 0.88em; }
th, td { padding: 0.2em 0.7em; text-align: left; border-bottom: 1px solid #eceff4; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.fail td { background: #fff3f2; } tr.culprit td { background: #fde0dd; font-weight: 600; }
tr.tvm-wide td { background: #e8f0fe; } .tvm-wide { color: #1a56b0; } .this-target { color: #b3261e; }
.FAIL { color: #c0211f; font-weight: 600; } .pass { color: #2a7a35; } .other { color: #7b3fa0; font-weight: 600; }
code, pre { font-family: ui-monospace, "SFMono-Regular", Menlo, monospace; font-size: 0.9em; }
pre { background: #f2f4f8; padding: 0.5em 0.7em; border-radius: 4px; overflow-x: auto; }
footer { margin-top: 2em; font-size: 0.8em; color: #666; }
"""


@dataclass
class ReportWritten:
    """What `write_report` wrote."""

    path: Path  # index.html
    bytes: int
    report: ErrorReport
    dump_command: str = ""


def prepare_folder(folder: str | Path, holds: str = INDEX_NAME) -> Path:
    """The report's folder (or one inside it), created; refused before any work when it cannot hold
    `holds`."""
    path = Path(folder)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{path} is a file; give -o a folder to write {holds} into")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create the report folder {path}: {exc.strerror or exc}") from None
    return path


def write_report(report: ErrorReport, folder: str | Path, dump_command: str = "", replay_command: str = "",
                 cause_commands: dict[int, str] | None = None) -> ReportWritten:
    """Write `folder/index.html`; `dump_command` and `replay_command` are what the culprit's card offers,
    `cause_commands` the dump command of each cause's first op (by op index)."""
    path = prepare_folder(folder) / INDEX_NAME
    text = page(report, dump_command, replay_command, cause_commands or {})
    path.write_text(text, encoding="utf-8")
    return ReportWritten(path, len(text.encode("utf-8")), report, dump_command)


def page(report: ErrorReport, dump_command: str = "", replay_command: str = "",
         cause_commands: dict[int, str] | None = None) -> str:
    """The whole page as one string."""
    model = report.summary.get("model") or Path(report.trace).name
    title = f"{TITLE_PREFIX}: {model} on {report.target}"
    parts = [f"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
             f"<title>{_e(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n",
             f"<h1>{_e(title)}</h1>\n", _headline(report),
             "<h2>Error along the model</h2>\n", _chart(report),
             _culprit_card(report, dump_command, replay_command), _causes(report, cause_commands or {}),
             _generation(report), _migration(report), _summary(report),
             _ops_table(report), _footer(report), "</body>\n</html>\n"]
    return "".join(parts)


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _headline(report: ErrorReport) -> str:
    ops = len(report.points)
    culprit = report.culprit
    if culprit is None:
        failing = len(report.failing(PROPAGATED))
        extra = f" ({failing} propagated verdict(s) fail, each inherited)" if failing else ""
        return (f'<p class="verdict clean" id="verdict">No divergence: all {ops} ops of the trace pass on '
                f"{_e(report.target)}, isolated and propagated{_e(extra)}.</p>\n") + _reference_html(report)
    why = culprit.diagnosis or f"its unit did not run to a value ({culprit.verdict})"  # judge/diagnosis.py
    point = report.culprit_point
    washes = ""
    if culprit.verdict == ISOLATED and point is not None and point.propagated is not None and point.propagated.passed:
        washes = (" Fed the target's own upstream values it stays within the (looser) propagated tolerance, so "
                  "the model's output may look fine.")
    return (f'<p class="verdict diverged" id="verdict">First divergent op: <b>#{culprit.index} '
            f"{_e(culprit.name)}</b> (<code>{_e(culprit.op)}</code>) in layer <code>{_e(culprit.layer or TOP)}</code>, "
            f"{_e(culprit.verdict)} verdict: {_e(why)}.{_e(washes)}</p>\n") + _reference_html(report)


ATTRIBUTION_HTML = {"target": ('this-target', "this platform's bug: the reference target agrees with the source here, "
                                              "the target does not"),
                    "tvm": ("tvm-wide", "every TVM target's: the reference target differs from the source here too")}


def _reference_html(report: ErrorReport) -> str:
    """Under a reference target: whose the culprit is, and the TVM-wide ops, each in its own colour."""
    if report.reference.get("kind") != "target":
        return ""
    ref = _e(report.reference.get("target"))
    text = [f'<p id="reference">Judged against the reference target <code>{ref}</code>, not the recorded source.']
    culprit = report.culprit
    if culprit is not None and culprit.attribution in ATTRIBUTION_HTML:
        css, words = ATTRIBUTION_HTML[culprit.attribution]
        text.append(f' Attribution: <b class="{css}">{_e(culprit.attribution)}</b>, {_e(words)}.')
    if report.tvm_wide:
        ops = ", ".join(f"#{op.index} <code>{_e(op.name)}</code> ({_e(op.verdict)})" for op in report.tvm_wide)
        text.append(f' <span class="tvm-wide">TVM-wide (the reference target differs from the source too; every TVM '
                    f"target's, not this platform's): {ops}.</span>")
    return "".join(text) + "</p>\n"


def _chart(report: ErrorReport) -> str:
    caption = ("Each op's worst output error, max |target - source| / absmax(source), on a log scale: "
               "<b>isolated</b> (the op fed the recorded source inputs) and <b>propagated</b> (fed the target's "
               "own upstream values); dotted: the tolerance each is held to; red rings: failing verdicts; "
               "shaded bands: layers; the red line: the culprit.")
    if report.has_noise_floor:
        caption += " Grey: the source's own error against a float64 reference (its noise floor)."
    if report.generation is not None:
        caption += " Dashed lines: where each generation step's ops start (step 0: the prefill)."
    text = f"<figure>\n{error_chart_svg(report)}\n<figcaption>{caption}</figcaption>\n</figure>\n"
    zoom = zoom_range(report)
    if zoom is not None:
        text += (f"<figure>\n{error_chart_svg(report, *zoom, element_id='error-chart-zoom', inches=ZOOM_INCHES)}\n"
                 f"<figcaption>Ops {zoom[0]}..{zoom[1]}, around the culprit.</figcaption>\n</figure>\n")
    return text


def _metric_rows(isolated: Metrics | None, propagated: Metrics | None) -> str:
    rows = [("max abs err", lambda m: f"{m.max_abs_err:.4g}"), ("err / absmax (rel)", lambda m: f"{m.scale_rel_err:.4g}"),
            ("max element rel err", lambda m: f"{m.max_rel_err:.4g}"), ("cosine", lambda m: f"{m.cosine:.8f}"),
            ("nan / inf mismatch", lambda m: f"{m.nan_mismatch} / {m.inf_mismatch}"),
            ("mismatched", lambda m: f"{m.mismatched} of {m.numel}"),
            ("tolerance", lambda m: f"rtol={m.rtol:g} atol={m.atol:g}")]
    for label, field in NOISE_ROWS:  # [8]'s figures against the float64 reference, where the verdicts have them
        if any(isinstance(getattr(m, field, None), (int, float)) for m in (isolated, propagated) if m is not None):
            rows.append((label, lambda m, field=field: _figure(getattr(m, field, None))))
    return "".join(f"<tr><th>{_e(label)}</th><td class=\"num\">{_e(fmt(isolated)) if isolated else '-'}</td>"
                   f"<td class=\"num\">{_e(fmt(propagated)) if propagated else '-'}</td></tr>\n" for label, fmt in rows)


def _figure(value) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) else "-"


def _status_html(verdict: Verdict | None) -> str:
    if verdict is None:
        return "-"
    if verdict.status == Status.FAIL:
        return '<span class="FAIL">FAIL</span>'
    if verdict.status == Status.PASS:
        return '<span class="pass">pass</span>'
    return f'<span class="other">{_e(verdict.status)}</span>'


def _culprit_card(report: ErrorReport, dump_command: str, replay_command: str) -> str:
    culprit, point = report.culprit, report.culprit_point
    if culprit is None or point is None:
        return ""
    iso, prop = point.isolated, point.propagated
    kind, evidence = point.wrong()
    found = ("bisect (prefix search, isolated confirmation and sweep)" if report.culprit_source == "bisect"
             else "the first op whose verdicts diverge (where `continue` stops)")
    rows = [("op", f"#{culprit.index} <b>{_e(culprit.name)}</b>"), ("source op", f"<code>{_e(culprit.op)}</code>"),
            ("layer", f"<code>{_e(culprit.layer or TOP)}</code>"), ("verdict", _e(culprit.verdict)),
            *([("diagnosis", _e(culprit.diagnosis))] if culprit.diagnosis else []), ("found by", _e(found)),
            *([("attribution", f'<span class="{ATTRIBUTION_HTML[culprit.attribution][0]}">{_e(culprit.attribution)}'
                               f"</span>: {_e(ATTRIBUTION_HTML[culprit.attribution][1])}")]
              if culprit.attribution in ATTRIBUTION_HTML else [])]
    rows[1:1] = _location_rows(culprit.source_location)  # the line it came from, under the op
    if kind:
        rows.append(("class", _e(kind) + (f" <span class=\"note\">({_e(evidence)})</span>" if evidence else "")))
    if culprit.message:
        rows.append(("message", _e(culprit.message)))
    text = ['<h2>The culprit</h2>\n<div class="card" id="culprit">\n<table>\n']
    text += [f"<tr><th>{label}</th><td>{value}</td></tr>\n" for label, value in rows]
    text.append("</table>\n<table>\n<tr><th></th><th>isolated (recorded inputs)</th><th>propagated (target inputs)"
                "</th></tr>\n")
    text.append(f"<tr><th>verdict</th><td>{_status_html(iso)}</td><td>{_status_html(prop)}</td></tr>\n")
    text.append(_metric_rows(iso.worst if iso else None, prop.worst if prop else None))
    text.append("</table>\n")
    if dump_command:
        text.append(f"<p>A standalone repro of the op (tvm + numpy only):</p>\n<pre id=\"dump-command\">"
                    f"{_e(dump_command)}</pre>\n")
    if replay_command:
        text.append(f"<p>Both verdicts side by side in the debugger:</p>\n<pre>{_e(replay_command)}</pre>\n")
    text.append("</div>\n")
    return "".join(text)


def _location_rows(location) -> list[tuple[str, str]]:
    """The culprit card's `model line` (the user's); a library's line as `library line`, the user's call
    above it as `model line`."""
    rows = []
    for label, where in (("library line" if location is not None and location.library else "model line", location),
                         ("model line", location.user if location is not None else None)):
        if where is not None:
            rows.append((label, f"<code>{_e(str(where))}</code> <code>{_e(where.code)}</code>"))
    return rows


def _causes(report: ErrorReport, commands: dict[int, str]) -> str:
    """`triage`'s answer: every divergence of the model, one row per cause, inherited failures folded in."""
    causes = report.causes
    if causes is None or not (causes.groups or causes.findings):
        return ""
    rows = []
    for number, group in enumerate(causes.groups + causes.findings, 1):  # findings: TVM's stock import
        ops = ", ".join(f"#{op.index} {_e(op.name)} ({_e(op.verdict)})" for op in group.ops)
        where = group.first.source_location
        line = "".join(f"<br>{called}<code>{_e(str(at))}</code> <code>{_e(at.code)}</code>"
                       for called, at in (("", where), ("called from ", where.user if where else None)) if at)
        command = commands.get(group.first.index, "")
        rows.append(f"<tr><td class=\"num\">{number}</td><td>{_e(group.cause)}{line}</td><td>{_e(group.wrong)}</td>"
                    f"<td>{ops}</td><td class=\"num\">{len(group.inherited)}</td>"
                    f"<td>{f'<code>{_e(command)}</code>' if command else ''}</td></tr>\n")
    return (f'<h2>Every cause</h2>\n<p>{len(causes.groups)} cause(s) of divergence, as <code>tapml-dbg triage</code> '
            "lists them: the ops that diverge by themselves, grouped by source op, class and failure signature; "
            "the failures they hand downstream are counted as inherited.</p>\n<table id=\"causes\">\n"
            "<tr><th></th><th>cause</th><th>class</th><th>ops</th><th>inherited</th><th>repro</th></tr>\n"
            f"{''.join(rows)}</table>\n")


def _generation(report: ErrorReport) -> str:
    """[15]: a generation trace's steps: error and KL per step, the first bad token, the steps' table."""
    generation = report.generation
    if generation is None:
        return ""
    caption = ("One point per step (0: the prefill), log scales. Left: the worst propagated error of the step's "
               "ops (every op fed the target's own upstream values, the KV cache included) and the error of the "
               "step's logits; right: KL(source || target) of the softmax of the step's logits, in nats. "
               "Teacher-forced: every step is fed the source's token. Red: the first bad token's step. A value "
               "below a chart's bottom (0, or a KL at rounding level) sits on its bottom edge; x: not finite.")
    chart = f"<figure>\n{generation_chart_svg(generation)}\n<figcaption>{caption}</figcaption>\n</figure>\n"
    rows = "".join(_step_row(step, generation) for step in generation.steps)
    return (f'<h2 id="generation-section">Generation</h2>\n{_first_bad_sentence(generation, report.target)}'
            f'{chart}<table id="generation">\n<tr><th>step</th><th>kind</th><th>positions</th><th>source token</th>'
            "<th>target token</th><th>verdict</th><th>KL</th><th>logits error</th><th>worst op error</th>"
            f"<th>failing ops</th></tr>\n{rows}</table>\n")


def _first_bad_sentence(generation: GenerationReport, target: str) -> str:
    tokens, first, info = generation.tokens, generation.first_bad, generation.info
    text = (f"{_e(info.model_class or 'The model')}: a prefill of {info.prompt} positions and "
            f"{info.decode_steps} decode steps, replayed on {_e(target)} teacher-forced. ")
    if first is not None:
        why = (f"each token is in the other side's top-{tokens.top_k} (a near tie: drift)" if first.verdict == DRIFT
               else f"outside the other side's top-{tokens.top_k}: a bug")
        text += (f"<b>First bad token: step {first.step}</b> (position {first.position}): the target picks token "
                 f"{first.target} where the source picks {first.source}; {_e(why)}.")
    elif tokens.failure:
        text += "No step picks another token before the chain stopped."
    else:
        text += f"Every step picks the source's token ({len(tokens.steps)} of {len(generation.steps)})."
    if tokens.failure:
        text += f" The chain did not run to the end, so no tokens past it: {_e(tokens.failure)}"
    return f'<p id="first-bad-token">{text}</p>\n'


def _step_row(step: StepPoint, generation: GenerationReport) -> str:
    token = step.token
    first = generation.first_bad
    css = "culprit" if first is not None and first.step == step.step else (
        "fail" if token is not None and token.verdict != SAME else "")
    if token is None:
        cells = "<td>-</td><td>-</td><td>-</td><td>-</td><td>-</td>"
    else:
        cells = (f"<td class=\"num\">{token.source}</td><td class=\"num\">{token.target}</td>"
                 f"<td><span class=\"{TOKEN_CSS.get(token.verdict, 'other')}\">{_e(token.verdict)}</span></td>"
                 f"<td class=\"num\">{_number(token.kl)}</td><td class=\"num\">{_number(token.error)}</td>")
    worst = "-" if step.worst is None else _number(step.worst) + (f" (#{step.worst_op})" if step.worst_op is not None
                                                                   else "")
    return (f"<tr class=\"{css}\"><td class=\"num\">{step.step}</td><td>{_e(step.kind)}</td>"
            f"<td>{_e(step.positions)}</td>{cells}<td class=\"num\">{_e(worst)}</td>"
            f"<td class=\"num\">{step.failing}</td></tr>\n")


def _number(value: float) -> str:
    return f"{value:.2e}" if math.isfinite(value) else str(value)


def _migration(report: ErrorReport) -> str:
    """[9]'s migration curve: the model output's error as the offload boundary grows (when computed)."""
    if report.migration is None:
        return ""
    rows = "".join(f"<tr><td class=\"num\">{m.boundary}</td><td>{_e(m.label)}</td>"
                   f"<td class=\"num\">{'-' if m.error is None else f'{m.error:.3g}'}</td>"
                   f"<td>{'pass' if m.passed else '<span class=FAIL>FAIL</span>'}</td></tr>\n" for m in report.migration)
    chart = (f"<figure>{migration_chart_svg(report.migration)}<figcaption>The model output's error against the "
             "recording per step of `tapml-dbg migrate` (the offloaded part grows one block per step; red: the "
             "output is past its tolerance).</figcaption></figure>\n") if report.migration else ""
    return (f'<h2>Migration</h2>\n{chart}<table id="migration">\n<tr><th>ops on the target</th><th>step adds</th>'
            f"<th>output error</th><th>verdict</th></tr>\n{rows}</table>\n")


def _summary(report: ErrorReport) -> str:
    info = report.summary
    versions = ", ".join(f"{k} {v}" for k, v in (info.get("versions") or {}).items())
    complete = "yes" if info.get("complete") else f"NO: {info.get('recorded_ops')} of {info.get('num_ops')} ops recorded"
    size = info.get("file_bytes")
    rows = [("trace", report.trace), ("model", info.get("model")), ("source", info.get("source")),
            ("target", report.target), ("format", info.get("format")), ("versions", versions),
            ("created", info.get("created")), ("complete", complete),
            ("ops / layers", f"{info.get('num_ops')} / {info.get('num_layers')}"),
            ("inputs / params", f"{info.get('num_inputs')} / {info.get('num_params')}"),
            ("file size", human_bytes(size) if isinstance(size, int) else "?"),
            ("failing verdicts", f"{len(report.failing(ISOLATED))} isolated, {len(report.failing(PROPAGATED))} "
                                 "propagated")]
    if info.get("import_fixes"):
        rows.append(("import fixes", ", ".join(map(str, info["import_fixes"]))))
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>\n" for k, v in rows)
    notes = "".join(f"<li>{_e(note)}</li>\n" for note in report.notes)
    return (f'<h2>The trace</h2>\n<table id="summary">\n{body}</table>\n'
            + (f"<ul>\n{notes}</ul>\n" if notes else ""))


def _error_cell(point: OpPoint, mode) -> str:
    verdict = point.verdict(mode)
    error = point.error(mode)
    if verdict is None:
        return "<td>-</td><td></td>"
    value = "" if error is None else ("nan" if not math.isfinite(error) else f"{error:.2e}")
    return f"<td>{_status_html(verdict)}</td><td class=\"num\">{value}</td>"


def _ops_table(report: ErrorReport) -> str:
    noise = report.has_noise_floor
    head = ("<tr><th>#</th><th>name</th><th>source op</th><th>layer</th><th>dtype</th><th>isolated</th><th>rel</th>"
            "<th>propagated</th><th>rel</th>" + ("<th>noise floor</th>" if noise else "") + "</tr>\n")
    rows = []
    culprit = report.culprit.index if report.culprit else None
    wide = {op.index for op in report.tvm_wide}
    for point in report.points:
        failing = any(v is not None and v.failed for v in (point.isolated, point.propagated))
        css = "culprit" if point.index == culprit else ("fail" if failing else ("tvm-wide" if point.index in wide else ""))
        floor = point.noise_floor()
        rows.append(f"<tr class=\"{css}\"><td class=\"num\">{point.index}</td><td><code>{_e(point.name)}</code></td>"
                    f"<td><code>{_e(point.op)}</code></td><td>{_e(point.layer or TOP)}</td><td>{_e(point.dtype)}</td>"
                    f"{_error_cell(point, ISOLATED)}{_error_cell(point, PROPAGATED)}"
                    + (f"<td class=\"num\">{'' if floor is None else f'{floor:.2e}'}</td>" if noise else "")
                    + "</tr>\n")
    return (f"<h2>Every op</h2>\n<details{' open' if len(report.points) <= 40 else ''}>\n<summary>{len(report.points)} "
            f"ops, both verdicts</summary>\n<table id=\"ops\">\n{head}{''.join(rows)}</table>\n</details>\n")


def _footer(report: ErrorReport) -> str:
    return (f"<footer>Computed by tapml-dbg: the isolated sweep and one propagated chain ({report.units} compiled "
            f"units, {report.seconds:.1f} s). The page is self-contained: no script, no network.</footer>\n")

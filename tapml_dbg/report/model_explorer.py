"""`tapml-dbg report --model-explorer`: the report's data for Google's AI Edge Model Explorer.

Three kinds of file in `DIR/model_explorer/`, written with plain `json` (tapml-dbg does not need the
`ai-edge-model-explorer` package; the shapes are those its classes write, checked against them by
tests/test_model_explorer.py):

- `graph.json`: the trace's op graph as a `graph_builder.GraphCollection` (what Model Explorer's
  JSON adapter loads from a `.json` path): one node per op (id = the op name, which is also the FX
  node name of a torch source; label = the source op; namespace = the layer path with `/`, so layers
  fold), one per model input (top level) and per param (in its consumers' common layer), edges from
  each op's inputs, the op's verdicts as attributes and its output shapes as output metadata;
- `isolated.json`, `propagated.json`: a `node_data_builder.GraphNodeData` each, keyed by op name:
  the op's error as a multiple of the tolerance it was held to (<= 1 passes), coloured by
  `thresholds` (pass / near tolerance / fail); a failing verdict is red whatever its ratio;
- `verdict.json`: the same ops keyed with a word ("pass", "isolated FAIL", "crash", ...) and its colour,
  so failed runs show too and a folded layer counts its verdicts.

A single-graph node data file applies to whichever graph is open, so the same files overlay the
ExportedProgram graph of Model Explorer's PyTorch adapter (its node ids are the FX node names).
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from tapml_dbg.engine.report import ErrorReport, OpPoint
from tapml_dbg.judge.verdict import ISOLATED, PROPAGATED, Mode
from tapml_dbg.model.graph import OpInfo
from tapml_dbg.report.html import prepare_folder

FOLDER_NAME = "model_explorer"  # under the report's DIR
GRAPH_NAME = "graph.json"
ERROR_NAMES = {ISOLATED: "isolated.json", PROPAGATED: "propagated.json"}
VERDICT_NAME = "verdict.json"
GRAPH_ID = "main"  # the Relax function the ops are the bindings of
COMMAND = "model-explorer"  # the package's console script (model_explorer/cmdline.py)
NODE_DATA_FLAG = "--node_data_paths"  # comma-separated node data files
NEAR_TOLERANCE = 0.5  # a passing error above this share of its tolerance is "near tolerance"
RATIO_DIGITS = 3  # significant digits of a ratio (the node shows it as text)
RATIO_CAP = 1e9  # a larger or non-finite ratio is written as this: JSON has no infinity
PASS_COLOR, NEAR_COLOR, FAIL_COLOR = "#a6d96a", "#fee08b", "#f46d43"
PROPAGATED_FAIL_COLOR = "#fdae61"  # the op alone is right; the error reaching it is not
FAILED_RUN_COLOR = "#c2a5cf"  # the unit did not run to a value: compile-error, crash, timeout, error
NOT_JUDGED_COLOR = "#e0e0e0"
PASS, NEAR, FAIL = "pass", "near tolerance", "FAIL"
CULPRIT_PREFIX = "culprit: "
TOP = "<top>"  # how an op outside every layer is named (as the page does)


@dataclass
class ModelExplorerWritten:
    """What `write_model_explorer` wrote, and the command that opens it."""

    folder: Path
    graph: Path
    node_data: list[Path]
    nodes: int  # graph nodes: ops, model inputs and params
    ops: int
    keyed: dict[str, int] = field(default_factory=dict)  # node data file name -> ops it keys
    command: str = ""


def write_model_explorer(report: ErrorReport, ops: list[OpInfo], inputs: list[str], params: list[str],
                         folder: str | Path) -> ModelExplorerWritten:
    """Write `folder/model_explorer/`: the graph of `ops` (reading model `inputs` and `params`) and the
    node data of `report`'s points."""
    out = prepare_folder(Path(folder) / FOLDER_NAME, holds="the Model Explorer files")
    collection = graph_collection(report, ops, inputs, params)
    files = {GRAPH_NAME: collection}
    files.update({ERROR_NAMES[mode]: error_node_data(report, mode) for mode in (ISOLATED, PROPAGATED)})
    files[VERDICT_NAME] = verdict_node_data(report)
    for name, data in files.items():
        (out / name).write_text(json.dumps(data, indent=1), encoding="utf-8")
    node_data = [out / name for name in (*ERROR_NAMES.values(), VERDICT_NAME)]
    command = (f"{COMMAND} {shlex.quote(str(out / GRAPH_NAME))} "
               f"{NODE_DATA_FLAG}={shlex.quote(','.join(str(path) for path in node_data))}")
    return ModelExplorerWritten(out, out / GRAPH_NAME, node_data, len(collection["graphs"][0]["nodes"]), len(ops),
                                {path.name: len(files[path.name]["results"]) for path in node_data}, command)


# ------------------------------------------------------------------ the graph (graph_builder's shapes)
def graph_collection(report: ErrorReport, ops: list[OpInfo], inputs: list[str], params: list[str]) -> dict:
    """A `GraphCollection` of one `Graph`, as `remove_none(asdict(...))` writes it."""
    points = {point.index: point for point in report.points}
    op_names = {op.name for op in ops}
    consumers: dict[str, list[OpInfo]] = {}
    for op in ops:
        for name in op.inputs:
            consumers.setdefault(name, []).append(op)
    nodes = [_node(name, name, "", [("kind", "model input")]) for name in inputs
             if name in consumers and name not in op_names]
    for name in params:
        if name in consumers and name not in op_names:
            layer = _common_layer([op.layer for op in consumers[name]])
            nodes.append(_node(name, name, _namespace(layer), [("kind", "param")]))
    known = op_names | {node["id"] for node in nodes}
    for op in ops:
        node = _node(op.name, op.op, _namespace(op.layer), _op_attrs(op, points.get(op.index)))
        node["incomingEdges"] = [{"sourceNodeId": name, "sourceNodeOutputId": "0", "targetNodeInputId": str(position)}
                                 for position, name in enumerate(op.inputs) if name in known]
        node["outputsMetadata"] = [{"id": str(k), "attrs": [_kv("tensor_shape", _shape(spec))]}
                                   for k, spec in enumerate(op.outputs)]
        nodes.append(node)
    model = report.summary.get("model") or Path(report.trace).name
    graph = {"id": GRAPH_ID, "nodes": nodes, "groupNodeAttributes": {"": _graph_attrs(report)}}
    return {"label": f"{Path(str(model)).name} on {report.target}", "graphs": [graph],
            "graphSorting": "node_count_desc"}


def _node(node_id: str, label: str, namespace: str, attrs: list[tuple[str, str]]) -> dict:
    return {"id": node_id, "label": label, "namespace": namespace, "subgraphIds": [],
            "attrs": [_kv(key, value) for key, value in attrs], "incomingEdges": [], "outputsMetadata": [],
            "inputsMetadata": []}


def _shape(spec) -> str:
    """A tensor as Model Explorer's PyTorch adapter writes one: `float32[4, 32]`."""
    return f"{spec.dtype}{json.dumps(list(spec.shape))}"


def _kv(key: str, value: str) -> dict:
    return {"key": key, "value": str(value)}


def _namespace(layer: str) -> str:
    return layer.replace(".", "/") if layer else ""


def _common_layer(layers: list[str]) -> str:
    """The deepest layer holding every one of `layers` ("" when they share none)."""
    split = [layer.split(".") if layer else [] for layer in layers]
    common = []
    for parts in zip(*split):
        if any(part != parts[0] for part in parts):
            break
        common.append(parts[0])
    return ".".join(common)


def _op_attrs(op: OpInfo, point: OpPoint | None) -> list[tuple[str, str]]:
    attrs = [("index", str(op.index)), ("relax op", op.relax_op), ("layer", op.layer or TOP)]
    if op.fx_node:
        attrs.append(("fx node", op.fx_node))
    if point is not None:
        for mode in (ISOLATED, PROPAGATED):
            attrs.append((str(mode), _verdict_text(point, mode)))
        kind, evidence = point.wrong()
        if kind:
            attrs.append(("class", kind + (f" ({evidence})" if evidence else "")))
    return attrs


def _verdict_text(point: OpPoint, mode: Mode) -> str:
    verdict = point.verdict(mode)
    if verdict is None:
        return "not judged"
    error, tolerance = point.error(mode), point.tolerance(mode)
    if error is None:
        return f"{verdict.status}" + (f": {verdict.message}" if verdict.message else "")
    ratio = _ratio(error, tolerance)
    held = f" / tolerance {tolerance:.3g} = x{ratio:.3g}" if tolerance is not None else ""
    return f"{'FAIL' if verdict.failed else 'pass'}: err/absmax {error:.3g}{held}"


def _graph_attrs(report: ErrorReport) -> dict[str, str]:
    culprit = report.culprit
    found = (f"#{culprit.index} {culprit.name} ({culprit.op}, {culprit.verdict})" if culprit is not None
             else "none: every op passes")
    return {"trace": report.trace, "target": report.target, "first divergent op": found,
            "node data": "error / tolerance of the worst output: <= 1 passes; verdict: each op's verdicts"}


# ------------------------------------------------------------------ node data (node_data_builder's shapes)
def error_node_data(report: ErrorReport, mode: Mode) -> dict:
    """A `GraphNodeData`: each judged op's error / tolerance in `mode`, coloured by `thresholds`."""
    results = {}
    for point in report.points:
        verdict, error = point.verdict(mode), point.error(mode)
        if verdict is None or error is None:
            continue  # not judged, or its unit did not run (verdict.json shows those)
        ratio = _ratio(error, point.tolerance(mode))
        result: dict = {"value": ratio}
        band = FAIL if verdict.failed else (NEAR if _band(ratio) == FAIL else _band(ratio))
        if band != _band(ratio):  # the verdict's rule is not the ratio's (NaN, dtype, atol): the verdict wins
            result["bgColor"] = {PASS: PASS_COLOR, NEAR: NEAR_COLOR, FAIL: FAIL_COLOR}[band]
        results[point.name] = result
    thresholds = [{"value": NEAR_TOLERANCE, "bgColor": PASS_COLOR}, {"value": 1.0, "bgColor": NEAR_COLOR},
                  {"value": RATIO_CAP, "bgColor": FAIL_COLOR}]
    return _graph_node_data(results, f"{mode} error / tolerance", thresholds)


def verdict_node_data(report: ErrorReport) -> dict:
    """A `GraphNodeData` with a word per op: its verdicts in one, coloured explicitly."""
    culprit = report.culprit.index if report.culprit is not None else None
    results = {}
    for point in report.points:
        word, color = _verdict_word(point)
        results[point.name] = {"value": (CULPRIT_PREFIX + word) if point.index == culprit else word, "bgColor": color}
    data = _graph_node_data(results, "verdict", [])
    data["showExpandedSummaryOnGroupNode"] = True  # a folded layer lists its verdicts and their counts
    data["showLabelCountColumnsInChildrenStatsTable"] = True
    return data


def _verdict_word(point: OpPoint) -> tuple[str, str]:
    iso, prop = point.isolated, point.propagated
    for mode, verdict in ((ISOLATED, iso), (PROPAGATED, prop)):
        if point.failed_run(mode):
            return f"{mode} {verdict.status}", FAILED_RUN_COLOR
    if iso is not None and iso.failed:
        return f"{ISOLATED} {FAIL}", FAIL_COLOR
    if prop is not None and prop.failed:
        return f"{PROPAGATED} {FAIL}", PROPAGATED_FAIL_COLOR
    ratios = [_ratio(point.error(mode), point.tolerance(mode)) for mode in (ISOLATED, PROPAGATED)
              if point.error(mode) is not None]
    if not ratios:
        return "not judged", NOT_JUDGED_COLOR
    return (NEAR, NEAR_COLOR) if max(ratios) > NEAR_TOLERANCE else (PASS, PASS_COLOR)


def _graph_node_data(results: dict, name: str, thresholds: list[dict]) -> dict:
    return {"results": results, "name": name, "thresholds": thresholds, "gradient": [],
            "hideInAggregatedStatsTable": False, "hideInChildrenStatsTable": False,
            "showExpandedSummaryOnGroupNode": False, "showLabelCountColumnsInChildrenStatsTable": False}


def _ratio(error: float, tolerance: float | None) -> float:
    """error / tolerance to `RATIO_DIGITS` digits, capped (an error held to no tolerance: 0 or the cap)."""
    if not math.isfinite(error):
        return RATIO_CAP
    if tolerance is None or tolerance <= 0:
        return 0.0 if error == 0 else RATIO_CAP
    return min(float(f"{error / tolerance:.{RATIO_DIGITS}g}"), RATIO_CAP)


def _band(ratio: float) -> str:
    return PASS if ratio <= NEAR_TOLERANCE else NEAR if ratio <= 1.0 else FAIL

"""`tapml-dbg report --model-explorer`: the files load back into Model Explorer's own classes.

tapml-dbg writes them with plain `json`; here `ai-edge-model-explorer` (the `test` extra) reads them:
the graph through `dacite.from_dict` into `graph_builder.GraphCollection` (Model Explorer's own
from-dict path, model_explorer/ndp_runner.py) and, when node is installed, through the web app's
JSON adapter check and its web worker's graph processing (tests/model_explorer_worker.js); the node
data into `node_data_builder.GraphNodeData`. Each must write back to the very same JSON.
"""

from __future__ import annotations

import contextlib
import io
import json
import runpy
import shutil
import subprocess
from dataclasses import asdict
from pathlib import Path

import pytest

from conftest import EXAMPLES, PLANTED_OP, fresh
from tapml_dbg.frontend.importer import export_program
from tapml_dbg.judge.verdict import Status
from tapml_dbg.api import Replay
from tapml_dbg.ui import cli
from tapml_dbg.report import model_explorer as me

model_explorer = pytest.importorskip("model_explorer")
dacite = pytest.importorskip("dacite")  # a dependency of ai-edge-model-explorer
from model_explorer.graph_builder import GraphCollection  # noqa: E402
from model_explorer.node_data_builder import GraphNodeData  # noqa: E402
from model_explorer.utils import remove_none  # noqa: E402

WORKER_SCRIPT = Path(__file__).with_name("model_explorer_worker.js")
WEB_APP = Path(model_explorer.__file__).parent / "web_app"
MIN_COVERAGE = 0.9  # share of the ops the node data keys (issue [18])
NODE_TIMEOUT_S = 120


def report_with_explorer(session, folder: Path) -> tuple[Path, str]:
    """`tapml-dbg report TRACE -o folder --model-explorer` on `session`: the files' folder and stdout."""
    path = fresh(session).reader.path
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out):
        patch.setattr(cli, "_open", lambda args, **_: contextlib.nullcontext(Replay(session)))
        assert cli.main(["report", str(path), "-o", str(folder), "--model-explorer"]) == 0
    return folder / me.FOLDER_NAME, out.getvalue()


@pytest.fixture(scope="module")
def planted(planted_mlp, tmp_path_factory) -> tuple[Path, str]:
    """The files of examples/mlp.py with gelu_1 scaled by 1.01 on the target, and what the CLI printed."""
    return report_with_explorer(planted_mlp, tmp_path_factory.mktemp("planted") / "report")


def load_graph(path: Path) -> GraphCollection:
    data = json.loads(path.read_text())
    collection = dacite.from_dict(data_class=GraphCollection, data=data)
    assert remove_none(asdict(collection)) == data  # the very shape the class writes
    return collection


def load_node_data(path: Path, numeric: bool = True) -> GraphNodeData:
    """One graph's node data; the verdict file's values are words, which the class types as numbers but
    Model Explorer shows (its `showExpandedSummaryOnGroupNode` is for "non-numerical (e.g. string)" values)."""
    data = json.loads(path.read_text())
    node_data = dacite.from_dict(data_class=GraphNodeData, data=data, config=dacite.Config(check_types=numeric))
    assert json.loads(node_data.to_json_string()) == data
    # the web app's test for a one-graph file (applied to whichever graph is open): results, not graph ids
    assert "results" not in data["results"]
    return node_data


def colour(node_data: GraphNodeData, key: str) -> str:
    """The background Model Explorer gives node `key`: its own colour, else the first threshold at or
    above its value (the web app's getBgColor)."""
    result = node_data.results[key]
    if result.bgColor:
        return result.bgColor
    return next((t.bgColor for t in node_data.thresholds if result.value <= t.value), "transparent")


def check_files(folder: Path, out: str, ops: int) -> tuple[GraphCollection, dict[str, GraphNodeData]]:
    graph = folder / me.GRAPH_NAME
    errors = [folder / name for name in me.ERROR_NAMES.values()]
    verdict = folder / me.VERDICT_NAME
    command = f"model-explorer {graph} --node_data_paths={','.join(map(str, [*errors, verdict]))}"
    assert f"  open: {command}" in out, out
    collection = load_graph(graph)
    data = {path.name: load_node_data(path) for path in errors}
    data[verdict.name] = load_node_data(verdict, numeric=False)
    nodes = {node.id for node in collection.graphs[0].nodes}
    for name, node_data in data.items():
        assert set(node_data.results) <= nodes, name  # keyed by the graph's node ids
        assert len(node_data.results) >= MIN_COVERAGE * ops, (name, len(node_data.results), ops)
        assert f"{name}: {len(node_data.results)} of {ops} ops" in out
    return collection, data


def test_a_planted_fault_is_red_in_model_explorer(planted, planted_mlp):
    """gelu_1 fails isolated, the ops its error flows into fail propagated, the rest pass."""
    folder, out = planted
    ops = planted_mlp.ops
    collection, data = check_files(folder, out, len(ops))
    graph = collection.graphs[0]
    by_id = {node.id: node for node in graph.nodes}
    planted = by_id[PLANTED_OP]
    op = planted_mlp.by_name[PLANTED_OP]
    assert planted.label == op.op == "aten.gelu.default" and planted.namespace == "blocks/1"
    assert [edge.sourceNodeId for edge in planted.incomingEdges] == op.inputs
    assert planted.outputsMetadata[0].attrs[0].value == f"float32{json.dumps(list(op.outputs[0].shape))}"
    assert by_id["x"].namespace == "" and by_id["p_blocks_1_fc_weight"].namespace == "blocks/1/fc"
    assert "#13 gelu_1" in graph.groupNodeAttributes[""]["first divergent op"]

    isolated, propagated = data[me.ERROR_NAMES["isolated"]], data[me.ERROR_NAMES["propagated"]]
    assert isolated.results[PLANTED_OP].value > 1 and colour(isolated, PLANTED_OP) == me.FAIL_COLOR
    assert [t.bgColor for t in isolated.thresholds] == [me.PASS_COLOR, me.NEAR_COLOR, me.FAIL_COLOR]
    failing = [name for name in isolated.results if colour(isolated, name) == me.FAIL_COLOR]
    assert failing == [PLANTED_OP]  # only the kernel that is wrong, in the isolated view
    downstream = {PLANTED_OP}  # every op its error flows into
    for later in ops[op.index + 1:]:
        if downstream & set(later.inputs):
            downstream.add(later.name)
    red = {name for name in propagated.results if colour(propagated, name) == me.FAIL_COLOR}
    assert red == downstream & set(propagated.results) and len(red) > 5
    upstream = [o.name for o in ops if o.index < op.index]
    verdicts = data[me.VERDICT_NAME].results
    assert verdicts[PLANTED_OP].value == "culprit: isolated FAIL" and verdicts[PLANTED_OP].bgColor == me.FAIL_COLOR
    assert verdicts[upstream[0]].value in (me.PASS, me.NEAR)


def test_the_readme_example_in_model_explorer(demo_session, tmp_path):
    """examples/fp16_memory_attention.py: TVM's real divergence at op 9 `_softmax` is red, by op name,
    the node id Model Explorer's PyTorch adapter gives the same FX node."""
    folder, out = report_with_explorer(demo_session, tmp_path / "report")
    _, data = check_files(folder, out, len(demo_session.ops))
    isolated = data[me.ERROR_NAMES["isolated"]]
    assert colour(isolated, "_softmax") == me.FAIL_COLOR
    assert demo_session.by_name["_softmax"].fx_node == "_softmax"


@pytest.mark.skipif(shutil.which("node") is None, reason="no node to run Model Explorer's web app code")
def test_the_graph_loads_in_model_explorers_own_web_app_code(planted, planted_mlp):
    """Model Explorer's JSON adapter takes the file, and its worker folds every layer, nested."""
    folder, _ = planted
    bundles = [sorted(WEB_APP.glob(f"{kind}-*.js")) for kind in ("main", "worker")]
    if not all(len(found) == 1 for found in bundles):
        pytest.skip(f"Model Explorer's web app is not laid out as {WEB_APP}/main-*.js, worker-*.js")
    ran = subprocess.run(["node", str(WORKER_SCRIPT), str(bundles[0][0]), str(bundles[1][0]),
                          str(folder / me.GRAPH_NAME)], capture_output=True, text=True, timeout=NODE_TIMEOUT_S)
    if ran.returncode == 2:
        pytest.skip(f"this Model Explorer's web app is not the one the script knows: {ran.stdout.strip()}")
    assert ran.returncode == 0, (ran.stdout[-2000:], ran.stderr[-2000:])
    built = json.loads(ran.stdout)
    ops = planted_mlp.ops
    assert set(op.name for op in ops) <= set(built["opNodes"])
    layers = {".".join(op.layer.split(".")[:depth]).replace(".", "/") for op in ops if op.layer
              for depth in range(1, len(op.layer.split(".")) + 1)}
    assert set(built["layers"]) == layers  # every layer folds, nested
    assert "blocks___group___" in built["rootNodes"] and built["edges"] > len(ops)


def test_the_node_data_overlays_the_exported_program_in_model_explorer(planted, planted_mlp):
    """Model Explorer's PyTorch adapter names a node by its FX node: every FX node of the program the
    trace recorded (torch.export + core-ATen decomposition, as the recorder exports it) gets its op's data."""
    from model_explorer.config import DEFAULT_SETTINGS
    from model_explorer.pytorch_exported_program_adapter_impl import PytorchExportedProgramAdapterImpl

    folder, _ = planted
    model, inputs = runpy.run_path(str(EXAMPLES / "mlp.py"))["build"]()
    graphs = PytorchExportedProgramAdapterImpl(export_program(model.eval(), inputs), DEFAULT_SETTINGS).convert()
    nodes = {node.id for node in graphs["graphs"][0].nodes}
    isolated = load_node_data(folder / me.ERROR_NAMES["isolated"])
    fx_nodes = {op.fx_node for op in planted_mlp.ops if op.fx_node}
    assert fx_nodes <= set(isolated.results) & nodes
    assert colour(isolated, PLANTED_OP) == me.FAIL_COLOR and PLANTED_OP in nodes


def test_the_verdict_has_the_last_word_on_colour():
    """Hand-built (tests/test_report.py): op 3 fails isolated, op 4 crashes. A crash has no error: only
    the verdict file shows it; a failing verdict within its tolerance (a NaN, a dtype) is still red."""
    from test_report import hand_built

    report = hand_built()
    crashed, failing, exact = report.points[4], report.points[3], report.points[0]
    isolated = dacite.from_dict(data_class=GraphNodeData, data=me.error_node_data(report, "isolated"))
    assert crashed.name not in isolated.results and colour(isolated, failing.name) == me.FAIL_COLOR
    assert isolated.results[exact.name].value == 0 and colour(isolated, exact.name) == me.PASS_COLOR
    verdicts = me.verdict_node_data(report)["results"]
    assert verdicts[crashed.name] == {"value": "isolated crash", "bgColor": me.FAILED_RUN_COLOR}
    assert verdicts[failing.name]["value"] == "culprit: isolated FAIL"

    exact.isolated.status = Status.FAIL  # as a NaN mismatch fails at no error
    isolated = dacite.from_dict(data_class=GraphNodeData, data=me.error_node_data(report, "isolated"))
    assert isolated.results[exact.name].value == 0 and colour(isolated, exact.name) == me.FAIL_COLOR

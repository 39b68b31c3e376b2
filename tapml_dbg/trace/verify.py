"""`tapml-dbg info --verify`: read every part of a trace and report each damaged one.

It reads the file the way replay does, through the reader's checks (structure, schema,
checksums), but goes on past a damaged part, so the report lists every part that a replay
would trip over, not only the first. A v1.0/v1.1 trace has no checksums: its tensors are
checked for structure only, and the report says so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from tapml_dbg.errors import TraceError
from tapml_dbg.trace import schema as S
from tapml_dbg.trace.reader import TraceReader
from tapml_dbg.trace.source_graph import parse_source_graph

OPEN_PART = "the file"


@dataclass
class Damage:
    """One damaged part: what it is (`op 12's recorded output 0`) and the reader's error line."""

    part: str
    message: str


@dataclass
class VerifyReport:
    path: str
    format: str | None  # "v1.3"; None when the file could not be opened
    checksummed: bool  # the format carries checksums (v1.2+): tensors were verified bit for bit
    parts: int = 0  # parts read: header, op table, graph, texts, each tensor with its stats
    datasets: int = 0  # tensors and texts read whole (and checksum-verified when `checksummed`)
    damaged: list[Damage] = field(default_factory=list)
    weight_files: list[str] = field(default_factory=list)  # v1.4: checkpoint files whose tensors were checked

    @property
    def ok(self) -> bool:
        return not self.damaged

    def to_json(self) -> dict:
        return {**asdict(self), "ok": self.ok}


def verify_trace(path) -> VerifyReport:
    """Read every part of the trace at `path`; never raises a TraceError (it is reported)."""
    try:
        reader = TraceReader(path)
    except TraceError as exc:
        return VerifyReport(str(path), None, False, parts=1, damaged=[Damage(OPEN_PART, str(exc))])
    with reader:
        report = VerifyReport(str(path), f"v{reader.version[0]}.{reader.version[1]}", reader.checksummed, parts=1)
        _Checker(reader, report).run()
    return report


class _Checker:
    def __init__(self, reader: TraceReader, report: VerifyReport):
        self.reader = reader
        self.report = report
        self._messages: set[str] = set()

    def check(self, part: str, read) -> bool:
        """Run one read, which returns how many datasets it read whole; a TraceError becomes a
        Damage (once per message: a broken op table is reported once, not by every part needing it)."""
        self.report.parts += 1
        try:
            self.report.datasets += read() or 0
        except TraceError as exc:
            if str(exc) not in self._messages:
                self._messages.add(str(exc))
                self.report.damaged.append(Damage(part, str(exc)))
            return False
        return True

    def listed(self, part: str, names) -> list[str]:
        found: list[str] = []
        self.check(part, lambda: found.extend(names()))
        return found

    def damage(self, part: str, message: str) -> None:
        self.report.parts += 1
        self.report.damaged.append(Damage(part, message))

    def run(self) -> None:
        reader = self.reader
        outline, tensors = reader.outline, reader.tensors
        tables = self.check("the op table", lambda: _one(outline.ops))
        self.check("the graph", lambda: _one(outline.graph()))
        for name in self.listed(f"/{S.GROUP_GRAPH}", outline.text_names):
            path = f"{S.GROUP_GRAPH}/{name}"
            if path == S.DS_SOURCE_GRAPH:
                self.check(f"/{path}", lambda: _one(parse_source_graph(outline.source_graph_json, reader.path)))
            elif path not in (S.DS_IR_JSON, S.DS_OP_TABLE):  # both read above
                self.check(f"/{path}", lambda name=name: _one(outline.text(name)))
        for name in self.listed(f"/{S.GROUP_INPUTS}", lambda: outline.input_names):
            self.check(f"input {name!r}", lambda name=name: _one(tensors.input(name), tensors.input_stats(name)))
        weights = reader.weights.refs if self.check(f"/{S.DS_WEIGHT_REFS}", lambda: _one(reader.weights.refs)) else None
        for name in self.listed(f"/{S.GROUP_PARAMS}", lambda: outline.param_names):
            if weights is None or name not in weights.params:
                self.check(f"param {name!r}", lambda name=name: _one(tensors.param(name), tensors.param_stats(name)))
        if weights is not None:
            self.weight_files(weights)
        if tables:
            self.ops()

    def weight_files(self, weights) -> None:
        """Each referenced checkpoint file (v1.4): there, of its recorded size, every referenced tensor's
        SHA-256 as recorded; one line per file that is not, naming the file and a tensor that changed."""
        for status in weights.status():
            self.report.weight_files.append(status.found or status.path)
            if not status.ok:
                self.damage(f"checkpoint {status.path}", status.problem())
                continue
            names = [name for name, ref in weights.params.items() if weights.files[ref.file].path == status.path]
            for name in names:
                if not self.check(f"checkpoint {status.path}", lambda name=name: _one(weights.verify(name))):
                    break  # one line per file: the first tensor that changed

    def ops(self) -> None:
        reader = self.reader
        recorded = reader.recorded
        names = self.listed(f"/{S.GROUP_OPS}", recorded.op_group_names)
        for name in sorted(set(names) - {str(i) for i in range(len(reader.outline.ops))})[:MAX_LISTED]:
            self.damage(f"/{S.GROUP_OPS}", f"{reader.path}: /{S.GROUP_OPS}/{name[:40]} is not an op of the op "
                                           "table; the trace was edited")
        stored = _stored_ops(reader.meta.get(S.META_CAPTURE))
        for index in range(len(reader.outline.ops)):
            if recorded.has_op(index):
                self.check(f"op {index}", lambda index=index: _op_values(reader, index))
            elif recorded.stats_only(index):
                self.check(f"op {index}",
                           lambda index=index: _one(reader.tensors.op_stats(index), recorded.op_note(index)) - 1)
                if index in stored:
                    self.damage(f"op {index}", f"{reader.path}: op {index} is in the capture window's stored ops "
                                               "but has only stats; the trace is damaged")
            elif reader.complete:
                self.damage(f"op {index}", f"{reader.path}: op {index} has no values and no stats although the "
                                           "trace is marked complete (its group or its done marker is damaged)")


MAX_LISTED = 10  # unexpected names under /ops reported one by one; an edit rarely adds more


def _one(*_values) -> int:
    """What a read of one dataset counts (the values themselves are dropped)."""
    return 1


def _op_values(reader: TraceReader, index: int) -> int:
    outputs = reader.tensors.op_outputs(index)
    reader.tensors.op_stats(index)
    reader.recorded.op_note(index)
    return len(outputs)


def _stored_ops(capture: dict | None) -> set[int]:
    if capture is None:
        return set()
    return {i for first, last in capture["stored"] for i in range(first, last + 1)}

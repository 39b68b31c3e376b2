"""`dump`: one op as a standalone repro directory that needs only tvm and numpy."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tapml_dbg import portable as lib
from tapml_dbg.repro import files
from tapml_dbg.repro.templates import REPRO_PY
from tapml_dbg.repro.unit import op_module

MODULE_FILE = "module.py"


@dataclass
class DumpResult:
    """A written repro: which op, where, how big, and what the session saw on its target."""

    index: int
    name: str
    op: str
    layer: str
    path: str
    bytes: int
    target: str
    status: str  # the isolated verdict seen when dumping: pass, fail, compile-error, ...
    summary: str = ""
    files: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def reproduces(self) -> bool:
        return self.status not in ("pass", "missing")


def dump_op(session, op_text, output, command: str | None = None) -> DumpResult:
    """Write op `op_text` (index or name) of the session's trace as a repro in folder `output`."""
    started = time.perf_counter()
    op = session.resolve(op_text)
    unit = op_module(session, op)  # raises before anything is written when the op cannot be dumped
    verdict = session.isolated(op.index)
    folder = files.prepare_dir(output)
    (folder / MODULE_FILE).write_text(unit.script.rstrip("\n") + "\n", encoding="utf-8")
    writer = files.DataWriter()
    writer.add(unit.refs)
    meta = files.write_payload(folder, session, writer, "dump", command)
    (folder / "repro.py").write_text(REPRO_PY.format(index=op.index, name=op.name, source_op=op.op,
                                                     model=session.reader.meta.get("model", "the model")),
                                     encoding="utf-8")
    seen = {"target": session.target, "rpc": session.spec.rpc, "tracker": session.spec.tracker, "mode": "isolated",
            "status": verdict.status, "message": verdict.message,
            "class": verdict.wrong, "evidence": verdict.evidence,  # what kind of wrong (judge/classify.py)
            "metrics": [m.to_json() for m in verdict.metrics]}
    meta.update(seen=seen, ops=[unit.meta(MODULE_FILE)])
    files.write_meta(folder, meta)
    total = files.write_readme_sized(folder, lambda size: _readme(meta, unit, writer.nbytes, size))
    return DumpResult(index=op.index, name=op.name, op=op.op, layer=op.layer, path=str(folder), bytes=total,
                      target=session.target, status=verdict.status, summary=verdict.summary,
                      files=sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()),
                      seconds=time.perf_counter() - started)


def _readme(meta: dict, unit, data_bytes: int, total_bytes: int) -> str:
    op = meta["ops"][0]
    seen = meta["seen"]
    rec, now = meta["recorded_versions"], meta["dumped_versions"]
    transform = meta["transform"]
    env_prefix = ""
    if transform and transform["env"]:
        env_prefix = " ".join(f"{name}={value}" for name, value in transform["env"].items() if value is not None)
        env_prefix = env_prefix + " " if env_prefix else ""
    where = meta["target"] + (f" over RPC {seen['rpc']}" if seen.get("rpc") else "") + \
        (f" from tracker {seen['tracker']}" if seen.get("tracker") else "")
    rows = [
        ("model", f"`{meta['model']}` (recorded on {meta['source']})"),
        ("op", f"#{op['index']} `{op['name']}` (Relax `{op['relax_op']}`)"),
        ("layer", f"`{op['layer']}`" if op["layer"] else "(top level)"),
        ("source op", f"`{op['op']}`" + (f" (FX node `{op['fx_node']}`)" if op.get("fx_node") else "")),
        ("recorded with", ", ".join(f"{k} {v}" for k, v in rec.items())),
        ("dumped with", ", ".join(f"{k} {v}" for k, v in now.items())),
        ("target", f"`{meta['target']}`"),
        ("transform", f"`{transform['file']}:{transform['func']}` (copied as-is from `{transform['original']}`)"
         if transform else "none"),
        ("tolerance", "; ".join(f"out {k} {o['dtype']}: rtol={o['rtol']:g} atol={o['atol']:g}"
                                + ("" if o.get("judged", True) else " (not judged: nothing in the model reads it)")
                                for k, o in enumerate(op["outputs"]))),
        ("size", f"{files.human_bytes(total_bytes)} in all; data {files.human_bytes(data_bytes)} "
                 f"({_count(len(op['inputs']), 'input')}, {_count(len(op['outputs']), 'output')})"),
    ]
    lines = [f"# Repro: op #{op['index']} `{op['name']}` of `{meta['model']}`", "",
             "Written by `tapml-dbg dump`. It needs only `tvm` and `numpy` (no torch, no tapml-dbg) and "
             "runs from any working directory.", "", "| | |", "|---|---|"]
    lines += [f"| {key} | {value} |" for key, value in rows]
    lines += ["", "## What was seen", "",
              f"On {where}, the op alone fed the recorded source inputs (isolated verdict): "
              f"**{seen['status']}**" + (f": {seen['message']}" if seen.get("message") else "") + ".", ""]
    if seen.get("class"):
        lines += [f"Class: **{seen['class']}**: {seen['evidence']}", ""]
    if seen["metrics"]:
        lines += ["| out | max_abs_err | scale_rel_err | max_rel_err | cosine | NaN / Inf mismatches | "
                  "mismatched | passed |", "|---|---|---|---|---|---|---|---|"]
        for k, m in enumerate(seen["metrics"]):
            if m.get("shape_mismatch") or m.get("dtype_mismatch"):
                lines.append(f"| {k} | {m.get('shape_mismatch') or m.get('dtype_mismatch')} | | | | | | no |")
                continue
            lines.append(f"| {k} | {_g(m['max_abs_err'])} | {_g(m['scale_rel_err'])} | {_g(m['max_rel_err'])} | "
                         f"{_g(m['cosine'], 6)} | {m['nan_mismatch']} / {m['inf_mismatch']} | "
                         f"{m['mismatched']}/{m['numel']} | {'yes' if m['passed'] else 'no'} |")
        lines.append("")
    remote = f" --rpc {seen['rpc']}" if seen.get("rpc") else ""
    lines += ["## Run it", "", "```sh",
              f"{env_prefix}python repro.py{remote}                      # on {meta['target']}, the dump's target",
              f"{env_prefix}python repro.py --target cuda        # another TVM target",
              f"{env_prefix}python repro.py --rpc HOST:PORT --target opencl   # a remote device", "```", "",
              "Exit status 1: the divergence reproduces (or the op fails to compile or run on the target); "
              "0: it does not; 2: the repro itself cannot run (bad arguments, missing file, no device).", ""]
    if transform:
        lines += ["The transform file is copied as-is and applied to the op's module just before "
                  "`tvm.compile`, as `tapml-dbg --transform` did. Only that file is copied: modules it "
                  "imports must be importable."]
        if transform["env"]:
            lines += ["", "It reads environment variables; set them as when the dump was made:", ""]
            lines += [f"- `{name}`: " + (f"`{value}` at dump time" if value is not None else "unset at dump time")
                      for name, value in transform["env"].items()]
        lines.append("")
    lines += ["## Comparison rule", "", f"Per output: {lib.COMPARE_RULE}. The tolerances are the recorded "
              "session's policy for the output's dtype (`meta.json`).", "",
              "## Files", "",
              f"- `repro.py`: the entry point (argument parsing; the work is in `{lib.LIB_PACKAGE}/`)",
              f"- `{lib.LIB_PACKAGE}/`: load, compile, run and compare (a verbatim copy of tapml-dbg's "
              "`tapml_dbg/portable`, the runtime tapml-dbg itself runs units with)",
              f"- `{op['module']}`: the op's Relax module as TVMScript"
              + (f"; its {op['lifted_constants']} tensor constant(s) are lifted to trailing parameters "
                 "whose values are in `data.npz`" if op["lifted_constants"] else ""),
              "- `data.npz`: the op's recorded inputs and outputs, nothing else of the model (no pickle; "
              "bfloat16/float8 arrays are raw bits, their dtype is in `meta.json`)",
              "- `meta.json`: op, tolerances, array keys and dtypes, target, versions, the verdict seen"]
    if transform:
        lines.append(f"- `{transform['file']}`: the copied transform")
    lines += ["", "## Made by", "", "```sh", meta["command"] or "tapml_dbg.repro.dump_op(...) (Python API)",
              "```", ""]
    return "\n".join(lines)


def _g(value, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}g}"


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"

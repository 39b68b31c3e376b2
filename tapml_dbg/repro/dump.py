"""`dump`: one op, or a unit of ops compiled as one function, as a standalone repro that needs only tvm and numpy.

`dump --op OP` of an op that passes alone but fails compiled with its producers (a fused culprit)
writes that unit (`engine.fused.find_unit`); `dump --ops A:B` writes the range asked for.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from tapml_dbg import portable as lib
from tapml_dbg.engine import fused
from tapml_dbg.errors import UsageError
from tapml_dbg.judge.diagnosis import diagnosis
from tapml_dbg.judge.verdict import FUSED, ISOLATED
from tapml_dbg.repro import files
from tapml_dbg.repro.minimize import Minimized, minimize as minimize_unit
from tapml_dbg.repro.templates import REPRO_PY
from tapml_dbg.repro.unit import OpModule, op_module, to_script, unit_module

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
    unit: list[int] = field(default_factory=list)  # a multi-op repro's ops, in order (empty: one op)
    minimized: Minimized | None = None  # what `--minimize` found (None: not asked)

    @property
    def reproduces(self) -> bool:
        return self.status not in ("pass", "missing")


def _refuse_host_only(session, chosen) -> None:
    """An op TVM cannot import has no TVM unit to write (docs/host-only-ops.md): one line, nothing written."""
    for entry in session.host_only:
        if any(op.index == entry.index for op in chosen):
            raise UsageError(f"op #{entry.index} {entry.name} runs on the host only ({entry.reason}): there is no "
                             "TVM unit of it to reproduce; dump the ops around it")


def dump_op(session, op_text, output, command: str | None = None, ops: str | None = None,
            minimize: bool = False, progress=None) -> DumpResult:
    """Write op `op_text` (index or name) of the session's trace as a repro in folder `output`; or, with
    `ops` (a selector such as `41:43`), those ops compiled as one unit. An op that passes alone but
    fails compiled with its producers is written as its fused unit. `minimize`: at the smallest input
    shapes that still fail (repro/minimize.py), compared at the unit's last op."""
    started = time.perf_counter()
    if ops is not None:
        chosen = [session.ops[i] for i in session.resolve_ops(ops)]
        if not chosen:
            raise UsageError(f"--ops {ops} selects no op; give a range such as 3:5 (`tapml-dbg info TRACE`)")
        _refuse_host_only(session, chosen)
        last = chosen[-1]
        verdict = fused.unit_verdict(session, [o.index for o in chosen], last.index) if len(chosen) > 1 \
            else session.isolated(last.index)
    else:
        last = session.resolve(op_text)
        _refuse_host_only(session, [last])
        verdict = session.isolated(last.index)
        found = fused.find_unit(session, last.index) if not verdict.failed else None
        chosen = [session.ops[i] for i in found.ops] if found else [last]
        verdict = found.verdict if found else verdict
    # raises before anything is written when the unit cannot be dumped
    unit = unit_module(session, chosen, [last] if (ops is None or minimize) and len(chosen) > 1 else None) \
        if len(chosen) > 1 else op_module(session, last)
    shrunk = None
    if minimize:
        shrunk = minimize_unit(session, chosen, unit.func, [ref.array for ref in unit.inputs],
                               [ref.array for ref in unit.outputs], unit.tolerances,
                               [param.name for param in unit.func.params], progress)
        if shrunk.best is not None:
            unit = at_shapes(unit, shrunk, [o.name for o in chosen])
    op = last
    folder = files.prepare_dir(output)
    (folder / MODULE_FILE).write_text(unit.script.rstrip("\n") + "\n", encoding="utf-8")
    writer = files.DataWriter()
    writer.add(unit.refs)
    meta = files.write_payload(folder, session, writer, "dump", command)
    (folder / "repro.py").write_text(REPRO_PY.format(index=op.index, name=op.name, source_op=op.op,
                                                     model=session.reader.meta.get("model", "the model")),
                                     encoding="utf-8")
    mode = ISOLATED if len(chosen) == 1 else FUSED
    seen = {"target": session.target, "rpc": session.spec.rpc, "tracker": session.spec.tracker, "mode": mode,
            "status": verdict.status, "message": verdict.message,
            "class": verdict.wrong, "evidence": verdict.evidence,  # what kind of wrong (judge/classify.py)
            "diagnosis": diagnosis(mode if verdict.status.judged else verdict.status, verdict.wrong)
            if verdict.failed else "",  # what that says of the bug, as bisect and compare word it
            "metrics": [m.to_json() for m in verdict.metrics]}
    if shrunk is not None and shrunk.best is not None:  # what the minimized unit gave, judged as repro.py will
        seen.update(status="fail" if shrunk.best.failed else "pass", message="", metrics=shrunk.best.metrics)
    meta.update(seen=seen, ops=[unit.meta(MODULE_FILE)])
    if shrunk is not None:
        meta["minimized"] = shrunk.to_json()
    files.write_meta(folder, meta)
    total = files.write_readme_sized(folder, lambda size: _readme(meta, unit, writer.nbytes, size))
    return DumpResult(index=op.index, name=op.name, op=op.op, layer=op.layer, path=str(folder), bytes=total,
                      target=session.target, status=verdict.status, summary=verdict.summary,
                      files=sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()),
                      seconds=time.perf_counter() - started, unit=[o.index for o in unit.unit], minimized=shrunk)


def at_shapes(unit: OpModule, shrunk: Minimized, names: list[str]) -> OpModule:
    """The unit as `shrunk` found it smallest: its rebuilt module, sliced inputs, expected outputs (the
    host's float64 reference rounded to each output's dtype)."""
    best = shrunk.best
    script = to_script(best.func, names if len(names) > 1 else names[0])
    inputs = [replace(ref, array=array) for ref, array in zip(unit.inputs, best.inputs)]
    outputs = [replace(ref, key=f"expected/{ref.name}/{max(ref.field, 0)}", array=array)
               for ref, array in zip(unit.outputs, best.expected)]
    # the expected values are the float64 reference at the smaller shapes: the fixed rule judges them
    return replace(unit, script=script, inputs=inputs, outputs=outputs, func=best.func, noise=[])


def _readme(meta: dict, unit, data_bytes: int, total_bytes: int) -> str:
    op = meta["ops"][0]
    seen = meta["seen"]
    transform = meta["transform"]
    env_prefix = ""
    if transform and transform["env"]:
        env_prefix = " ".join(f"{name}={value}" for name, value in transform["env"].items() if value is not None)
        env_prefix = env_prefix + " " if env_prefix else ""
    where = meta["target"] + (f" over RPC {seen['rpc']}" if seen.get("rpc") else "") + \
        (f" from tracker {seen['tracker']}" if seen.get("tracker") else "")
    title = lib.describe(op) if op.get("unit") else f"op #{op['index']} `{op['name']}`"
    lines = [f"# Repro: {title} of `{meta['model']}`", "",
             "Written by `tapml-dbg dump`. It needs only `tvm` and `numpy` (no torch, no tapml-dbg) and "
             "runs from any working directory.", ""]
    lines += _bug_report(meta, unit, where, env_prefix)
    lines += ["## Context", "", "| | |", "|---|---|"]
    lines += [f"| {key} | {value} |" for key, value in _context_rows(meta, data_bytes, total_bytes)]
    lines += _seen_section(meta, where)
    lines += _run_section(meta, env_prefix)
    lines += _files_section(meta)
    lines += ["", "## Made by", "", "```sh", meta["command"] or "tapml_dbg.repro.dump_op(...) (Python API)",
              "```", ""]
    return "\n".join(lines)


def _context_rows(meta: dict, data_bytes: int, total_bytes: int) -> list[tuple[str, str]]:
    """The README's context table: the model, the op, the versions, the target, the tolerances, the size."""
    op = meta["ops"][0]
    rec, now = meta["recorded_versions"], meta["dumped_versions"]
    transform = meta["transform"]
    return [
        ("model", f"`{meta['model']}` (recorded on {meta['source']})"),
        ("op", f"#{op['index']} `{op['name']}` (Relax `{op['relax_op']}`)"),
        *([("unit", f"{len(op['unit'])} ops compiled as one function: "
                    + ", ".join(f"#{u['index']} `{u['name']}` (`{u['relax_op']}`)" for u in op["unit"]))]
          if op.get("unit") else []),
        ("layer", f"`{op['layer']}`" if op["layer"] else "(top level)"),
        *([("model line", files.markdown_location(op["source_location"]))] if op.get("source_location") else []),
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


def _seen_section(meta: dict, where: str) -> list[str]:
    """The README's "What was seen": the verdict of the dump's run, its class and its metrics per output."""
    op, seen = meta["ops"][0], meta["seen"]
    fed = ("the op alone fed the recorded source inputs (isolated verdict)" if not op.get("unit") else
           f"the {len(op['unit'])} ops compiled as one function, fed their recorded source inputs, at "
           f"#{op['index']} `{op['name']}`")
    lines = ["", "## What was seen", "",
             f"On {where}, {fed}: "
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
    return lines


def _run_section(meta: dict, env_prefix: str) -> list[str]:
    """The README's "Run it": the commands, the exit statuses, what the copied transform needs."""
    seen, transform = meta["seen"], meta["transform"]
    remote = f" --rpc {seen['rpc']}" if seen.get("rpc") else ""
    lines = ["## Run it", "", "```sh",
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
    return lines


def _files_section(meta: dict) -> list[str]:
    """The README's "Comparison rule" and "Files"."""
    op, transform = meta["ops"][0], meta["transform"]
    noise_rule = any(out.get("noise") for out in op["outputs"])
    lines = ["## Comparison rule", "",
             (f"Per output, as the session judged it, the noise floor: {lib.NOISE_RULE}; the float64 reference "
              "R (the op re-executed in float64 on the same inputs) is in `data.npz`, source_factor and "
              "relative_floor in `meta.json` (docs/tolerance.md of tapml-dbg). The fixed rule's figures are "
              f"printed too ({lib.COMPARE_RULE})." if noise_rule else
              f"Per output: {lib.COMPARE_RULE}. The tolerances are the recorded session's policy for the "
              "output's dtype (`meta.json`)."), "",
             "## Files", "",
             f"- `repro.py`: the entry point (argument parsing; the work is in `{lib.LIB_PACKAGE}/`)",
             f"- `{lib.LIB_PACKAGE}/`: load, compile, run and compare (a verbatim copy of tapml-dbg's "
             "`tapml_dbg/portable`, the runtime tapml-dbg itself runs units with)",
             f"- `{op['module']}`: the op's Relax module as TVMScript"
             + (f"; its {op['lifted_constants']} tensor constant(s) are lifted to trailing parameters "
                "whose values are in `data.npz`" if op["lifted_constants"] else ""),
             "- `data.npz`: the op's recorded inputs and outputs" + (" and the float64 reference" if noise_rule
                                                                      else "") + ", nothing else of the model (no pickle; "
             "bfloat16/float8 arrays are raw bits, their dtype is in `meta.json`)",
             "- `meta.json`: op, tolerances, array keys and dtypes, target, versions, the verdict seen"]
    if transform:
        lines.append(f"- `{transform['file']}`: the copied transform")
    return lines


SCRIPT_IN_README_CHARS = 6000  # a longer module is only referred to (module.py), not shown


def _bug_report(meta: dict, unit, where: str, env_prefix: str) -> list[str]:
    """The README's first section: what an upstream issue needs, ready to paste."""
    op, seen, now = meta["ops"][0], meta["seen"], meta["dumped_versions"]
    relax_ops = list(dict.fromkeys(u["relax_op"] for u in op.get("unit", []))) or [op["relax_op"]]
    dtypes = sorted({o["dtype"] for o in op["outputs"]})
    shrunk = meta.get("minimized")
    status = "reproduces" if seen["status"] not in ("pass", "missing") else "does not reproduce (it passed when dumped)"
    what = " + ".join(f"`{r}`" for r in relax_ops) + (" compiled as one function" if op.get("unit") else "")
    lines = [f"## Bug report: {what} ({', '.join(dtypes)}) is wrong on `{meta['target']}` with TVM {now.get('tvm')}",
             "", f"- **TVM** {now.get('tvm')}, numpy {now.get('numpy')}, Python {now.get('python')}; target "
             f"`{meta['target']}`" + (f" ({where})" if where != meta["target"] else ""),
             f"- **status when dumped**: {status}"]
    if seen.get("diagnosis"):
        lines.append(f"- **diagnosis**: {seen['diagnosis']}")
    shapes = ", ".join(f"`{i['name']}` {tuple(i['shape'])} {i['dtype']}" for i in op["inputs"])
    if shrunk and shrunk.get("minimized"):
        full = ", ".join(str(tuple(s)) for s in shrunk["from"])
        lines.append(f"- **smallest failing shapes**: {shapes} (minimized from {full} in {shrunk['probes']} "
                     "candidate shapes; expected values: the source re-executed in float64 at these shapes, "
                     "rounded to the output dtype)")
    elif shrunk:
        lines.append(f"- **shapes**: {shapes} ({shrunk['note'] or 'not minimized'})")
    else:
        lines.append(f"- **shapes**: {shapes} (as recorded in the model; `tapml-dbg dump --minimize` finds the "
                     "smallest failing ones)")
    for k, m in enumerate(seen["metrics"] if seen["status"] not in ("pass", "missing") else []):
        if m.get("passed", True) or m.get("shape_mismatch") or m.get("dtype_mismatch"):
            continue
        if m.get("absmax") is not None:  # the repro's own compare rule
            allowed = f"atol {_g(m['atol'])} + rtol {_g(m['rtol'])} x absmax {_g(m['absmax'])}"
        elif m.get("noise_bound") is not None:  # the engine's noise floor (docs/tolerance.md)
            allowed = (f"{_g(m['noise_bound'])} from the float64 reference, the noise floor; the target is "
                       f"{_g(m.get('ratio'))}x the source's own error")
        else:
            allowed = f"rtol {_g(m['rtol'])}, atol {_g(m['atol'])}"
        lines.append(f"- **expected vs got** (output {k}): max |got - expected| = {_g(m['max_abs_err'])}, "
                     f"{_g(m['scale_rel_err'])} of the output's scale (allowed: {allowed}), cosine "
                     f"{_g(m['cosine'], 6)}, {m['mismatched']} of {m['numel']} elements off")
    worst = (shrunk or {}).get("worst")
    if worst:
        lines.append(f"- **worst element** (output {worst['output']}, index {tuple(worst['index'])}): expected "
                     f"{worst['expected']:.6g} (float64 {worst['float64']:.6g}), got {worst['got']:.6g}")
    if seen.get("class"):
        at_full = " (of the verdict at the recorded shapes)" if shrunk and shrunk.get("minimized") else ""
        lines.append(f"- **class**{at_full}: {seen['class']}: {seen['evidence']}")
    lines += [f"- **run**: `{env_prefix}python repro.py` (exit 1: reproduced), or `python repro.py "
              "--tvmscript-only > standalone.py && python standalone.py` (one file, tvm + numpy, inputs inlined "
              "when small)", ""]
    script = unit.script.rstrip("\n")
    if len(script) <= SCRIPT_IN_README_CHARS:
        lines += ["The module, as `module.py` holds it:", "", "```python", script, "```", ""]
    return lines


def _g(value, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}g}"


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"

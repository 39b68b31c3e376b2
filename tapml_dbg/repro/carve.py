"""`carve`: every op of a trace as a parametrized pytest suite that needs only tvm, numpy and pytest.

`unit="layer"` carves one test per layer instead: each run of consecutive ops of the same layer
compiled as one function (fusion inside a layer is tested too), fed its recorded inputs, compared
at the values it hands on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from tapml_dbg import portable as lib
from tapml_dbg.errors import TargetError, TraceError, UsageError
from tapml_dbg.repro import files
from tapml_dbg.repro.templates import CONFTEST_PY, PYTEST_INI, TEST_OPS_PY
from tapml_dbg.repro.unit import RoundTripError, op_module, unit_module

DEFAULT_CARVE_MAX_MB = 256.0  # data budget of a carved suite (inputs + outputs, each array once)
MODULES_DIR = "modules"
MIB = 1024 * 1024
README_FAILURES = 50  # failing ops a carved suite's README lists by name; meta.json has them all
UNIT_OP, UNIT_LAYER = "op", "layer"  # what one carved test holds
UNITS = (UNIT_OP, UNIT_LAYER)


def _noop(*_args, **_kwargs) -> None:
    return None


@dataclass
class CarveResult:
    """A written suite: how many op tests, where, how big, and the ops left out (one line each)."""

    tests: int
    path: str
    bytes: int
    skipped: list[str] = field(default_factory=list)
    ops: int = 0
    data_bytes: int = 0
    max_mb: float = DEFAULT_CARVE_MAX_MB
    target: str = "llvm"
    seconds: float = 0.0
    # when carved over a remote target: each op's isolated verdict there (status by op name)
    verdicts: dict[str, str] = field(default_factory=dict)
    check_error: str = ""  # why the check on the target stopped (the suite is written all the same)

    @property
    def diverged(self) -> list[str]:
        """Ops whose check on the target failed (empty when nothing was checked)."""
        return [name for name, status in self.verdicts.items() if status not in ("pass", "missing")]


def layer_groups(ops) -> list[list]:
    """Runs of consecutive ops that share one layer path, in order (the model's output tuple alone)."""
    groups: list[list] = []
    for op in ops:
        if groups and groups[-1][-1].layer == op.layer and op.outputs and groups[-1][-1].outputs:
            groups[-1].append(op)
        else:
            groups.append([op])
    return groups


def carve(session, output, max_mb: float | None = None, progress: Callable[..., None] = _noop,
          command: str | None = None, verify: bool | None = None, unit: str = UNIT_OP) -> CarveResult:
    """Write one test per recorded op of the session's trace into folder `output`.

    Writing the suite runs nothing on the target. With `verify` (default: when the session's
    target is remote, `--rpc` or `--tracker`), each carved op is also checked there first: its
    isolated verdict, batched and spread over the session's lanes (one per tracker server), is
    written into `meta.json` and the README, so the suite arrives with what the device said.
    """
    started = time.perf_counter()
    max_mb = DEFAULT_CARVE_MAX_MB if max_mb is None else float(max_mb)
    if max_mb <= 0:
        raise UsageError(f"--max-mb must be positive, got {max_mb:g}")
    if unit not in UNITS:
        raise UsageError(f"--unit must be one of {', '.join(UNITS)}, got {unit!r}")
    folder = files.prepare_dir(output)
    (folder / MODULES_DIR).mkdir()
    writer = files.DataWriter()
    total = len(session.ops)
    groups = layer_groups(session.ops) if unit == UNIT_LAYER else [[op] for op in session.ops]
    groups, host_only = _cut_host_only(session, groups)
    entries, skipped = _write_units(session, groups, folder, writer, max_mb, progress)
    skipped[:0] = host_only
    verdicts: dict[str, str] = {}
    check_error = ""
    # isolated verdicts are per op: a layer suite is checked by running it
    if unit == UNIT_OP and (verify if verify is not None else session.spec.remote):
        verdicts, check_error = _check_on_target(session, entries, progress)
    progress(total, total, "writing data")
    meta = files.write_payload(folder, session, writer, "carve", command)
    model = session.reader.meta.get("model", "the model")
    (folder / "test_ops.py").write_text(TEST_OPS_PY.format(model=model, target=session.target,
                                                           folder_hint=folder.name), encoding="utf-8")
    (folder / "conftest.py").write_text(CONFTEST_PY.format(target=session.target), encoding="utf-8")
    (folder / "pytest.ini").write_text(PYTEST_INI, encoding="utf-8")
    meta.update(max_mb=max_mb, skipped=skipped, ops=entries, unit=unit)
    if verdicts:
        meta["checked_on"] = session.where
    if check_error:
        meta["check_error"] = f"the check on {session.where} stopped: {check_error}"
    files.write_meta(folder, meta)
    size = files.write_readme_sized(folder, lambda n: _readme(meta, len(session.ops), writer.nbytes, n))
    return CarveResult(tests=len(entries), path=str(folder), bytes=size, skipped=skipped, ops=len(session.ops),
                       data_bytes=writer.nbytes, max_mb=max_mb, target=session.target,
                       seconds=time.perf_counter() - started, verdicts=verdicts, check_error=check_error)


def _cut_host_only(session, groups: list[list]) -> tuple[list[list], list[str]]:
    """`groups` without the ops TVM cannot import (no TVM unit of theirs: docs/host-only-ops.md), a group
    cut in two around one; and a line for each op left out (why)."""
    reasons = {entry.index: entry.reason for entry in session.host_only}
    cut: list[list] = []
    for group in groups:
        runs: list[list] = [[]]
        for op in group:
            if op.index in reasons:
                runs.append([])
            else:
                runs[-1].append(op)
        cut.extend(run for run in runs if run)
    return cut, [f"op {index} {session.ops[index].name}: runs on the host only ({reason})"
                 for index, reason in sorted(reasons.items())]


def _write_units(session, groups: list[list], folder, writer, max_mb: float, progress) -> tuple[list[dict], list[str]]:
    """Each group's module into `folder`'s modules and its data into `writer`, within the `max_mb` budget:
    the meta entry of every carved unit, and a line for each one left out (why)."""
    budget = int(max_mb * MIB)
    entries: list[dict] = []
    skipped: list[str] = []
    total = len(session.ops)
    for group in groups:
        op = group[-1]
        what = f"op {op.index} {op.name}" if len(group) == 1 else \
            f"layer {op.layer or '(top)'} (ops {group[0].index}..{op.index})"
        progress(op.index, total, op.name)
        try:
            piece = op_module(session, op) if len(group) == 1 else unit_module(session, group)
        except (TraceError, RoundTripError) as exc:
            skipped.append(f"{what}: {exc}")
            continue
        cost = writer.new_bytes(piece.refs)
        if writer.nbytes + cost > budget:
            skipped.append(f"{what} ({files.human_bytes(cost)}) left out: over the "
                           f"{max_mb:g} MiB budget (raise with --max-mb)")
            continue
        writer.add(piece.refs)
        label = op.name if len(group) == 1 else f"{group[0].name}__{op.layer or 'top'}"
        module_path = f"{MODULES_DIR}/{group[0].index:03d}_{files.safe_name(label)}.py"
        (folder / module_path).write_text(piece.script.rstrip("\n") + "\n", encoding="utf-8")
        entries.append(piece.meta(module_path))
    return entries, skipped


def _check_on_target(session, entries: list[dict], progress) -> tuple[dict[str, str], str]:
    """Each carved op's isolated verdict on the session's target, batched over its lanes, written into
    its entry: the status by op name, and why the check stopped ("" when it did not)."""
    verdicts: dict[str, str] = {}
    check_error = ""
    checked = {}
    carved = [entry["index"] for entry in entries]
    try:
        checked = session.verdicts.isolated_many(carved, lambda done, count, what="": progress(
            done, count, f"checking on {session.target}: {what}"))
    except TargetError as exc:  # e.g. a kernel that takes the RPC server's session down
        check_error = str(exc)
    for entry in entries if checked else []:
        verdict = checked[entry["index"]]
        verdicts[entry["name"]] = verdict.status
        entry["target_verdict"] = {"status": verdict.status, "summary": verdict.summary}
    return verdicts, check_error


def _readme(meta: dict, num_ops: int, data_bytes: int, total_bytes: int) -> str:
    transform = meta["transform"]
    env = " ".join(f"{k}={v}" for k, v in (transform or {}).get("env", {}).items() if v is not None)
    env = env + " " if env else ""
    lines = [f"# Carved op tests of `{meta['model']}`", "",
             (f"Written by `tapml-dbg carve`: one pytest test per op ({len(meta['ops'])} of {num_ops} ops), "
              "each op alone, fed its inputs recorded on the source " if meta.get("unit", UNIT_OP) == UNIT_OP else
              f"Written by `tapml-dbg carve --unit layer`: one pytest test per layer ({len(meta['ops'])} tests over "
              f"{num_ops} ops), each run of consecutive ops of one layer compiled as one function, fed its inputs "
              "recorded on the source ") +
             f"({meta['source']}) and compared with its recorded output. Needs only `tvm`, `numpy` and `pytest`.",
             "", "```sh",
             f"{env}pytest THIS_FOLDER                  # from any directory; default target {meta['target']}",
             f"{env}pytest THIS_FOLDER --target cuda",
             f"{env}pytest THIS_FOLDER --rpc HOST:PORT --target opencl",
             f"{env}pytest THIS_FOLDER -k addmm         # some ops only", "```", "",
             f"Tolerance rule per output: {meta['compare_rule']}. Per-output tolerances are in `meta.json`.", "",
             "| | |", "|---|---|",
             f"| model | `{meta['model']}` (recorded on {meta['source']}) |",
             f"| recorded with | {', '.join(f'{k} {v}' for k, v in meta['recorded_versions'].items())} |",
             f"| carved with | {', '.join(f'{k} {v}' for k, v in meta['carved_versions'].items())} |",
             f"| target | `{meta['target']}` |",
             "| transform | " + (f"`{transform['file']}:{transform['func']}` (copied as-is)" if transform else "none")
             + " |",
             f"| size | {files.human_bytes(total_bytes)} in all; data {files.human_bytes(data_bytes)} "
             f"(budget {meta['max_mb']:g} MiB) |", ""]
    if transform and transform["env"]:
        lines += ["The transform reads environment variables; values at carve time: "
                  + ", ".join(f"`{k}={v}`" for k, v in transform["env"].items()) + ".", ""]
    if meta.get("checked_on"):
        checked = [entry for entry in meta["ops"] if "target_verdict" in entry]
        bad = [entry for entry in checked if entry["target_verdict"]["status"] not in ("pass", "missing")]
        lines += [f"## Checked on {meta['checked_on']}", "",
                  f"When carving, each op ran once there, isolated: {len(checked) - len(bad)} of {len(checked)} "
                  "passed (the verdicts are in `meta.json`, `target_verdict`)."
                  + (" These did not:" if bad else ""), ""]
        lines += [f"- op {entry['index']} `{entry['name']}` ({entry['op']})"
                  + (f" at {files.markdown_location(entry['source_location'])}" if entry.get("source_location") else "")
                  + f": {entry['target_verdict']['status']}"
                  + (f": {entry['target_verdict']['summary']}" if entry["target_verdict"]["summary"] else "")
                  for entry in bad[:README_FAILURES]]
        if len(bad) > README_FAILURES:
            lines.append(f"- ... and {len(bad) - README_FAILURES} more (see meta.json)")
        lines.append("")
    if meta.get("check_error"):
        lines += ["## Not checked on the target", "", meta["check_error"] + ".", ""]
    if meta["skipped"]:
        lines += [f"## Left out ({len(meta['skipped'])})", ""] + [f"- {note}" for note in meta["skipped"]] + [""]
    lines += ["## Files", "",
              "- `test_ops.py`, `conftest.py`, `pytest.ini`: the suite (`--target`, `--rpc`, `--tracker`/`--key`)",
              f"- `{lib.LIB_PACKAGE}/`: load, compile, run, compare (a verbatim copy of tapml-dbg's "
              "`tapml_dbg/portable`, shared with `tapml-dbg dump`'s repro.py)",
              "- `modules/NNN_OP.py`: each op's Relax module as TVMScript (tensor constants lifted to inputs)",
              "- `data.npz`: every input and output, each array once (no pickle; bfloat16 as raw bits)",
              "- `meta.json`: ops, array keys, dtypes, tolerances, target, versions"]
    if meta["command"]:
        lines += ["", "## Made by", "", "```sh", meta["command"], "```"]
    return "\n".join(lines) + "\n"

"""A repro directory: its files, one op's check on the target, and `repro.py`'s command line.

The directory holds:
  meta.json   what to run: one entry per op (its TVMScript module, its input and output arrays,
              the tolerance of each output), the default target and the transform, if any
  data.npz    every array, plain numeric (no pickle); dtypes numpy lacks (bfloat16, float8)
              are stored as raw unsigned bits and decoded with the dtype named in meta.json
  modules     TVMScript text, parsed back with `tvm.script.from_source`
  _tapml_repro_lib/   a verbatim copy of this package (`tapml_dbg/portable`)
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from .codec import decode_array, encode_array, write_npz
from .comparison import compare, format_metrics
from .errors import PortableError, TransformFailed, one_line
from .loader import load_function
from .noise import noise_figures, ratio_text
from .runner import DEFAULT_TARGET, Runner
from .standalone import standalone_script

FORMAT = "tapml-repro"
FORMAT_VERSION = 1
META_FILE = "meta.json"
DATA_FILE = "data.npz"
LIB_PACKAGE = "_tapml_repro_lib"  # the folder this package is copied to, beside repro.py

# statuses of one op check; every one but "pass" means the op fails on the target
PASS, FAIL, COMPILE_ERROR, RUN_ERROR = "pass", "fail", "compile-error", "error"

# exit codes of repro.py
EXIT_OK, EXIT_REPRODUCED, EXIT_BROKEN = 0, 1, 2


# ------------------------------------------------------------------------------ files
def read_meta(here: str) -> dict:
    path = os.path.join(here, META_FILE)
    try:
        with open(path, encoding="utf-8") as handle:
            meta = json.load(handle)
    except (OSError, ValueError) as exc:
        raise PortableError(f"cannot read {path}: {exc}") from exc
    if meta.get("format") != FORMAT or int(meta.get("version", 0)) > FORMAT_VERSION:
        raise PortableError(f"{path} is not a {FORMAT} v{FORMAT_VERSION} file")
    return meta


class Data:
    """The arrays of a repro directory, loaded lazily from data.npz (never with pickle)."""

    def __init__(self, here: str):
        path = os.path.join(here, DATA_FILE)
        try:
            self._npz = np.load(path, allow_pickle=False)
        except OSError as exc:
            raise PortableError(f"cannot read {path}: {exc}") from exc

    def get(self, entry: dict) -> np.ndarray:
        key = entry["key"]
        try:
            stored = self._npz[key]
        except KeyError as exc:
            raise PortableError(f"array {key!r} is missing from {DATA_FILE}") from exc
        return decode_array(stored, entry["dtype"])

    def close(self) -> None:
        self._npz.close()


def load_module(path: str):
    """Parse an op's TVMScript file back into a tvm.IRModule."""
    import tvm
    import tvm.script

    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise PortableError(f"cannot read the op's module {path}: {exc}") from exc
    try:
        return tvm.script.from_source(text)
    except Exception as exc:
        raise PortableError(f"TVMScript in {path} does not parse with this TVM ({tvm.__version__}): "
                            f"{one_line(exc)}") from exc


def load_transform(here: str, spec: dict | None):
    """The user's `FUNC(mod) -> mod` from the transform file copied into the directory."""
    if not spec:
        return None
    return load_function(os.path.join(here, spec["file"]), spec["func"], what="transform")


# ------------------------------------------------------------------------------ one op
class OpCheck:
    """The outcome of running one op on the target: status, per-output metrics, message."""

    def __init__(self, op: dict, where: str, status: str, metrics=None, message: str = "", outputs=None):
        self.op, self.where, self.status = op, where, status
        self.metrics = metrics or []
        self.message = message
        self.outputs = outputs or []  # the target's outputs, when it ran

    @property
    def passed(self) -> bool:
        return self.status == PASS

    def lines(self) -> list[str]:
        op = self.op
        head = (f"{describe(op)} ({op['op']}"
                + (f", layer {op['layer']}" if op.get("layer") else "") + f") on {self.where}: {self.status}")
        lines = [head]
        if self.message:
            lines.append("  " + self.message)
        for number, (out, m) in enumerate(zip(op["outputs"], self.metrics)):
            verdict = "ok  " if m["passed"] else "FAIL"
            if not out.get("judged", True):
                verdict = "not judged (nothing in the model reads it), " + ("ok" if m["passed"] else "differs") + ":"
            lines.append(f"  out {number} {out['dtype']} {tuple(out['shape'])}: {verdict} {format_metrics(m)}")
        return lines

    def report(self) -> str:
        return "\n".join(self.lines())


def describe(op: dict) -> str:
    """How a report names the repro's op: 'op #9 _softmax', or a multi-op unit by its ops."""
    unit = op.get("unit")
    if not unit:
        return f"op #{op['index']} {op['name']}"
    return (f"unit #{unit[0]['index']}..#{unit[-1]['index']} ({len(unit)} ops compiled as one function: "
            + ", ".join(item["name"] for item in unit) + ")")


def op_id(op: dict) -> str:
    """A carved test's id: `009-_softmax`, or a unit's first op and layer (`003-blocks.0.fc`)."""
    unit = op.get("unit")
    if unit:
        return f"{unit[0]['index']:03d}-{op.get('layer') or unit[0]['name']}"
    return f"{op['index']:03d}-{op['name']}"


def check_op(here: str, meta: dict, op: dict, runner: Runner, data: Data) -> OpCheck:
    """Build the op's module for the target (as the engine does), run it on the recorded inputs, compare.

    Raises PortableError when the repro itself cannot run; a build or run failure on the
    target is a status, as is a divergence.
    """
    mod = load_module(os.path.join(here, op["module"]))
    transform = load_transform(here, meta.get("transform"))
    inputs = [data.get(entry) for entry in op["inputs"]]
    expected = [data.get(entry) for entry in op["outputs"]]
    try:
        executable = runner.build(mod, transform)
    except Exception as exc:
        missing = _unset_env(meta)
        if missing and transform is not None:
            raise PortableError(f"the transform failed ({one_line(exc)}); it reads environment variables "
                                f"that are not set: {', '.join(missing)} (README.md lists the values the dump "
                                "used)") from exc
        if isinstance(exc, TransformFailed):  # the pass raised: the repro cannot run as asked, no verdict
            raise
        return OpCheck(op, runner.where, COMPILE_ERROR, message=_reason(exc))
    try:
        vm = runner.load(executable, f"tapml_op_{op['index']}")
        outputs = runner.run(vm, inputs)
    except PortableError:
        raise
    except Exception as exc:
        return OpCheck(op, runner.where, RUN_ERROR, message=one_line(exc))
    if len(outputs) != len(expected):
        return OpCheck(op, runner.where, FAIL, message=f"{len(outputs)} outputs vs {len(expected)} recorded",
                       outputs=outputs)
    metrics = [judge_output(t, s, out, data) for t, s, out in zip(outputs, expected, op["outputs"])]
    judged = [m for m, out in zip(metrics, op["outputs"]) if out.get("judged", True)]
    return OpCheck(op, runner.where, PASS if all(m["passed"] for m in judged) else FAIL, metrics,
                   outputs=outputs)


def _reference(out: dict, expected: np.ndarray, data: "Data") -> np.ndarray | None:
    """The float64 reference an output's noise-floor rule judges it against (None: the fixed rule judges it)."""
    rule = out.get("noise")
    if not rule:
        return None
    reference = data.get(rule["reference"])
    return reference if tuple(reference.shape) == tuple(np.shape(expected)) else None


def judge_output(target: np.ndarray, expected: np.ndarray, out: dict, data: "Data") -> dict:
    """One output's metrics: the fixed rule's figures, and the verdict of the noise floor where the dump
    stored the session's rule for it (`noise`: its float64 reference and numbers), so a repro judges
    exactly as the session that dumped it (and so does its --tvmscript-only script)."""
    metrics = compare(target, expected, out["rtol"], out["atol"])
    rule = out.get("noise")
    if not rule or metrics["shape_mismatch"] or metrics["dtype_mismatch"]:
        return metrics
    reference = _reference(out, expected, data)
    if reference is None:
        return metrics
    figures = noise_figures(target, expected, reference, rule["source_factor"], rule["relative_floor"])
    metrics.update(policy="noise-floor", source_err=figures.source_err, target_err=figures.target_err,
                   noise_bound=figures.bound, ratio=figures.ratio, ratio_text=ratio_text(figures),
                   mismatched=figures.mismatched + metrics["nan_mismatch"] + metrics["inf_mismatch"])
    metrics["passed"] = figures.passed and not metrics["nan_mismatch"] and not metrics["inf_mismatch"]
    return metrics


def _reason(exc: BaseException) -> str:
    """Our own errors read as they are; anything TVM raised keeps its type."""
    return str(exc) if isinstance(exc, PortableError) else one_line(exc)


def _unset_env(meta: dict) -> list[str]:
    used = (meta.get("transform") or {}).get("env", {})
    return [name for name, value in used.items() if value is not None and name not in os.environ]


# ------------------------------------------------------------------------------ repro.py
def parse_args(argv, meta: dict) -> argparse.Namespace:
    op = meta["ops"][0]
    default = meta.get("target", DEFAULT_TARGET)
    parser = argparse.ArgumentParser(
        prog="repro.py", description=f"Reproduce {describe(op)} ({op['op']}) of "
                                     f"{meta.get('model', 'the model')} with tvm and numpy only.",
        epilog=f"exit status: {EXIT_REPRODUCED} the divergence reproduces (or the op fails to compile or run), "
               f"{EXIT_OK} it does not, {EXIT_BROKEN} the repro itself cannot run")
    parser.add_argument("--target", default=default, help=f"TVM target (default: the dump's, {default})")
    remote = parser.add_mutually_exclusive_group()
    remote.add_argument("--rpc", metavar="HOST:PORT", help="run on a TVM RPC server")
    remote.add_argument("--tracker", metavar="HOST:PORT", help="lease a device from a TVM RPC tracker")
    parser.add_argument("--key", help="device key at the tracker")
    parser.add_argument("--save-outputs", metavar="FILE.npz", help="also save the target's outputs")
    parser.add_argument("--tvmscript-only", action="store_true",
                        help="print one self-contained script (the module's TVMScript, its inputs inlined when "
                             "small, the check) for an upstream bug report, and run nothing")
    return parser.parse_args(argv)


def tvmscript_only(here: str, meta: dict) -> str:
    """`--tvmscript-only`: the repro's first op as one self-contained script (portable/standalone.py)."""
    op = meta["ops"][0]
    data = Data(here)
    try:
        inputs = [data.get(entry) for entry in op["inputs"]]
        expected = [data.get(entry) for entry in op["outputs"]]
        references = [_reference(out, value, data) for out, value in zip(op["outputs"], expected)]
    finally:
        data.close()
    path = os.path.join(here, op["module"])
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise PortableError(f"cannot read the op's module {path}: {exc}") from exc
    return standalone_script(here, meta, op, inputs, expected, text, f"{describe(op)} ({op['op']})", references)


def repro_main(here: str, argv=None, out=None) -> int:
    """What repro.py runs: returns the exit status, writes the report to `out` (default stdout)."""
    out = out or sys.stdout
    try:
        meta = read_meta(here)
        args = parse_args(argv, meta)
        if args.tvmscript_only:
            out.write(tvmscript_only(here, meta))
            return EXIT_OK
        runner = Runner(args.target, args.rpc, args.tracker, args.key)
        data = Data(here)
        op = meta["ops"][0]
        check = check_op(here, meta, op, runner, data)
    except PortableError as exc:
        out.write(f"repro cannot run: {exc}\n")
        return EXIT_BROKEN
    out.write(f"tapml-dbg repro of {meta.get('model', '?')} (recorded on {meta.get('source', '?')})\n")
    if meta.get("transform"):
        out.write(f"transform: {meta['transform']['file']}:{meta['transform']['func']}\n")
        for name, value in (meta["transform"].get("env") or {}).items():
            if value is not None and os.environ.get(name) != value:
                now = "unset" if name not in os.environ else f"{os.environ[name]!r}"
                out.write(f"note: the transform reads ${name}, which was {value!r} when the repro was made and "
                          f"is {now} now\n")
    out.write(check.report() + "\n")
    if args.save_outputs and check.outputs:
        write_npz(args.save_outputs, ((f"out/{k}", encode_array(a)[0]) for k, a in enumerate(check.outputs)))
        out.write(f"target outputs saved to {args.save_outputs} (keys out/0.., raw bits for bfloat16)\n")
    if check.passed:
        out.write(f"NOT REPRODUCED: {describe(op)} matches the source on {runner.where}\n")
        return EXIT_OK
    out.write(f"REPRODUCED: {describe(op)} diverges on {runner.where} ({check.status})\n")
    return EXIT_REPRODUCED

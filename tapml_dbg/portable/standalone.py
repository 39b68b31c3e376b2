"""`repro.py --tvmscript-only`: the repro as one self-contained script, to paste into an upstream issue.

The script holds the module's TVMScript, its inputs and expected outputs (inlined when small, else
read from the data.npz beside the script, so a moved or copied repro folder still runs), the rule
each output is judged by, and forty lines that compile, run and compare with tvm and numpy only:
nothing of tapml-dbg. Each output is judged as repro.py and the session judge it: by the noise
floor (its float64 reference carried with the data, the session's source_factor and
relative_floor: the same bound) where the dump stored that rule, else by the fixed rtol / atol. It
applies the repro's transform (the copy beside the script) only when the repro has one.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .paged_kv import ATTENTION_FUNC

INLINE_MAX_ELEMENTS = 4096  # inputs and expected outputs together; larger data stays in data.npz
EXPECTED_FROM = {False: "the outputs recorded on the source",
                 True: "the source re-executed in float64 at these shapes, rounded to the output dtype"}
INLINE_DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")

RUNNER = '''

def outputs_of(value):
    """A VM result (a tensor or nested tuples of tensors) as a flat list of arrays."""
    if hasattr(value, "numpy"):
        return [value.numpy()]
    return [array for item in value for array in outputs_of(item)]


def same_nonfinite_places(got, expected):
    """NaN where expected is NaN, +-Inf where it is +-Inf, and nowhere else."""
    return np.array_equal(np.isnan(got), np.isnan(expected)) and np.array_equal(
        np.where(np.isinf(got), np.sign(got), 0), np.where(np.isinf(expected), np.sign(expected), 0))


def passes(got, expected, rtol, atol):
    """max |got - expected| <= atol + rtol * absmax(expected) over finite elements; NaN/Inf where expected has them."""
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    if got.shape != expected.shape:
        return False, f"shape {{got.shape}} vs expected {{expected.shape}}"
    finite = np.isfinite(got) & np.isfinite(expected)
    same_nonfinite = same_nonfinite_places(got, expected)
    error = float(np.max(np.abs(got - expected)[finite], initial=0.0))
    bound = atol + rtol * float(np.max(np.abs(expected[finite]), initial=0.0))
    return error <= bound and same_nonfinite, f"max_abs_err={{error:.3g}} (bound {{bound:.3g}})"


def noise_floor(got, expected, reference, source_factor, relative_floor):
    """max |got - R| <= max(source_factor * max |expected - R|, relative_floor * absmax(R)), R the float64
    reference, over finite elements; NaN/Inf where expected has them (the session's noise-floor rule)."""
    got, expected, reference = (np.asarray(a, np.float64) for a in (got, expected, reference))
    if got.shape != expected.shape:
        return False, f"shape {{got.shape}} vs expected {{expected.shape}}"
    keep = np.isfinite(expected) & np.isfinite(reference)
    same_nonfinite = same_nonfinite_places(got, expected)
    source_error = float(np.max(np.abs(expected - reference)[keep], initial=0.0))
    error = float(np.max(np.abs(got - reference)[keep & np.isfinite(got)], initial=0.0))
    bound = max(source_factor * source_error, relative_floor * float(np.max(np.abs(reference[keep]), initial=0.0)))
    return error <= bound and same_nonfinite, (f"|got - float64 reference|={{error:.3g}} (bound {{bound:.3g}}: the "
                                               f"noise floor; the source's own error {{source_error:.3g}})")


def judge(got, expected, rule, reference):
    """One output by its rule: ("noise-floor", source_factor, relative_floor) or ("fixed", rtol, atol)."""
    if rule[0] == "noise-floor":
        return noise_floor(got, expected, reference, rule[1], rule[2])
    return passes(got, expected, rule[1], rule[2])


def main(target):
    mod = Module{transform_call}
    target = tvm.target.Target(target)
    device = tvm.cpu() if target.kind.name in ("llvm", "c") else tvm.device(target.kind.name, 0)
    vm = relax.VirtualMachine(tvm.compile(mod, target=target), device)
    got = outputs_of(vm["main"](*[tvm.runtime.tensor(a, device) for a in INPUTS]))
    failed = False
    for number, (value, expected, rule, reference) in enumerate(zip(got, EXPECTED, RULES, REFERENCES)):
        ok, figures = judge(value, expected, rule, reference)
        failed |= not ok
        print(f"output {{number}} {{expected.dtype}} {{expected.shape}}: {{'ok' if ok else 'WRONG'}} {{figures}}")
    print(("REPRODUCED: " if failed else "NOT REPRODUCED: ") + {what!r} + f" on {{target.kind.name}}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else {target!r}))
'''


def _paged_kv_text() -> str:
    """paged_kv.py's own source (beside this file, in tapml_dbg and in every repro's copy), without its
    `__future__` import, which only a file's first statement may hold."""
    text = Path(__file__).with_name("paged_kv.py").read_text()
    return text.replace("from __future__ import annotations\n", "")


def _inline(array: np.ndarray) -> str:
    values = array.reshape(-1).tolist()
    return f"np.array({values!r}, dtype={array.dtype.name!r}).reshape({tuple(array.shape)!r})"


# where the script finds the repro's files: beside itself (the repro folder, wherever it was moved),
# else in the folder the repro was in when the script was written
FOLDER_TEXT = (
    "HERE = next((folder for folder in (Path(__file__).resolve().parent, Path({written!r}))\n"
    "             if (folder / {name!r}).is_file()), None)\n"
    "if HERE is None:\n"
    "    sys.exit('put this script in the repro folder, beside {name}: it reads the repro files from there')\n")


def _rule(out: dict, reference) -> tuple:
    """How an output is judged: the session's noise floor where the dump stored it, else the fixed rule."""
    noise = out.get("noise")
    if noise and reference is not None:
        return ("noise-floor", float(noise["source_factor"]), float(noise["relative_floor"]))
    return ("fixed", float(out["rtol"]), float(out["atol"]))


def standalone_script(here: str, meta: dict, op: dict, inputs: list[np.ndarray], expected: list[np.ndarray],
                      module_text: str, what: str, references: list | None = None) -> str:
    """The self-contained script for `op` of the repro in folder `here`. `references`: per output, the
    float64 reference its noise-floor rule judges it against (None: the fixed rule judges it)."""
    references = list(references) if references is not None else [None] * len(expected)
    rules = [_rule(out, reference) for out, reference in zip(op["outputs"], references)]
    arrays = inputs + expected + [r for r in references if r is not None]
    inline = sum(int(a.size) for a in arrays) <= INLINE_MAX_ELEMENTS and \
        all(a.dtype.name in INLINE_DTYPES for a in arrays)
    written, folders = os.path.abspath(here), ""
    if inline:
        inputs_text = "INPUTS = [\n" + "".join(f"    {_inline(a)},\n" for a in inputs) + "]\n"
        expected_text = "EXPECTED = [\n" + "".join(f"    {_inline(a)},\n" for a in expected) + "]\n"
        references_text = ("REFERENCES = [\n" + "".join(f"    {_inline(r) if r is not None else None},\n"
                                                         for r in references) + "]  # the float64 references\n")
    else:
        folders = FOLDER_TEXT.format(written=written, name="data.npz")
        inputs_text = ("DATA = np.load(HERE / 'data.npz', allow_pickle=False)  # too big to inline: the repro's data\n"
                       "INPUTS = [" + ", ".join(f"DATA[{e['key']!r}]" for e in op["inputs"]) + "]\n")
        expected_text = "EXPECTED = [" + ", ".join(f"DATA[{e['key']!r}]" for e in op["outputs"]) + "]\n"
        references_text = "REFERENCES = [" + ", ".join(
            f"DATA[{out['noise']['reference']['key']!r}]" if reference is not None else "None"
            for out, reference in zip(op["outputs"], references)) + "]  # the float64 references\n"
    transform = meta.get("transform")
    transform_text, transform_call = "", ""
    if transform:
        folders = folders or FOLDER_TEXT.format(written=written, name=transform["file"])
        transform_text = ("\nimport importlib.util\n_spec = importlib.util.spec_from_file_location('repro_transform', "
                          f"HERE / {transform['file']!r})\n_transform = importlib.util.module_from_spec(_spec)\n"
                          f"_spec.loader.exec_module(_transform)  # the transform the repro was made with\n")
        transform_call = f"\n    mod = _transform.{transform['func']}(mod)"
    body = module_text.replace("# from tvm.script import", "from tvm.script import")
    if ATTENTION_FUNC in module_text:  # a paged-KV call: the function it names goes into the script
        body = _paged_kv_text() + "\n\nregister()\n\n\n" + body
    header = (f'"""{what}: a self-contained reproducer (tvm + numpy), written by tapml-dbg '
              f'(repro.py --tvmscript-only).\n\n    python this_file.py [TARGET]   # exit 1: reproduced, 0: not\n\n'
              f'TVM {meta.get("dumped_versions", {}).get("tvm", "?")}, target {meta.get("target", "llvm")}; '
              f'expected values: {EXPECTED_FROM[bool((meta.get("minimized") or {}).get("minimized"))]}.\n"""\n\n'
              "import sys\nfrom pathlib import Path\n\nimport numpy as np\nimport tvm\nfrom tvm import relax\n"
              + ("\n" + folders if folders else ""))
    return (header + transform_text + "\n" + body.rstrip("\n") + "\n\n\n" + inputs_text + expected_text
            + references_text
            + f"RULES = {rules!r}  # per output, as the session judged it: (noise-floor, source_factor, "
              "relative_floor) or (fixed, rtol, atol)\n"
            + RUNNER.format(transform_call=transform_call, what=what, target=meta.get("target", "llvm")))

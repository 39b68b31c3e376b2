"""`repro.py --tvmscript-only`: the repro as one self-contained script, to paste into an upstream issue.

The script holds the module's TVMScript, its inputs and expected outputs (inlined when small, else
read from the repro's data.npz by absolute path), the tolerance, and twenty lines that compile,
run and compare with tvm and numpy only: nothing of tapml-dbg. It applies the repro's transform
(by absolute path) only when the repro has one.
"""

from __future__ import annotations

import os

import numpy as np

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


def passes(got, expected, rtol, atol):
    """max |got - expected| <= atol + rtol * absmax(expected) over finite elements; NaN/Inf where expected has them."""
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    if got.shape != expected.shape:
        return False, f"shape {{got.shape}} vs expected {{expected.shape}}"
    finite = np.isfinite(got) & np.isfinite(expected)
    same_nonfinite = np.array_equal(np.isnan(got), np.isnan(expected)) and np.array_equal(
        np.where(np.isinf(got), np.sign(got), 0), np.where(np.isinf(expected), np.sign(expected), 0))
    error = float(np.max(np.abs(got - expected)[finite], initial=0.0))
    bound = atol + rtol * float(np.max(np.abs(expected[finite]), initial=0.0))
    return error <= bound and same_nonfinite, f"max_abs_err={{error:.3g}} (bound {{bound:.3g}})"


def main(target):
    mod = Module{transform_call}
    target = tvm.target.Target(target)
    device = tvm.cpu() if target.kind.name in ("llvm", "c") else tvm.device(target.kind.name, 0)
    vm = relax.VirtualMachine(tvm.compile(mod, target=target), device)
    got = outputs_of(vm["main"](*[tvm.runtime.tensor(a, device) for a in INPUTS]))
    failed = False
    for number, (value, expected, (rtol, atol)) in enumerate(zip(got, EXPECTED, TOLERANCES)):
        ok, figures = passes(value, expected, rtol, atol)
        failed |= not ok
        print(f"output {{number}} {{expected.dtype}} {{expected.shape}}: {{'ok' if ok else 'WRONG'}} {{figures}}")
    print(("REPRODUCED: " if failed else "NOT REPRODUCED: ") + {what!r} + f" on {{target.kind.name}}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else {target!r}))
'''


def _inline(array: np.ndarray) -> str:
    values = array.reshape(-1).tolist()
    return f"np.array({values!r}, dtype={array.dtype.name!r}).reshape({tuple(array.shape)!r})"


def standalone_script(here: str, meta: dict, op: dict, inputs: list[np.ndarray], expected: list[np.ndarray],
                      module_text: str, what: str) -> str:
    """The self-contained script for `op` of the repro in folder `here`."""
    arrays = inputs + expected
    inline = sum(int(a.size) for a in arrays) <= INLINE_MAX_ELEMENTS and \
        all(a.dtype.name in INLINE_DTYPES for a in arrays)
    data = os.path.join(os.path.abspath(here), "data.npz")
    if inline:
        inputs_text = "INPUTS = [\n" + "".join(f"    {_inline(a)},\n" for a in inputs) + "]\n"
        expected_text = "EXPECTED = [\n" + "".join(f"    {_inline(a)},\n" for a in expected) + "]\n"
    else:
        inputs_text = (f"DATA = np.load({data!r}, allow_pickle=False)  # too big to inline: the repro's data\n"
                       "INPUTS = [" + ", ".join(f"DATA[{e['key']!r}]" for e in op["inputs"]) + "]\n")
        expected_text = "EXPECTED = [" + ", ".join(f"DATA[{e['key']!r}]" for e in op["outputs"]) + "]\n"
    tolerances = [(float(o["rtol"]), float(o["atol"])) for o in op["outputs"]]
    transform = meta.get("transform")
    transform_text, transform_call = "", ""
    if transform:
        path = os.path.join(os.path.abspath(here), transform["file"])
        transform_text = ("\nimport importlib.util\n_spec = importlib.util.spec_from_file_location('repro_transform', "
                          f"{path!r})\n_transform = importlib.util.module_from_spec(_spec)\n"
                          f"_spec.loader.exec_module(_transform)  # the transform the repro was made with\n")
        transform_call = f"\n    mod = _transform.{transform['func']}(mod)"
    body = module_text.replace("# from tvm.script import", "from tvm.script import")
    header = (f'"""{what}: a self-contained reproducer (tvm + numpy), written by tapml-dbg '
              f'(repro.py --tvmscript-only).\n\n    python this_file.py [TARGET]   # exit 1: reproduced, 0: not\n\n'
              f'TVM {meta.get("dumped_versions", {}).get("tvm", "?")}, target {meta.get("target", "llvm")}; '
              f'expected values: {EXPECTED_FROM[bool((meta.get("minimized") or {}).get("minimized"))]}.\n"""\n\n'
              "import sys\n\nimport numpy as np\nimport tvm\nfrom tvm import relax\n")
    return (header + transform_text + "\n" + body.rstrip("\n") + "\n\n\n" + inputs_text + expected_text
            + f"TOLERANCES = {tolerances!r}  # (rtol, atol) per output\n"
            + RUNNER.format(transform_call=transform_call, what=what, target=meta.get("target", "llvm")))

"""Record a TVM-native LLM's greedy generation (`record FILE --source tvm:T --generate N`).

First the module runs as a deployment runs it on T: compiled whole, its paged KV cache created,
sequence 0 added, then a prefill over the prompt and N decode steps, each between
`kv_state_begin_forward` and `kv_state_end_forward`, each fed the token the step before it chose
(greedy). Those tokens drive the recording: the generation is unrolled into one graph
(frontend/native_llm.py) fed them, and every op is computed by its own unit on T from the values
recorded before it (record/native.py), the paged-KV calls with their cache state as values. Last,
every step's logits from the op-by-op values are checked against the deployment's own
(`eager_output_max_abs_diff`): they agree to the bit on llvm.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tapml_dbg.errors import ModelError, TargetError
from tapml_dbg.frontend.model_loader import load_python_function
from tapml_dbg.frontend.native import NATIVE_FUNC, native_spec
from tapml_dbg.frontend.native_llm import ENTRY, NativeLLM, check_target, native_llm, unroll
from tapml_dbg.model.generation import PREFILL_STEP, GenerationInfo, StepInfo, step_kind
from tapml_dbg.portable import one_line
from tapml_dbg.portable.runner import device_kind, parse_target
from tapml_dbg.record.native import record_model
from tapml_dbg.record.recorder import Progress, RecordResult
from tapml_dbg.trace.schema import META_GENERATION

@dataclass
class Deployment:
    """The module's own greedy generation: the n + 1 chosen tokens, each step's last-position logits."""

    tokens: list[int]
    logits: np.ndarray  # (1, n + 1, vocab)
    seconds: float


def record_native_generation(model_spec: str, out_path: str | Path, target: str, steps: int, *, seed: int = 0,
                             compression: str | None = None, progress: Progress | None = None,
                             window: str | None = None, max_bytes: int | str | None = None) -> RecordResult:
    """Record a prefill and `steps` greedy decode steps of `model_spec`'s native LLM on `target`."""
    started = time.perf_counter()
    np.random.seed(seed)
    spec = native_spec(model_spec)
    native = load_llm(spec, target)
    deployment = deploy(native, target, steps)
    model = unroll(native, deployment.tokens[:steps])
    prompt = native.prompt.shape[1]
    info = GenerationInfo(native.model_class, prompt, [
        StepInfo(k, step_kind(k), 0 if k == PREFILL_STEP else prompt + k - 1, prompt + k, deployment.tokens[k])
        for k in range(steps + 1)])
    meta = {META_GENERATION: info.to_meta(),
            "native": {"entry": ENTRY, "file": spec.rpartition(":")[0] or spec, "functions": native.functions,
                       "cache": native.cache}}
    return record_model(model, spec, out_path, target, lambda: (deployment.seconds, [deployment.logits]),
                        started=started, seed=seed, compression=compression, progress=progress, window=window,
                        max_bytes=max_bytes, meta=meta, result_fields={"generation": info.text})


def load_llm(spec: str, target: str) -> NativeLLM:
    """Call the file's `build_tvm(target)` (or `build_tvm()`) and check the dict it returns."""
    build = load_python_function(spec)
    try:
        takes_target = bool(inspect.signature(build).parameters)
    except (TypeError, ValueError):
        takes_target = False
    try:
        result = build(target) if takes_target else build()
    except Exception as exc:
        raise ModelError(f"{spec}: {NATIVE_FUNC} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(result, dict):
        raise ModelError(f"{spec}: --generate needs {NATIVE_FUNC}() to return a native LLM's dict (mod, params, "
                         f"prompt, functions, cache, kv: docs/native-llm.md), got {type(result).__name__}")
    native = native_llm(result, spec)
    check_target(native, target, spec)
    return native


def deploy(native: NativeLLM, target: str, steps: int) -> Deployment:
    """The module's own greedy generation on `target`, as a deployment drives it."""
    import tvm
    from tvm import relax
    from tvm.runtime import ShapeTuple

    parsed = parse_target(target)
    try:
        executable = tvm.compile(native.mod, target=parsed)
    except Exception as exc:  # noqa: BLE001 - TVM's own errors, one line
        raise TargetError(f"the native LLM does not build for {target}: {one_line(exc)}") from None
    device = tvm.device(device_kind(parsed))
    vm = relax.VirtualMachine(executable, device)
    names = native.functions
    params = [tvm.runtime.tensor(value, device) for _, value in native.params]
    call = tvm.get_global_func
    try:
        cache = vm[names["create_cache"]](*(ShapeTuple([int(value)]) for value in native.cache.values()))
        call("vm.builtin.kv_state_add_sequence")(cache, 0)
    except Exception as exc:  # noqa: BLE001
        raise TargetError(f"the paged KV cache cannot be created on {target} with cache={native.cache}: "
                          f"{one_line(exc)} (check build_tvm()'s 'cache' arguments and the target its kernels were "
                          "made for)") from None
    started = time.perf_counter()
    ids, tokens, logits = native.prompt, [], []
    for step in range(steps + 1):
        func = names["prefill" if step == PREFILL_STEP else "decode"]
        call("vm.builtin.kv_state_begin_forward")(cache, ShapeTuple([0]), ShapeTuple([ids.shape[1]]), None)
        try:
            out = vm[func](tvm.runtime.tensor(ids.astype("int32"), device), cache, *params)
        except Exception as exc:  # noqa: BLE001
            raise TargetError(f"{func} (step {step}) fails on {target}: {one_line(exc)}") from None
        call("vm.builtin.kv_state_end_forward")(cache)
        last = out[0].numpy()[:, -1:, :]  # (logits, cache)
        logits.append(last)
        tokens.append(int(np.nanargmax(last[0, -1])))
        ids = np.array([[tokens[-1]]], dtype="int32")
    device.sync()
    return Deployment(tokens, np.concatenate(logits, axis=1), time.perf_counter() - started)

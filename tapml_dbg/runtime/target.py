"""Target strings → TVM targets and devices, with errors that say what to type instead."""

from __future__ import annotations

import json

from tapml_dbg.errors import TargetError

DEFAULT_TARGET = "llvm"
GPU_KINDS = {"cuda", "rocm", "vulkan", "metal", "opencl", "webgpu"}


def parse_target(text: str):
    """A bare kind (`cuda`), a TVM target string, or a JSON dict such as {"kind":"cuda"}."""
    import tvm

    text = (text or DEFAULT_TARGET).strip()
    try:
        spec = json.loads(text) if text.startswith("{") else text
        return tvm.target.Target(spec)
    except Exception as exc:
        raise TargetError(f"invalid target {text!r}: {str(exc).strip().splitlines()[-1]} "
                          "(use e.g. llvm, cuda, or '{\"kind\":\"cuda\",\"arch\":\"sm_90\"}')") from exc


def target_kind(text: str) -> str:
    return parse_target(text).kind.name


def has_codegen(kind: str) -> bool:
    """Whether this TVM build can generate code for `kind` (libinfo is unreliable in wheels)."""
    import tvm

    name = "target.build.llvm" if kind == "llvm" else f"target.build.{kind}"
    return tvm.get_global_func(name, allow_missing=True) is not None


def local_device(kind: str):
    import tvm

    device = tvm.device("cpu" if kind in ("llvm", "c") else kind, 0)
    if not device.exist:
        raise TargetError(f"no {kind} device on this machine (use --rpc HOST:PORT for a remote one, "
                          "or --compile-only to check code generation)")
    return device

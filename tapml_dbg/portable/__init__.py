"""The portable runtime: tvm + numpy only, shared by the engine and every repro.

`tapml_dbg/portable` is imported by the engine (its worker builds, loads and runs units through
`Runner`; its judge compares through `compare`) and copied verbatim into every dump and carve
directory as `_tapml_repro_lib/`, so repro.py and a carved test_ops.py run the same code without
tapml-dbg or torch installed. Keep it that way: standard library, numpy, tvm (and ml_dtypes, a
dependency of tvm, for bfloat16/float8 data) only; relative imports among its own modules; tvm
imported inside functions, so that comparing arrays does not load it.

  errors      PortableError, TransformFailed (the user's pass raised), one_line
  codec       arrays <-> npz without pickle (raw bits for bfloat16/float8)
  comparison  the compare rule and its wording
  noise       the noise-floor figures (the engine's default rule), for the judge and repros
  screen      the search's sound pass test: values surely within both rules (run in the worker)
  loader      FILE.py[:FUNC] -> the user's function (transforms, model build functions)
  runner      targets, devices (local or RPC), build with the device-code check, Runner
  repro       a repro directory: meta, data, check_op, repro_main
  standalone  `repro.py --tvmscript-only`: the repro as one self-contained script
"""

from .codec import decode_array, dtype_name, encode_array, write_npz
from .comparison import COMPARE_BLOCK, COMPARE_RULE, compare, format_metrics
from .errors import MESSAGE_LIMIT, PortableError, TransformFailed, one_line
from .loader import DEFAULT_FUNC, apply_transform, load_function, require_file, split_spec
from .noise import NOISE_RULE, NoiseFigures, noise_figures
from .repro import (COMPILE_ERROR, DATA_FILE, EXIT_BROKEN, EXIT_OK, EXIT_REPRODUCED, FAIL, FORMAT, FORMAT_VERSION,
                    LIB_PACKAGE, META_FILE, PASS, RUN_ERROR, Data, OpCheck, check_op, describe, load_module,
                    load_transform, op_id, read_meta, repro_main, tvmscript_only)
from .runner import (DEFAULT_TARGET, ENTRY, HOST_KINDS, TARGET_HINT, Runner, build, connect, device_kind, flatten,
                     has_device_module, local_device, parse_target, shared_entry, split_host_port, target_label)

__all__ = [
    "COMPARE_BLOCK", "COMPARE_RULE", "COMPILE_ERROR", "DATA_FILE", "DEFAULT_FUNC", "ENTRY", "DEFAULT_TARGET", "HOST_KINDS", "EXIT_BROKEN", "EXIT_OK",
    "EXIT_REPRODUCED", "FAIL", "FORMAT", "FORMAT_VERSION", "LIB_PACKAGE", "MESSAGE_LIMIT", "META_FILE", "NOISE_RULE", "NoiseFigures", "PASS",
    "RUN_ERROR", "TARGET_HINT", "TransformFailed", "Data", "OpCheck", "PortableError", "Runner", "build", "check_op", "compare",
    "apply_transform", "connect", "decode_array", "describe", "device_kind", "dtype_name", "encode_array", "flatten", "format_metrics",
    "has_device_module", "load_function", "load_module", "load_transform", "local_device", "noise_figures", "one_line", "op_id",
    "parse_target", "read_meta", "repro_main", "require_file", "shared_entry", "tvmscript_only", "split_host_port", "split_spec", "target_label", "write_npz",
]

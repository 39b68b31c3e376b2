"""Import TVM without torch, in a process that does not have torch loaded yet.

`tvm_ffi` imports torch first thing (for a symbol clash seen on Windows only), which costs most of
a TVM import (figures: docs/perf.md). A target worker never uses torch, and a session needs it only for the float64
references of the ops it judges in full, so both import TVM with torch hidden; torch imports as
usual later (a user's transform, the source runner), and a session warms it up in a thread
while its search runs (`warm_up_torch`).

TVMScript's parser calls `inspect.stack()` for every prim_func it parses, which is slow for a
reason of the standard library's own: `cheap_stack_inspection`.
"""

from __future__ import annotations

import _imp
import inspect
import sys
import threading

SOURCELESS_FILES = ("<ast>", "<string>")  # code compiled by TVMScript's evaluator, or exec'd


def import_tvm_without_torch() -> None:
    """Import tvm and tvm.relax with torch hidden (nothing to do when either is loaded already)."""
    cheap_stack_inspection()
    if "tvm" in sys.modules or "torch" in sys.modules:
        return
    sys.modules["torch"] = None  # `import torch` raises ImportError while this is in place
    try:
        import tvm  # noqa: F401
        import tvm.relax  # noqa: F401
    finally:
        del sys.modules["torch"]


def warm_up_torch() -> threading.Thread | None:
    """Import torch in a thread (None when it is loaded already): a search waits on its workers
    anyway, and its first full verdict needs torch. Join the thread before the process exits."""
    if "torch" in sys.modules:
        return None
    thread = threading.Thread(target=_import_torch, name="tapml-torch-import", daemon=True)
    thread.start()
    return thread


def _import_torch() -> None:
    try:
        import torch  # noqa: F401
    except Exception:  # noqa: BLE001 - the session's own import of torch says what is wrong
        pass


def cheap_stack_inspection() -> None:
    """Tell `inspect` that a frame whose file is not on disk has no module, so that `inspect.stack()`
    stops walking all of sys.modules to find that out, once per such frame per call. Once a process
    (a fork inherits it).

    TVMScript calls `inspect.stack()` once per prim_func (the names a kernel captures). A frame of
    frozen code (importlib's under every import, runpy's under a served command) or of code TVM's
    evaluator compiled (`<ast>`) has no file, and `inspect.getmodule` walks sys.modules for it each
    time, to find no module: importing TVM's tensor intrinsics, which a Metal or CUDA build does, took
    22.5 s of CPU, 2.6 s with this."""
    if SOURCELESS_FILES[0] in inspect.modulesbyfile:  # told already, here or in the process this one forked from
        return
    frozen = set(getattr(_imp, "_frozen_module_names", list)())  # loaded or not (3.11+)
    frozen |= {module.__name__ for module in list(sys.modules.values())  # the names they run under
               if getattr(getattr(module, "__spec__", None), "origin", None) == "frozen"}
    for name in (*(f"<frozen {name}>" for name in frozen), *SOURCELESS_FILES):
        inspect.modulesbyfile.setdefault(name, "")  # no module is named "": getmodule answers None, as its walk does

"""Import TVM without torch, in a process that does not have torch loaded yet.

`tvm_ffi` imports torch first thing (for a symbol clash seen on Windows only), which costs most of
a TVM import (figures: docs/perf.md). A target worker never uses torch, and a session needs it only for the float64
references of the ops it judges in full, so both import TVM with torch hidden; torch imports as
usual later (a user's transform, the source runner), and a session warms it up in a thread
while its search runs (`warm_up_torch`).
"""

from __future__ import annotations

import sys
import threading


def import_tvm_without_torch() -> None:
    """Import tvm and tvm.relax with torch hidden (nothing to do when either is loaded already)."""
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

"""Where in the user's files an FX node comes from, read from its `node.meta["stack_trace"]` at record time.

The rule: an op's source location is the innermost frame of its node's stack trace that is in the user's
files (not torch, transformers, site-packages, the Python stdlib or tapml_dbg), else None (a model used
straight from a library has no such frame: a library's own line would not be the user's to fix).
The code line is read from the file now and stored in the trace: replay never reads the model file.
"""

from __future__ import annotations

import functools
import importlib.util
import linecache
import os
import re
import sysconfig
from pathlib import Path

from tapml_dbg.model.graph import SourceLocation
from tapml_dbg.trace.schema import SOURCE_CODE_MAX_CHARS, SOURCE_FILE_MAX_CHARS, SOURCE_UNPRINTABLE

# the packages whose frames are never the user's (beside anything installed in site-packages)
LIBRARY_PACKAGES = ("torch", "transformers", "tapml_dbg")
INSTALLED_DIRS = ("site-packages", "dist-packages")
# one frame of a formatted Python traceback, as torch.export writes node.meta["stack_trace"]
_FRAME = re.compile(r'File "(?P<file>[^"\n]+)", line (?P<line>\d+), in [^\n]*(?:\n(?!\s*File ")(?P<code>[^\n]*))?')
_UNPRINTABLE = re.compile(SOURCE_UNPRINTABLE)


def source_location_of(node, cwd: Path | None = None) -> SourceLocation | None:
    """The FX node's innermost frame in the user's files, its file relative to `cwd` (default: the
    current directory) when under it, else absolute; None when its stack trace has no such frame."""
    stack = (node.meta.get("stack_trace") if node is not None else None) or ""
    return _location(stack, str(cwd or Path.cwd()))


@functools.lru_cache(maxsize=4096)  # the ops of one FX node, and the nodes of one line, share their trace
def _location(stack: str, cwd: str) -> SourceLocation | None:
    for frame in reversed(list(_FRAME.finditer(stack))):
        if not is_user_file(frame["file"]) or _UNPRINTABLE.search(frame["file"]):
            continue
        path, line = Path(os.path.abspath(frame["file"])), int(frame["line"])
        linecache.checkcache(str(path))  # the file as it is now, not as an earlier record read it
        code = linecache.getline(str(path), line) or frame["code"] or ""
        shown = _shown_path(path, Path(os.path.abspath(cwd)))
        if len(shown) <= SOURCE_FILE_MAX_CHARS:  # else not storable: no location rather than a cut path
            return SourceLocation(shown, line, clean_code(code))
    return None


def clean_code(text: str) -> str:
    """One line of code as stored: stripped, control characters as spaces, at most SOURCE_CODE_MAX_CHARS
    (a longer line is cut, ending in "…")."""
    text = _UNPRINTABLE.sub(" ", text).strip()
    return text if len(text) <= SOURCE_CODE_MAX_CHARS else text[:SOURCE_CODE_MAX_CHARS - 1] + "…"


def _shown_path(path: Path, cwd: Path) -> str:
    """As the user spells it: symlinks kept (a linked examples/ stays examples/), relative under `cwd`."""
    return str(path.relative_to(cwd)) if path.is_relative_to(cwd) else str(path)


@functools.lru_cache(maxsize=1024)
def is_user_file(filename: str) -> bool:
    """A real file outside the libraries (LIBRARY_PACKAGES), installed packages and the stdlib."""
    if filename.startswith("<"):  # <string>, <eval_with_key>, <frozen ...>: no file of the user's
        return False
    path = Path(filename).resolve()
    if not path.is_file() or any(part in INSTALLED_DIRS for part in path.parts):
        return False
    return not any(path.is_relative_to(folder) for folder in _library_dirs())


@functools.lru_cache(maxsize=1)
def _library_dirs() -> tuple[Path, ...]:
    folders = {Path(sysconfig.get_paths()[key]).resolve() for key in ("stdlib", "platstdlib")}
    for name in LIBRARY_PACKAGES:
        try:
            spec = importlib.util.find_spec(name)  # finds a top-level package without importing it
        except (ImportError, ValueError):
            continue
        for location in (spec.submodule_search_locations or []) if spec else []:
            folders.add(Path(location).resolve())
    return tuple(folders)

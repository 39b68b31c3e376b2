"""Where an FX node comes from, read from its `node.meta["stack_trace"]` at record time.

The rule: an op's source location is the innermost frame of its node's stack trace that is either in the
user's files (not torch, transformers, site-packages, the Python stdlib or tapml_dbg) or in a library's
model code (an installed package other than torch and tapml_dbg: transformers' `modeling_llama.py`).
A library line carries the user's innermost frame above it, when there is one (the wrapper's
`self.lm(...)`); a model used straight from a library has none. torch's own frames (`F.linear(...)`
inside nn.Linear) are never the line: the caller's line says more. None when no frame qualifies.
torch.export records the frames of module `forward`s and the code they run, not of every helper
function a forward calls: the line of an op computed in such a helper is the forward's line calling it.
The code line is read from the file now and stored in the trace: replay never reads the model file.
"""

from __future__ import annotations

import dataclasses
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
# installed packages whose frames are never an op's line: torch's own modules and functions (the line
# that called them says more), and tapml-dbg's wrappers
NOT_MODEL_CODE = ("torch", "functorch", "tapml_dbg")
INSTALLED_DIRS = ("site-packages", "dist-packages")
# one frame of a formatted Python traceback, as torch.export writes node.meta["stack_trace"]
_FRAME = re.compile(r'File "(?P<file>[^"\n]+)", line (?P<line>\d+), in [^\n]*(?:\n(?!\s*File ")(?P<code>[^\n]*))?')
_UNPRINTABLE = re.compile(SOURCE_UNPRINTABLE)


def source_location_of(node, cwd: Path | None = None) -> SourceLocation | None:
    """The FX node's innermost frame in the user's files or a library's model code (with the user's
    frame above it), a user's file relative to `cwd` (default: the current directory) when under it,
    else absolute; None when its stack trace has no such frame."""
    stack = (node.meta.get("stack_trace") if node is not None else None) or ""
    return _location(stack, str(cwd or Path.cwd()))


@functools.lru_cache(maxsize=4096)  # the ops of one FX node, and the nodes of one line, share their trace
def _location(stack: str, cwd: str) -> SourceLocation | None:
    """The innermost user or library frame; a library's carries the innermost user frame above it."""
    library = None
    for frame in reversed(list(_FRAME.finditer(stack))):
        if _UNPRINTABLE.search(frame["file"]):
            continue
        if is_user_file(frame["file"]):
            path = Path(os.path.abspath(frame["file"]))
            mine = _read(frame, _shown_path(path, Path(os.path.abspath(cwd))))
            if mine is not None:
                return mine if library is None else dataclasses.replace(library, user=mine)
        elif library is None and (package := library_file(frame["file"])) is not None:
            library = _read(frame, package[1], package[0])
    return library


def _read(frame: re.Match, shown: str, library: str | None = None) -> SourceLocation | None:
    """The frame's line of code as the file holds it now (not as an earlier record read it); None when
    the path is too long to store (no location rather than a cut path)."""
    if len(shown) > SOURCE_FILE_MAX_CHARS:
        return None
    path, line = os.path.abspath(frame["file"]), int(frame["line"])
    linecache.checkcache(path)
    code = linecache.getline(path, line) or frame["code"] or ""
    return SourceLocation(shown, line, clean_code(code), library)


@functools.lru_cache(maxsize=1024)
def library_file(filename: str) -> tuple[str, str] | None:
    """(package, path from the folder it is installed in) of a file of an installed library's model code,
    e.g. ("transformers", "transformers/models/llama/modeling_llama.py"); None for the user's files, the
    stdlib, torch and tapml_dbg (NOT_MODEL_CODE)."""
    if filename.startswith("<"):
        return None
    path = Path(filename).resolve()
    if not path.is_file():
        return None
    installed = [k for k, part in enumerate(path.parts) if part in INSTALLED_DIRS]
    if installed:
        relative = path.parts[installed[-1] + 1:]
    else:  # a library of LIBRARY_PACKAGES found outside site-packages (an editable install)
        folder = next((f for f in _package_dirs() if path.is_relative_to(f)), None)
        if folder is None:
            return None
        relative = path.relative_to(folder.parent).parts
    package = relative[0].removesuffix(".py") if relative else ""
    if not package or package in NOT_MODEL_CODE:
        return None
    return package, "/".join(relative)


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
    return tuple(folders | set(_package_dirs()))


@functools.lru_cache(maxsize=1)
def _package_dirs() -> tuple[Path, ...]:
    """The folders of LIBRARY_PACKAGES, wherever they are installed."""
    folders = set()
    for name in LIBRARY_PACKAGES:
        try:
            spec = importlib.util.find_spec(name)  # finds a top-level package without importing it
        except (ImportError, ValueError):
            continue
        for location in (spec.submodule_search_locations or []) if spec else []:
            folders.add(Path(location).resolve())
    return tuple(folders)

"""How the tool's processes import TVM (runtime/tvm_import.py): `inspect.stack()`, which TVMScript's
parser calls once per prim_func, finds the module of a frame with no file on disk without walking
sys.modules, and finds what the walk finds: no module."""

from __future__ import annotations

import importlib
import inspect
import runpy
import sys

from tapml_dbg.runtime import tvm_import


class _CountingDict(dict):
    """inspect's module-to-file cache, counting the lookups of its walk over sys.modules."""

    lookups = 0

    def get(self, *args):
        type(self).lookups += 1
        return super().get(*args)


def _frames_without_files(tmp_path, monkeypatch) -> list:
    """Frames of frozen code (a module imported, a script run by runpy), of code exec'd, and of code
    compiled from an AST."""
    (tmp_path / "captures_its_stack.py").write_text(
        "import sys\nFRAMES = []\nframe = sys._getframe()\nwhile frame:\n"
        "    FRAMES.append(frame)\n    frame = frame.f_back\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("captures_its_stack", None)
    frames = importlib.import_module("captures_its_stack").FRAMES
    frames += runpy.run_path(str(tmp_path / "captures_its_stack.py"))["FRAMES"]  # as a served command runs
    frames.append(eval(compile("sys._getframe()", "<string>", "eval"), {"sys": sys}))
    frames.append(eval(compile("sys._getframe()", "<ast>", "eval"), {"sys": sys}))
    return [frame for frame in frames if frame.f_code.co_filename.startswith("<")]


def test_a_frame_without_a_file_gets_the_walks_module_without_the_walk(tmp_path, monkeypatch):
    frames = _frames_without_files(tmp_path, monkeypatch)
    names = {frame.f_code.co_filename for frame in frames}
    assert {"<frozen importlib._bootstrap>", "<frozen runpy>", "<string>", "<ast>"} <= names

    def modules() -> list:
        return [(inspect.getmodule(frame, frame.f_code.co_filename), inspect.getframeinfo(frame)) for frame in frames]

    monkeypatch.setattr(inspect, "modulesbyfile", {})
    monkeypatch.setattr(inspect, "_filesbymodname", _CountingDict())
    walked = modules()
    assert _CountingDict.lookups >= len(sys.modules)  # each frame walked sys.modules
    assert [module for module, _ in walked] == [None] * len(frames)

    monkeypatch.setattr(inspect, "modulesbyfile", {})
    monkeypatch.setattr(inspect, "_filesbymodname", _CountingDict())
    _CountingDict.lookups = 0
    tvm_import.cheap_stack_inspection()
    assert modules() == walked
    assert _CountingDict.lookups == 0

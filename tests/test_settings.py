"""The `TAPML_*` knobs live in one settings module (tapml_dbg/settings.py), each with a doc line
and a row in docs/settings.md; importing the package changes nothing in the environment, and the
processes tapml-dbg runs set their own defaults (settings.PROCESS_DEFAULTS)."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from conftest import ROOT
from tapml_dbg.engine.stops import Debugger
from tapml_dbg import settings
from tapml_dbg.engine.session import Session
from tapml_dbg.errors import UsageError
from tapml_dbg.runtime import lanes

PACKAGE = ROOT / "tapml_dbg"
KNOB_NAME = re.compile(r"\bTAPML_[A-Z0-9_]+")
# portable/ is copied verbatim into repros and imports nothing of tapml_dbg: a TAPML_ knob it read
# would stay there, listed in settings as documentation only (it reads none today)
ALLOWED = {PACKAGE / "settings.py",
           PACKAGE / "runtime" / "fork_server.py"}  # its clients import nothing of tapml_dbg: TAPML_SERVER read as text


def _clean_environment() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name not in settings.PROCESS_DEFAULTS}


def test_importing_the_package_changes_nothing_in_the_environment():
    code = ("import json, os, sys\nbefore = dict(os.environ)\nimport tapml_dbg, tapml_dbg.settings, tapml_dbg.api\n"
            "after = dict(os.environ)\n"
            "print(json.dumps({k: [before.get(k), after.get(k)] for k in set(before) | set(after)"
            " if before.get(k) != after.get(k)}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_clean_environment(),
                            timeout=300, check=True)
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {}


def test_the_entry_point_sets_the_process_defaults_before_numpy():
    code = ("import os, sys\nfrom tapml_dbg import entry\nsys.argv = ['tapml-dbg', '--version']\n"
            "try:\n    entry.main()\nexcept SystemExit:\n    pass\n"
            "import numpy\nprint(os.environ.get('OPENBLAS_NUM_THREADS'))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_clean_environment(),
                            timeout=300, check=True)
    assert result.stdout.strip().splitlines()[-1] == "1"
    chosen = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True,
                            env=_clean_environment() | {"OPENBLAS_NUM_THREADS": "3"})
    assert chosen.stdout.strip().splitlines()[-1] == "3"  # the user's choice stands


def _environ_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every `os.environ[...]`, `os.environ.get(...)`, `os.getenv(...)` (any call
    or subscript of something named environ or getenv) naming a TAPML_ string, or a module
    constant holding one."""
    constants = {target.id: node.value.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
                 and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
                 for target in node.targets if isinstance(target, ast.Name)}
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call | ast.Subscript)):
            continue
        text = ast.unparse(node.func if isinstance(node, ast.Call) else node.value)
        if not ("environ" in text or "getenv" in text):
            continue
        arguments = node.args if isinstance(node, ast.Call) else [node.slice]
        for argument in arguments:
            value = argument.value if isinstance(argument, ast.Constant) else constants.get(getattr(argument, "id", ""))
            if isinstance(value, str) and KNOB_NAME.fullmatch(value):
                found.append((node.lineno, value))
    return found


def test_only_the_settings_module_reads_a_knob_from_the_environment():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path in ALLOWED:
            continue
        text = path.read_text()
        wrong += [f"{path.relative_to(ROOT)}:{line} reads {name}" for line, name in _environ_reads(ast.parse(text))]
        wrong += [f"{path.relative_to(ROOT)}:{number} names {name} in code"
                  for number, line in enumerate(text.splitlines(), 1) if "environ" in line
                  for name in KNOB_NAME.findall(line.split("#")[0]) if not line.lstrip().startswith(("#", '"'))]
    assert not wrong, "read TAPML_ knobs through tapml_dbg.settings.value:\n" + "\n".join(wrong)


def test_the_check_above_would_see_a_read():
    tree = ast.parse('import os\nX = "TAPML_X"\na = os.environ.get(X, "1")\nb = os.environ["TAPML_Y"]\n'
                     'c = os.getenv("TAPML_Z")\nd = os.environ.get("HOME")\n')
    assert _environ_reads(tree) == [(3, "TAPML_X"), (4, "TAPML_Y"), (5, "TAPML_Z")]


def test_every_knob_the_package_names_is_declared_with_a_doc_line():
    named = {name for path in PACKAGE.rglob("*.py") for name in KNOB_NAME.findall(path.read_text())}
    assert named <= set(settings.KNOBS), f"undeclared knobs: {sorted(named - set(settings.KNOBS))}"
    for knob in settings.knobs():
        assert knob.name.startswith("TAPML_") and knob.name == knob.name.upper()
        for text in (knob.type, knob.default, knob.doc, knob.read):
            assert text.strip() and "\n" not in text and "|" not in text, knob


def test_the_docs_page_lists_exactly_the_knobs():
    page = (ROOT / "docs" / "settings.md").read_text()
    assert settings.table() in page, ("docs/settings.md is out of date: paste "
                                      "`python -c \"from tapml_dbg import settings; print(settings.table(), end='')\"`")
    listed = re.findall(r"^\| `(TAPML_[A-Z0-9_]+)` \|", page, re.M)
    assert sorted(listed) == sorted(settings.KNOBS)
    for name in settings.PROCESS_DEFAULTS:
        assert f"`{name}`" in page


@pytest.mark.parametrize("name, text, expected", [
    (settings.CACHE_DIR, "/scratch/cache", Path("/scratch/cache")),
    (settings.COMPILE_LANES, " 3 ", 3),
    (settings.COMPILE_LANES, "-2", 0),
    (settings.COMPILE_LANES, "", None),
    (settings.DEBUG, "1", True),
    (settings.DEBUG, "yes", False),
    (settings.HISTORY, "~/h", Path("~/h").expanduser()),
    (settings.HOST_OPS, "off", "off"),
    (settings.POISON_PATTERNS, "device hung| |VK_ERROR_X", ["device hung", "VK_ERROR_X"]),
    (settings.SERVER, "1", "1"),
    (settings.SERVER, "yes", "auto"),
    (settings.SIDE_LANE, "0", False),
    (settings.WORKER_GROWTH_MIB, "64", 64.0),
    (settings.WRITE_THREAD, "0", False),
    (settings.ZYGOTE, "0", False),
])
def test_a_knob_set_in_the_environment_is_seen_by_its_accessor(monkeypatch, name, text, expected):
    monkeypatch.setenv(name, text)
    assert settings.value(name) == expected


def test_an_unset_knob_has_its_default(monkeypatch):
    for name in settings.KNOBS:
        monkeypatch.delenv(name, raising=False)
    assert settings.value(settings.CACHE_DIR) == Path.home() / ".cache" / "tapml-dbg"
    assert settings.value(settings.HISTORY) == Path.home() / ".cache" / "tapml-dbg" / "history"
    assert settings.value(settings.COMPILE_LANES) is None  # one per core but one: lanes decides
    assert settings.value(settings.HOST_OPS) == "verify-first"
    assert settings.value(settings.WORKER_GROWTH_MIB) == 512.0
    assert [settings.value(n) for n in (settings.SIDE_LANE, settings.WRITE_THREAD, settings.ZYGOTE)] == [True] * 3
    assert settings.value(settings.DEBUG) is False
    assert settings.value(settings.POISON_PATTERNS) == []
    assert settings.value(settings.SERVER) == "auto"


def test_a_bad_compile_lane_count_is_a_usage_error(monkeypatch):
    monkeypatch.setenv(settings.COMPILE_LANES, "many")
    with pytest.raises(UsageError, match="TAPML_COMPILE_LANES must be a whole number of compile lanes, got 'many'"):
        lanes.default_compile_lanes()


def test_a_child_environment_keeps_the_users_choice():
    child = settings.child_environment({"A": "1"}, TMPDIR="/t")
    assert child == {"A": "1", "TMPDIR": "/t", "OPENBLAS_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE",
                     "TVM_LOG_DEBUG": "0", "TRANSFORMERS_VERBOSITY": "error"}
    assert settings.child_environment({"OPENBLAS_NUM_THREADS": "4"})["OPENBLAS_NUM_THREADS"] == "4"


@pytest.mark.real_zygote
def test_workers_and_the_zygote_get_the_process_defaults_from_a_library_session(traces, monkeypatch):
    """A notebook session (the package imported, no entry point) still starts its workers with one
    OpenBLAS thread, forked from the zygote or not."""
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    trace = traces.get("mlp")
    with Session.open(trace) as session:
        Debugger(session).step(1)
        zygote = session.lanes.zygotes.get()
        worker = psutil.Process(session.pool.lanes[0]._process.popen.pid)
        assert psutil.Process(zygote._popen.pid).environ().get("OPENBLAS_NUM_THREADS") == "1"
        assert worker.environ().get("OPENBLAS_NUM_THREADS") == "1"
    monkeypatch.setenv(settings.ZYGOTE, "0")
    with Session.open(trace) as session:
        Debugger(session).step(1)
        worker = psutil.Process(session.pool.lanes[0]._process.popen.pid)
        assert worker.ppid() == os.getpid() and worker.environ().get("OPENBLAS_NUM_THREADS") == "1"
    assert "OPENBLAS_NUM_THREADS" not in os.environ  # the session's own environment untouched

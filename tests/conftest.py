"""Shared fixtures: example traces recorded once per test session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
FAULTS = ROOT / "tests" / "transforms" / "faults.py"


def run_cli(*args: str, env: dict | None = None, timeout: float = 600, cwd: str | None = None):
    """Run `tapml-dbg ARGS` in a fresh interpreter; returns the CompletedProcess."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "tapml_dbg", *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=cwd)


def fault_transform(folder: Path, kind: str, op: str, **settings) -> str:
    """A `FILE.py:FUNC` transform planting fault `kind` at `op`, self-contained in one file."""
    values = {"op": op, **{k: str(v) for k, v in settings.items()}}
    text = FAULTS.read_text() + f"\n\nSETTINGS = {values!r}\n"
    name = "fault_" + "_".join(f"{k}{v}" for k, v in sorted(values.items()) if k != "op") + f"_{kind}_{op}.py"
    path = folder / _safe(name)
    path.write_text(text)
    return f"{path}:{kind}"


def _safe(name: str) -> str:
    stem = name[:-3]
    return "".join(c if c.isalnum() or c == "_" else "_" for c in stem) + ".py"


class Traces:
    """Records an example the first time a test asks for it."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.paths: dict[str, Path] = {}

    def get(self, example: str, *extra: str) -> Path:
        key = example + "".join(extra)
        if key not in self.paths:
            path = self.folder / f"{example}{abs(hash(extra))}.h5"
            result = run_cli("record", str(EXAMPLES / f"{example}.py"), "-o", str(path), *extra)
            assert result.returncode == 0, result.stderr
            self.paths[key] = path
        return self.paths[key]


@pytest.fixture(scope="session")
def traces(tmp_path_factory) -> Traces:
    return Traces(tmp_path_factory.mktemp("traces"))

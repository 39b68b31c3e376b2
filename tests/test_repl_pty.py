"""The replay REPL in a real pseudo-terminal: prompt, Tab completion, a typo, Ctrl-C, history.

The target compile is made to hang on demand (a transform that waits while a flag file
exists) so that Ctrl-C lands inside a long command deterministically.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pytest

pexpect = pytest.importorskip("pexpect")

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 90  # per expectation: opening a session and starting a worker takes seconds on a busy box

SLOW_TRANSFORM = '''
"""Blocks every target compile while {flag} exists (the REPL pty test cancels it with Ctrl-C)."""
import os
import time


def slow(mod):
    while os.path.exists({flag!r}):
        time.sleep(0.05)
    return mod
'''


@pytest.fixture(scope="module")
def trace(traces) -> Path:
    """examples/mlp.py recorded once per test run (shared by the REPL test files)."""
    return traces.get("mlp")


def test_repl_in_a_pseudo_terminal(trace, tmp_path):
    flag = tmp_path / "hang"
    transform = tmp_path / "slow.py"
    transform.write_text(SLOW_TRANSFORM.format(flag=str(flag)))
    history = tmp_path / "history"
    env = dict(os.environ, TAPML_HISTORY=str(history), TERM="xterm", NO_COLOR="1", PROMPT_TOOLKIT_NO_CPR="1")
    child = pexpect.spawn(sys.executable, ["-m", "tapml_dbg", "replay", str(trace), "--transform",
                                           f"{transform}:slow"],
                          cwd=str(ROOT), env=env, encoding="utf-8", timeout=TIMEOUT_S, dimensions=(40, 120))
    transcript = []
    child.logfile_read = _Collect(transcript)
    try:
        def prompt(op: str) -> None:
            """Wait for `(llvm) #N OP [LAYER]>` (styled, so escape codes sit between the parts)."""
            child.expect(r"\(llvm\)[^\n]*" + re.escape(op) + r"[^\n]*>")
            time.sleep(0.2)  # let prompt-toolkit take the terminal before typing

        child.expect_exact("`help` lists commands")
        prompt("permute")

        child.sendline("step")
        child.expect_exact("isolated")
        prompt("addmm_p0")  # the prompt moved to op #1

        child.send("wh")
        child.send("\t")  # completes to `where`
        time.sleep(0.5)
        child.send("\r")
        child.expect_exact("next op")
        child.expect_exact("(aten.addmm.default) in layer")
        child.expect_exact("last op")
        prompt("addmm_p0")

        child.sendline("stpe")
        child.expect_exact("did you mean `step`?")
        prompt("addmm_p0")

        flag.touch()  # the next compile hangs until Ctrl-C
        child.sendline("step")
        time.sleep(2.0)
        child.sendintr()
        child.expect_exact("cancelled")
        flag.unlink()
        prompt("addmm_p0")  # still at op #1: the cancelled step did not advance
        child.sendline("where")
        child.expect_exact("next op")
        child.expect_exact("addmm_p0")
        prompt("addmm_p0")

        child.sendline("quit")
        child.expect(pexpect.EOF)
    finally:
        if flag.exists():
            flag.unlink()
        child.close(force=True)
    text = "".join(transcript)
    assert child.exitstatus == 0, text
    assert "Traceback" not in text
    assert "unknown command 'stpe'" in text
    saved = history.read_text()
    assert "+step" in saved and "+where" in saved and "+stpe" not in saved  # persistent, typos left out


class _Collect:
    def __init__(self, sink: list):
        self.sink = sink

    def write(self, text: str) -> None:
        self.sink.append(text)

    def flush(self) -> None:
        pass

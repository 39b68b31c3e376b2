"""`tapml-dbg report`: the engine's per-op series, the page, and the page in a real browser.

The browser is headless Chromium driven over the DevTools protocol through a pipe (no extra
package): it opens the page, records console messages, exceptions, log errors and every request,
checks that the page rendered, and takes a screenshot. Skipped when Chromium is not installed
(`.ci/run` installs Debian's `chromium`). `TAPML_SCREENSHOT_DIR=DIR` keeps the screenshots there.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import io
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import EXAMPLES, fresh
from tapml_dbg.api import Replay
from tapml_dbg.engine.report import ErrorReport, LayerBand, MigrationPoint, OpPoint, layer_bands
from tapml_dbg.engine.results import Culprit
from tapml_dbg.judge.compare import Metrics
from tapml_dbg.judge.verdict import Mode, Status, Verdict
from tapml_dbg.model.graph import OpInfo
from tapml_dbg.ui import cli
from tapml_dbg.report.html import page

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
BROWSER_TIMEOUT_S = 60.0
VIEWPORT = (1280, 1400)
MARKUP = "<b>x</b>&[bold]"  # HTML and rich markup: must reach the page as text


def _metrics(rel: float, rtol: float = 1e-4, passed: bool | None = None) -> Metrics:
    return Metrics(max_abs_err=rel, max_rel_err=rel, scale_rel_err=rel, cosine=1.0, mismatched=0, numel=8,
                   passed=rel <= rtol if passed is None else passed, rtol=rtol, atol=1e-6)


def _verdict(index: int, mode: Mode, rel: float, rtol: float) -> Verdict:
    metrics = _metrics(rel, rtol)
    return Verdict(index, f"op{index}", mode, Status.PASS if metrics.passed else Status.FAIL, [metrics])


def verdict_failed(verdict: Verdict) -> bool:
    return verdict.status == Status.FAIL


def hand_built(noise: bool = False, migration: bool = False) -> ErrorReport:
    """Six ops: op 3 fails isolated (the culprit), op 4 crashes, op 0 is exact."""
    points = []
    for index, rel in enumerate([0.0, 1e-7, 2e-7, 1e-2, None, 3e-7]):
        name = MARKUP if index == 3 else f"op{index}"
        iso = (Verdict(index, name, Mode.ISOLATED, Status.CRASH, message="worker died") if rel is None
               else _verdict(index, Mode.ISOLATED, rel, 1e-4))
        prop = _verdict(index, Mode.PROPAGATED, 2e-6 if rel is None else max(rel, 1e-7), 1e-3)
        if noise:  # [8]'s figures: absolute errors against a float64 reference (max_abs_err = rel here)
            for verdict in (iso, prop):
                for m in verdict.metrics:
                    m.source_err, m.noise_bound = 5e-8, 8e-7
            if verdict_failed(iso):
                iso.wrong, iso.evidence = "precision", "explained by float16 accumulation"
        points.append(OpPoint(index, name, "aten.x", "blocks.0" if index < 3 else MARKUP, "float32", iso, prop))
    culprit = Culprit(3, MARKUP, "aten.x", MARKUP, "isolated", _metrics(1e-2), "")
    report = ErrorReport(trace="/tmp/t.h5", target="llvm", points=points,
                         bands=[LayerBand("blocks.0", 0, 2), LayerBand(MARKUP, 3, 5)],
                         summary={"model": "m.py", "num_ops": 6, "complete": True}, culprit=culprit,
                         culprit_source="continue")
    if migration:
        report.migration = [MigrationPoint(0, "none", 0.0, True), MigrationPoint(6, "all", 1e-2, False)]
    return report


# ------------------------------------------------------------------ the page (no engine)
def test_page_is_self_contained_and_escaped():
    text = page(hand_built(), dump_command=f"tapml-dbg dump t.h5 --op 3 -o repro/ # {MARKUP}")
    assert text.startswith("<!DOCTYPE html>") and '<svg id="error-chart"' in text
    assert "<script" not in text and "src=" not in text and "<link" not in text  # nothing to fetch
    assert MARKUP not in text and "&lt;b&gt;x&lt;/b&gt;&amp;[bold]" in text
    assert 'id="culprit"' in text and "tapml-dbg dump t.h5 --op 3 -o repro/" in text
    assert "crash" in text  # op 4's failed run is shown, not dropped
    assert "noise floor" not in text and "Migration" not in text  # neither exists yet


def test_page_shows_the_noise_floor_and_migration_when_the_data_has_them():
    """[8] and [9] fill these fields; the page draws them as soon as they are there."""
    text = page(hand_built(noise=True, migration=True))
    assert "source noise floor" in text and "<th>noise floor</th>" in text and "5.00e-08" in text
    assert "<th>class</th><td>precision" in text and "explained by float16 accumulation" in text
    assert '<table id="migration">' in text and 'id="migration-chart"' in text


def test_layer_bands_pick_the_deepest_level_that_stays_readable():
    ops = [OpInfo(i, f"o{i}", "aten.x", "r", layer) for i, layer in
           enumerate(["a.0.x", "a.0.y", "a.1.x", "", "a.1.y", "b"])]
    assert [(b.path, b.first, b.last) for b in layer_bands(ops)] == [
        ("a.0.x", 0, 0), ("a.0.y", 1, 1), ("a.1.x", 2, 2), ("a.1.y", 4, 4), ("b", 5, 5)]
    assert [(b.path, b.first, b.last) for b in layer_bands(ops, max_bands=4)] == [
        ("a.0", 0, 1), ("a.1", 2, 2), ("a.1", 4, 4), ("b", 5, 5)]


# ------------------------------------------------------------------ the engine's series on a real trace
@pytest.fixture(scope="module")
def demo_pages(demo_session, tmp_path_factory):
    """`tapml-dbg bisect TRACE --report b`, `tapml-dbg report TRACE -o r` and `... -o m --migrate` on the
    README's example, on the shared engine session (every op's verdicts computed once for the three):
    what each printed, and the folders they wrote."""
    folder = tmp_path_factory.mktemp("demo_pages")
    path = fresh(demo_session).reader.path
    printed = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cli, "_open", lambda args, **_: contextlib.nullcontext(Replay(demo_session)))
        for name, argv in (("bisect", ["bisect", str(path), "--report", str(folder / "b")]),
                           ("report", ["report", str(path), "-o", str(folder / "r")]),
                           ("migrate", ["report", str(path), "-o", str(folder / "m"), "--migrate"])):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                assert cli.main(argv) == 0, name
            printed[name] = out.getvalue()
    return path, folder, printed


def test_report_and_bisect_agree_on_the_readme_example(demo_pages):
    """One story: the page's culprit is bisect's, by the rule `continue` stops at."""
    path, folder, printed = demo_pages
    out = printed["bisect"]
    assert "first divergent op: #9 _softmax" in out and "culprit #9 _softmax (isolated)" in out
    text = (folder / "b" / "index.html").read_text()
    assert "First divergent op: <b>#9 _softmax</b>" in text and "bisect (prefix search" in text
    assert f"tapml-dbg dump {path} --op 9 -o repro/" in text


def test_report_migrate_charts_the_output_error_per_step(demo_pages):
    """`report --migrate`: [9]'s curve on the page, the step that offloads the fp16 softmax failing."""
    _path, folder, _printed = demo_pages
    text = (folder / "m" / "index.html").read_text()
    table = text[text.index('<table id="migration">'):]
    table = table[:table.index("</table>")]
    rows = table.split("<tr>")[2:]  # the header, then one row per step
    assert len(rows) == 2 and "pass" in rows[0] and "FAIL" in rows[1], table
    assert 'id="migration-chart"' in text


# ------------------------------------------------------------------ a real browser
def browser() -> str | None:
    return next((found for name in BROWSERS if (found := shutil.which(name))), None)


class DevTools:
    """Chromium's DevTools protocol over `--remote-debugging-pipe` (fd 3 in, fd 4 out, NUL-separated JSON)."""

    def __init__(self, executable: str, profile: Path):
        to_browser, self._write = (_above_four(fd) for fd in os.pipe())  # so `3<&N 4>&M` cannot clobber them
        self._read, from_browser = (_above_four(fd) for fd in os.pipe())
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
                 f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank"]
        # bash, not sh: dash's redirections take one-digit fds only
        command = " ".join([f"exec {executable}", *flags, f"3<&{to_browser}", f"4>&{from_browser}"])
        self.log = profile.with_suffix(".log")  # the browser's own messages, for a failing test to show
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(["bash", "-c", command], pass_fds=(to_browser, from_browser),
                                            stdout=log, stderr=log, start_new_session=True)
        os.close(to_browser)
        os.close(from_browser)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []

    def call(self, method: str, session: str | None = None, **params) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._message()
            if reply.get("id") == self._next_id:
                assert "error" not in reply, reply
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str) -> dict:
        for event in self.events:
            if event.get("method") == method:
                return event
        while True:
            event = self._message()
            self.events.append(event)
            if event.get("method") == method:
                return event

    def _message(self) -> dict:
        deadline = time.monotonic() + BROWSER_TIMEOUT_S
        while b"\0" not in self._buffer:
            assert time.monotonic() < deadline, "the browser stopped answering"
            chunk = os.read(self._read, 1 << 20)
            assert chunk, "the browser exited: " + self.log.read_text(errors="replace")[-2000:]
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def close(self) -> None:
        try:
            os.write(self._write, json.dumps({"id": 0, "method": "Browser.close"}).encode() + b"\0")
            self.process.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass
        if self.process.poll() is None:
            os.killpg(self.process.pid, 9)
            self.process.wait()
        os.close(self._write)
        os.close(self._read)


def _above_four(fd: int) -> int:
    """`fd` moved to a number above 4 (the browser's pipe ends are fds 3 and 4)."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return moved


def open_in_browser(page_path: Path, screenshot: Path, profile: Path) -> dict:
    """Load `page_path`; what rendered, what went wrong, and a PNG screenshot of the first screen."""
    tools = DevTools(browser(), profile)
    try:
        target = tools.call("Target.createTarget", url="about:blank")["targetId"]
        session = tools.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            tools.call(f"{domain}.enable", session)
        width, height = VIEWPORT
        tools.call("Emulation.setDeviceMetricsOverride", session, width=width, height=height, deviceScaleFactor=1,
                   mobile=False)
        tools.call("Page.navigate", session, url=page_path.resolve().as_uri())
        tools.wait_for("Page.loadEventFired")

        def evaluate(expression: str):
            return tools.call("Runtime.evaluate", session, expression=expression, returnByValue=True)["result"].get("value")

        found = {
            "title": evaluate("document.title"),
            "chart": evaluate("(() => { const e = document.getElementById('error-chart'); if (!e) return null;"
                              " const r = e.getBoundingClientRect(); return [r.width, r.height,"
                              " e.querySelectorAll('path, use').length]; })()"),
            "culprit": evaluate("(document.getElementById('culprit') || {}).innerText || ''"),
            "verdict": evaluate("(document.getElementById('verdict') || {}).innerText || ''"),
        }
        shot = tools.call("Page.captureScreenshot", session, format="png")["data"]
        screenshot.write_bytes(base64.b64decode(shot))
        events = tools.events
        found["console_errors"] = [e["params"] for e in events if e.get("method") == "Runtime.consoleAPICalled"
                                   and e["params"].get("type") in ("error", "assert", "warning")]
        found["exceptions"] = [e["params"] for e in events if e.get("method") == "Runtime.exceptionThrown"]
        found["log_errors"] = [e["params"]["entry"] for e in events if e.get("method") == "Log.entryAdded"
                               and e["params"]["entry"].get("level") == "error"]
        found["requests"] = [e["params"]["request"]["url"] for e in events
                             if e.get("method") == "Network.requestWillBeSent"]
        return found
    finally:
        tools.close()


@pytest.mark.skipif(browser() is None, reason="no chromium (`apt-get install -y chromium`; .ci/run does)")
def test_the_report_renders_in_a_real_browser(demo_pages, tmp_path):
    _path, folder, printed = demo_pages
    out = printed["report"]
    assert out.startswith("wrote the report of 19 ops on llvm to ") and "next: tapml-dbg dump" in out
    page_path = folder / "r" / "index.html"
    folder = Path(os.environ.get("TAPML_SCREENSHOT_DIR") or tmp_path)
    screenshot = folder / "report-fp16_memory_attention.png"
    found = open_in_browser(page_path, screenshot, tmp_path / "profile")
    assert found["title"] == f"tapml-dbg report: {EXAMPLES / 'fp16_memory_attention.py'} on llvm"
    width, height, marks = found["chart"]
    assert width > 600 and height > 150 and marks > 20  # drawn, with its series
    assert "#9 _softmax" in found["culprit"] and "tapml-dbg dump" in found["culprit"]
    assert found["verdict"].startswith("First divergent op: #9 _softmax")
    assert found["console_errors"] == [] and found["exceptions"] == [] and found["log_errors"] == []
    assert all(url.startswith(("file:", "data:", "about:")) for url in found["requests"]), found["requests"]
    png = screenshot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000

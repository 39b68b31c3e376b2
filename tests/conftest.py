"""Shared fixtures: example traces recorded once per test session; no process left behind."""

from __future__ import annotations

import compileall
import fcntl
import gc
import hashlib
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

import fork_cli
from tapml_dbg import settings
from tapml_dbg.runtime import fork_server

gc.disable()  # until the test modules are imported: `pytest_collection_finish`
settings.apply_process_defaults()  # the suite's process runs sessions too: as `tapml-dbg` does, before numpy
os.environ[settings.SERVER] = "0"  # a `tapml-dbg serve` left running on this machine serves none of the suite's commands
# torch writes TORCHINDUCTOR_CACHE_DIR into os.environ the first time inductor's cache is asked for (a
# transformers import, a record in a test's own process): a variable the suite's fork server did not
# start with, so every command and session zygote after it ran as a fresh interpreter importing torch
# and TVM again (fork_server.compatible; tests/test_serve.py's forked-from-its-server test failed in a
# full run). Set from the start (torch keeps a value it finds), it is the server's too.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"torchinductor_{os.getuid()}"))
fork_cli.use_zygote_server(fork_cli.SERVER.zygote_executable)  # its sessions' zygotes: tests/fork_cli.py

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
FAULTS = ROOT / "tests" / "transforms" / "faults.py"


def write_bytecode_once() -> None:
    """tapml-dbg's and the examples' bytecode, written once for the run. Each `tapml-dbg` command and
    session zygote the suite starts imports tapml-dbg afresh (its fork server keeps only the libraries
    under it), and where PYTHONDONTWRITEBYTECODE is set (containers set it) none writes the bytecode it
    compiled: each compiled tapml-dbg's ~150 modules from source again, a quarter of the CPU of a file
    of CLI tests (tests/test_bad_input.py: 23.5 s -> 17.5 s user). Python reads bytecode it may not
    write, and a source edited since is compiled again, as ever."""
    for folder in ("tapml_dbg", "examples"):
        compileall.compile_dir(ROOT / folder, quiet=2)


write_bytecode_once()


RUN_MARK = "TAPML_TEST_RUN"  # set for the whole run: every process the suite starts inherits it
# what must not outlive the suite: TVM's RPC servers and trackers (tests/rpc_helpers.py) serve from a
# popen_worker process and fork one per session, and tapml-dbg's own target workers
LEFTOVER_COMMANDS = ("tvm.exec.popen_worker", "tvm.exec.rpc_server", "tvm.exec.rpc_tracker",
                     "tapml_dbg.runtime.worker")
LEFTOVER_GRACE_S = 10.0  # a worker whose session just closed may take a moment to exit


def processes_of_this_run(mark: str) -> list[psutil.Process]:
    """Live processes started (directly or not) by this test run that match LEFTOVER_COMMANDS."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            command = " ".join(process.info["cmdline"] or [])
            if any(name in command for name in LEFTOVER_COMMANDS) and process.environ().get(RUN_MARK) == mark:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@pytest.fixture(scope="session", autouse=True)
def no_process_left_behind():
    """Fails the run when a TVM helper or target worker started by a test outlives the suite's own
    cleanup (every other fixture has been torn down by then), and kills what is left."""
    mark = f"{os.getpid()}-{time.time_ns()}"
    os.environ[RUN_MARK] = mark
    fork_cli.SERVER.environment = dict(os.environ)  # what a test sets for a while is no part of it
    yield
    drifted = environment_drift(dict(os.environ), fork_cli.SERVER.environment)
    fork_cli.SERVER.stop()
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    left = processes_of_this_run(mark)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = processes_of_this_run(mark)
    described = [f"{p.pid} {' '.join(p.info['cmdline'] or [])}" for p in left]
    for process in left:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    assert not left, "processes outlived the test suite (now killed):\n" + "\n".join(described)
    assert not drifted, (f"the test process's environment changed for good in {drifted}: every command and "
                         "session zygote after it ran as a fresh interpreter, not forked from the suite's server "
                         "(set the variable at conftest's start, as TORCHINDUCTOR_CACHE_DIR is)")


def environment_drift(now: dict, at_start: dict) -> list[str]:
    """The variables that differ from the fork server's environment (but those a command reads when it
    runs, fork_server.RUNTIME_ONLY*): a command whose environment differs there is not forked."""
    runtime = (*fork_server.RUNTIME_ONLY_PREFIXES, "PYTEST_")
    return sorted(name for name in set(now) | set(at_start) if now.get(name) != at_start.get(name)
                  and name not in fork_server.RUNTIME_ONLY and not name.startswith(runtime))


def pytest_configure(config):
    # a suite started in the background by a shell without job control (`cmd &` in a script) inherits
    # SIGINT ignored, and Python then installs no KeyboardInterrupt handler, in this process nor in
    # the processes it starts: the Ctrl-C tests would test nothing. Ctrl-C as a user has it:
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    config.addinivalue_line("markers", "real_zygote: sessions start their zygote with a fresh interpreter "
                            "(`python -m tapml_dbg.runtime.zygote`), not forked from tests/fork_cli.py's server")


def pytest_collection_finish(session):
    """What a `tapml-dbg` command imports (torch, TVM, transformers: ~740,000 objects; `entry.command_imports`,
    what the fork server imports too) imported, and with what the test modules imported frozen, out of the
    collector's reach: a test process runs sessions in-process for minutes, and each full collection
    walked all of them again, as did the collections while importing them."""
    from tapml_dbg.entry import command_imports

    command_imports()
    gc.freeze()
    gc.enable()


def pytest_sessionstart(session):
    """A run's controller under pytest-xdist collects nothing: its collector back on at once."""
    if not os.environ.get("PYTEST_XDIST_WORKER") and session.config.getoption("numprocesses", None):
        gc.enable()


@pytest.fixture(autouse=True)
def _zygotes(request):
    """A test marked `real_zygote` (one that looks at the zygote's process) gets the real start-up."""
    if request.node.get_closest_marker("real_zygote") is None:
        yield
        return
    fork_cli.use_real_zygotes()
    try:
        yield
    finally:
        fork_cli.use_zygote_server(fork_cli.SERVER.zygote_executable)


def run_cli(*args: str, env: dict | None = None, timeout: float = 600, cwd: str | None = None):
    """Run `tapml-dbg ARGS` in a process of its own, as `python -m tapml_dbg ARGS` runs it; returns the
    CompletedProcess. The process is forked from this test process's fork server (tests/fork_cli.py:
    torch and TVM imported once, not once a command), or is a fresh interpreter where a fork could
    differ from one."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(fork_cli.SERVER.command(*args), capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=cwd)


def rendered(result) -> str:
    """A result as the command line prints it: its renderer, on a console as the CLI makes one."""
    import io

    from tapml_dbg.ui.console import make_console
    from tapml_dbg.ui.render import render

    buffer = io.StringIO()
    render(result, make_console(buffer))
    return buffer.getvalue()


def load_benchmark(name: str, module_name: str):
    """`benchmarks/NAME.py` as a module (the benchmarks are scripts, not a package), so a test runs
    the very code a benchmark runs."""
    spec = importlib.util.spec_from_file_location(module_name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


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
    """Records an example the first time a test asks for it, once per run: under pytest-xdist the
    workers share one folder, and a lock file per trace makes the first worker record it while the
    others wait for it (each recording is seconds of CPU the two cores cannot spare twice). Tests
    that damage a trace copy it first."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.paths: dict[str, Path] = {}

    def get(self, example: str, *extra: str) -> Path:
        return self.record(str(EXAMPLES / f"{example}.py"), *extra, name=example)[0]

    def record(self, spec: str, *extra: str, name: str) -> tuple[Path, str]:
        """`tapml-dbg record SPEC -o TRACE EXTRA...` (SPEC: `FILE.py[:FUNC]`), once per run: the trace and
        what the record printed. `name` starts the trace's file name (one name for one SPEC)."""
        key = spec + "\0" + "\0".join(extra)
        if key not in self.paths:
            digest = hashlib.sha256("\0".join(extra).encode()).hexdigest()[:12]
            path = self.folder / f"{name}{digest}.h5"
            with open(self.folder / f"{path.name}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
                if not path.exists():
                    partial = path.with_suffix(f".part{os.getpid()}.h5")
                    result = run_cli("record", spec, "-o", str(partial), *extra)
                    assert result.returncode == 0, result.stderr
                    path.with_suffix(".stdout").write_text(result.stdout.replace(str(partial), str(path)))
                    os.replace(partial, path)
            self.paths[key] = path
        return self.paths[key], self.paths[key].with_suffix(".stdout").read_text()


def run_folder(tmp_path_factory, name: str) -> Path:
    """A folder every xdist worker of this run shares (the run's base temp), else this session's own."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder = shared / name
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def traces(tmp_path_factory) -> Traces:
    return Traces(run_folder(tmp_path_factory, "shared-traces"))


# ------------------------------------------------------------------ engine sessions several test files share
PLANTED_OP = "gelu_1"  # op 13 of examples/mlp.py, layer blocks.1: where the REPL and docs tests plant a fault


@pytest.fixture(scope="session")
def planted_faults(tmp_path_factory) -> Path:
    """tests/transforms/faults.py set to plant its faults on PLANTED_OP.

    The compile cache keys a unit by the transform file's text, not by TAPML_FAULT_OP, so the op
    is written into the file (`SETTINGS`): a copy planting on another op gets its own entries.
    """
    path = tmp_path_factory.mktemp("transforms") / "planted_faults.py"
    path.write_text(FAULTS.read_text() + f"\nSETTINGS = {{'op': {PLANTED_OP!r}}}\n")
    return path


@pytest.fixture(scope="session")
def planted_mlp(traces, planted_faults):
    """examples/mlp.py on llvm with `faults.py:scale` on gelu_1 (x1.01): the REPL's and docs/repl.md's
    session. Tests reset it (`Session.reset`, the policy) before use."""
    from tapml_dbg.engine.session import Session

    with Session.open(traces.get("mlp"), transform=f"{planted_faults}:scale") as session:
        yield session


@pytest.fixture(scope="session")
def demo_session(traces):
    """The README's example, examples/fp16_memory_attention.py, on llvm (a real TVM 0.27 divergence at
    op 9 `_softmax`): shared by the REPL, docs and report tests."""
    from tapml_dbg.engine.session import Session

    with Session.open(traces.get("fp16_memory_attention")) as session:
        yield session


def fresh(session):
    """A shared session back at op 0 with the default tolerance policy and no verdicts cached."""
    from tapml_dbg.judge.compare import TolerancePolicy

    session.reset()
    session.verdicts.set_policy(TolerancePolicy())
    return session



# ------------------------------------------------------------------ pytest-xdist: the longest tests first
# Under `-n 2` the run ends when the later worker does: the longest tests start first, and the workers
# steal work from each other, so that neither is left holding a minute-long test while the other idles.
# Seconds from `--durations` of a clean clone with an empty compile cache on 2 cores (2026-12-07, 15:16, nothing
# else running; the tests of at least ~4.5 s). Only tests whose module-scoped fixtures cost nothing (a trace
# from `traces`) are listed, so that moving them costs no second setup.
LONGEST_FIRST_S = {
    "test_transcripts.py::test_every_transcript_is_what_the_tool_prints[native-llm.md]": 33,
    "test_transcripts.py::test_every_transcript_is_what_the_tool_prints[generation.md]": 28,
    "test_transcripts.py::test_every_transcript_is_what_the_tool_prints[dump-example.md]": 15,
    "test_bf16.py::test_a_bf16_lm_records_its_logits_bit_exact_generates_and_every_step_bisects_clean[qwen2]": 15,
    "test_zoo.py::test_fast_subset_passes_every_column": 15,
    "test_bf16.py::test_a_bf16_lm_records_its_logits_bit_exact_generates_and_every_step_bisects_clean[gemma]": 12,
    "test_serve.py::test_served_commands_answer_as_fresh_ones_see_an_edited_pass_and_fall_back": 11,
    "test_transcripts.py::test_every_transcript_is_what_the_tool_prints[migrate.md]": 10,
    "test_serve.py::test_a_command_starts_a_server_for_the_next_which_wait_for_it_and_a_reinstall_stops_it": 10,
    "test_transcripts.py::test_every_transcript_is_what_the_tool_prints[triage.md]": 10,
    "test_host_ops.py::test_fp16_matmul_accumulating_in_fp16_on_llvm_is_found_at_the_matmul": 9,
    "test_transcripts.py::test_every_transcript_is_what_the_tool_prints[reference-target.md]": 9,
    "test_propagated_values.py::test_an_op_has_one_propagated_value_whichever_command_asks[tiny_llama]": 8,
    "test_fix.py::test_fix_on_the_fp16_examples_makes_the_whole_model_pass[fp16_wide_projection]": 7,
    "test_transcripts.py::test_every_transcript_is_what_the_tool_prints[remote.md]": 7,
    "test_native_llm.py::test_the_paged_kv_kernels_are_built_once_per_store_and_a_damaged_one_again": 6,
    "test_family_coverage.py::test_a_bf16_gpt2_cell_names_tvms_layer_norm_that_does_not_build_and_fix_computes_it_in_float32": 6,
    "test_fix.py::test_fix_on_the_fp16_examples_makes_the_whole_model_pass[fp16_stats_pool]": 5,
    "test_transcripts.py::test_every_transcript_is_what_the_tool_prints[diff.md]": 5,
    "test_transcripts.py::test_every_transcript_is_what_the_tool_prints[README.md]": 5,
    "test_transcripts.py::test_every_transcript_is_what_the_tool_prints[fix.md]": 5,
}


def pytest_collection_modifyitems(items):
    """The longest tests first (a stable sort: every other test keeps its place)."""
    items.sort(key=lambda item: -LONGEST_FIRST_S.get(item.nodeid.removeprefix("tests/"), 0))


try:
    from xdist.scheduler import WorkStealingScheduling
except ImportError:  # pytest-xdist absent or older than 3.2: its default scheduling
    WorkStealingScheduling = None

if WorkStealingScheduling is not None:
    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(config, log):
        """`-n N` alone (`--dist load`): each worker takes half the tests, in order, and one that runs
        out takes half of what the other has left; any other `--dist` is xdist's own."""
        if config.getvalue("dist") == "load":
            return WorkStealingScheduling(config, log)
        return None

"""Every `TAPML_*` environment knob tapml-dbg reads: its name, type, default and a line of doc.

Each knob is declared once here (`KNOBS`) and read through one accessor, `value(NAME)`, which looks
at the environment each time it is called: nothing is read or cached when this module is imported,
and importing it (or the package) changes nothing in `os.environ`. A module that keeps a knob's
value in a constant reads it when that module is imported, as the `read` column of
docs/settings.md says (that page is `table()`'s text; tests/test_settings.py keeps the two equal).

`PROCESS_DEFAULTS` are the variables tapml-dbg's own processes set for themselves, not knobs:
the entry points (`tapml-dbg`, `python -m tapml_dbg`) call `apply_process_defaults()` before
anything imports numpy, and the workers and the zygote are started with `child_environment()`.

This module sits at the bottom of the layers (it imports nothing of tapml_dbg). portable/ is
copied verbatim into repros and reads no `TAPML_*` knob.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

CACHE_DIR = "TAPML_CACHE_DIR"
COMPILE_LANES = "TAPML_COMPILE_LANES"
DEBUG = "TAPML_DEBUG"
HISTORY = "TAPML_HISTORY"
HOST_OPS = "TAPML_HOST_OPS"
MEMO = "TAPML_MEMO"
POISON_PATTERNS = "TAPML_POISON_PATTERNS"
SERVER = "TAPML_SERVER"
SIDE_LANE = "TAPML_SIDE_LANE"
WEIGHTS = "TAPML_WEIGHTS"
WEIGHT_CACHE_MIB = "TAPML_WEIGHT_CACHE_MIB"
WEIGHT_REFS = "TAPML_WEIGHT_REFS"
WORKER_GROWTH_MIB = "TAPML_WORKER_GROWTH_MIB"
WRITE_THREAD = "TAPML_WRITE_THREAD"
ZYGOTE = "TAPML_ZYGOTE"

# numpy's OpenBLAS starts a thread per core, and after each call its threads spin for work: the
# session's and each worker's small dot products then burn a core's worth of CPU per thread beside
# the compile lanes (figures: docs/perf.md). One thread unless the user chose; OpenBLAS reads it
# when numpy is first imported, so a process sets it before that. torch's OpenMP threads spin after
# each parallel region too (the source runner's and the recorder's ops, beside the compile lanes):
# passive, they sleep until the next one (libgomp reads it when torch loads it). transformers warns at
# length on stderr and reads its verbosity when imported (a served command's server imported it already).
PROCESS_DEFAULTS = {"OPENBLAS_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "TVM_LOG_DEBUG": "0",
                    "TRANSFORMERS_VERBOSITY": "error"}


@dataclass(frozen=True)
class Knob:
    name: str
    type: str  # what it holds, as the docs say it
    default: str  # as the docs show it
    doc: str  # one line
    read: str  # when it is read, and by which process
    parse: Callable[[str | None], object]  # the environment's text (None: unset) -> the value


def _on_unless_0(text: str | None) -> bool:
    return text != "0"


def _off_unless_1(text: str | None) -> bool:
    return text == "1"


def _server_mode(text: str | None) -> str:
    return text if text in ("0", "1") else "auto"


def _cache_dir(text: str | None) -> Path:
    return Path(text) if text is not None else Path.home() / ".cache" / "tapml-dbg"


def _history(text: str | None) -> Path:
    return Path(text or Path.home() / ".cache" / "tapml-dbg" / "history").expanduser()


def _compile_lanes(text: str | None) -> int | None:
    text = (text or "").strip()
    if not text:
        return None
    try:
        return max(0, int(text))
    except ValueError:
        raise ValueError(f"{COMPILE_LANES} must be a whole number of compile lanes, got {text!r}") from None


def _mib(text: str | None) -> float:
    return float(text if text is not None else "512")


def _weight_cache_mib(text: str | None) -> float:
    try:
        return max(0.0, float(text if text is not None else "0"))
    except ValueError:
        raise ValueError(f"{WEIGHT_CACHE_MIB} must be a number of MiB, got {text!r}") from None


def _host_ops(text: str | None) -> str:
    return text if text is not None else "verify-first"


def _folders(text: str | None) -> list[str]:
    return [os.path.expanduser(folder) for folder in (text or "").split(os.pathsep) if folder.strip()]


def _patterns(text: str | None) -> list[str]:
    return [pattern for pattern in (text or "").split("|") if pattern.strip()]


KNOBS: dict[str, Knob] = {knob.name: knob for knob in (
    Knob(CACHE_DIR, "path", "~/.cache/tapml-dbg",
         "the compile cache: built libraries, their locks, indexes and key ledgers (docs/cache.md)",
         "when runtime.compile_cache is imported (tapml-dbg's start)", _cache_dir),
    Knob(COMPILE_LANES, "count", "one per core but one, at most 16",
         "compile-only worker processes beside the run lanes; 0: compile in the run lanes",
         "by the session, when it makes its lanes", _compile_lanes),
    Knob(DEBUG, "1/0", "0",
         "1: show the traceback of an internal error and the full text behind a one-line error",
         "by the CLI and the REPL, when an error is shown", _off_unless_1),
    Knob(HISTORY, "path", "~/.cache/tapml-dbg/history",
         "the REPL's persistent command history (in memory when unwritable)",
         "when the REPL opens", _history),
    Knob(HOST_OPS, "mode", "verify-first",
         "helper ops computed on the host while recording: verify-first, verify-all or off",
         "when record.host_ops is imported", _host_ops),
    Knob(MEMO, "1/0", "1",
         "0: run every unit; 1: skip units an earlier run on the same trace cleared (the cache's memo/, docs/cache.md)",
         "by each worker, when it starts", _on_unless_0),
    Knob(POISON_PATTERNS, "text", "(none)",
         "more error texts (any case) that retire a worker as a sticky device fault, split at each vertical bar",
         "by the session, each time a unit ends in an error", _patterns),
    Knob(SERVER, "auto/1/0", "auto",
         "0: run each command in a process of its own even when `tapml-dbg serve` serves the cache; 1: use a "
         "server, never start one; auto: a command that imported TVM or torch by itself starts one for the next "
         "(not where CI is set; docs/serve.md)",
         "by `tapml-dbg`, when it starts and as it leaves (runtime/fork_server.py reads it as text: its clients "
         "import no tapml_dbg)", _server_mode),
    Knob(SIDE_LANE, "1/0", "1",
         "0: no side worker beside the lanes (a search then runs its chain in lane 0)",
         "by the session, when a search asks for the side worker", _on_unless_0),
    Knob(WEIGHTS, "folders", "(none)",
         "where to look, by file name, for the checkpoint files a trace references when they are not where they "
         "were recorded (a trace moved to another machine; folders split at the path separator, `:`)",
         "each time a trace's referenced weights are opened", _folders),
    Knob(WEIGHT_CACHE_MIB, "MiB", "0",
         "referenced weights that ops transpose (a linear's weight) a trace reader keeps once read (least recently "
         "used first out), so the weight and its transpose read the checkpoint once; 0: none, a transpose reads "
         "the file again (from the OS's cache: faster than holding the weight); raise it for a checkpoint on slow "
         "storage",
         "each time a trace's referenced weights are opened", _weight_cache_mib),
    Knob(WEIGHT_REFS, "1/0", "1",
         "0: copy every param into the trace, even those loaded from a safetensors checkpoint (a self-contained "
         "trace); 1: reference those (docs/trace-format.md)",
         "by the recorder, when it writes the trace", _on_unless_0),
    Knob(WORKER_GROWTH_MIB, "MiB", "512",
         "memory a worker may grow past what it held after its first unit before a fresh one replaces it",
         "when runtime.executor is imported", _mib),
    Knob(WRITE_THREAD, "1/0", "1",
         "0: the recorder computes statistics and writes the trace inline, not in a writer thread",
         "when record.recorder is imported", _on_unless_0),
    Knob(ZYGOTE, "1/0", "1",
         "0: start each target worker with a fresh interpreter, not forked from the zygote",
         "by the session, each time it starts a worker", _on_unless_0),
)}


def value(name: str, environ: Mapping[str, str] | None = None):
    """Knob `name`'s value now, from `environ` (default: this process's environment)."""
    knob = KNOBS[name]
    return knob.parse((os.environ if environ is None else environ).get(name))


def knobs() -> list[Knob]:
    """Every knob, by name (what docs/settings.md lists)."""
    return [KNOBS[name] for name in sorted(KNOBS)]


def table() -> str:
    """The Markdown table of every knob, as docs/settings.md holds it."""
    rows = ["| knob | type | default | what it does | read |", "|---|---|---|---|---|"]
    rows += [f"| `{k.name}` | {k.type} | {k.default} | {k.doc} | {k.read} |" for k in knobs()]
    return "\n".join(rows) + "\n"


def apply_process_defaults(environ: MutableMapping[str, str] | None = None) -> None:
    """Set `PROCESS_DEFAULTS` where the user set nothing: for a process entry point, before numpy."""
    environ = os.environ if environ is None else environ
    for name, default in PROCESS_DEFAULTS.items():
        environ.setdefault(name, default)


def child_environment(base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """The environment for a process tapml-dbg starts (a worker, the zygote): `base` (default: this
    process's), then `extra`, then `PROCESS_DEFAULTS` where neither set them."""
    env = dict(os.environ if base is None else base, **extra)
    apply_process_defaults(env)
    return env

"""Fuzz the trace boundary: damaged and crafted variants of real traces through the CLI.

Usage: python benchmarks/fuzz.py [--traces PATH|EXAMPLE ...] [--variants N] [--deep N] [--seed S] [--jobs N] [--work DIR]
       (default: the mlp, cnn and tiny_gpt2 examples, recorded into a temporary folder;
       5,000 variants for info, 500 of them also through bisect and replay)

Each variant is one copy of a trace with one kind of damage (`Kind`): a bit flip anywhere, a bit
flip inside a tensor's data, a block overwritten with random bytes or zeros, a truncation, a
structural HDF5 edit (objects deleted or swapped, external and soft links, external storage, an
unknown filter, a 32 GiB dataset, attributes of the wrong type), or an edited op table, graph or
meta (wrong types, missing keys, deep nesting; written back with a valid checksum, as a crafted
file would be). Every variant goes through `info`, `info --json` and `info --verify`; `--deep`
of them also through `bisect --json` and `replay -c`. Each run ends in one `Outcome`: ok, a
one-line error, or a failure: a traceback (or the REPL's "internal error"), a crash (the process
died by a signal), a hang (past the timeout), or `--json` output that is not strict JSON. For
tensor bit flips, `info --verify` must report the damage: a pass there is a miss.

Commands run in-process (`tapml_dbg.ui.cli.main`, output captured) inside one worker process at a
time, so imports are paid once; a worker that dies or stops answering is replaced and its run
counted as a crash or a hang. Variant N of a seed is the same in every run (it has its own random
generator), and every run is appended to `fuzz-log.jsonl` as it ends, so `--work DIR` resumes a
campaign that was stopped. The table (kind x outcome per command), the distinct failure places,
the seed, the machine and the versions are printed at the end (docs/reliability.md).
Run it at low priority on a shared machine: `nice -n 19 python benchmarks/fuzz.py`.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import io
import json
import multiprocessing
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_EXAMPLES = ("mlp", "cnn", "tiny_gpt2")
DEFAULT_VARIANTS = 5000
DEFAULT_DEEP = 500
DEFAULT_SEED = 17
INFO_TIMEOUT_S = 60  # one `info` of a small trace takes well under a second
DEEP_TIMEOUT_S = 300  # one bisect compiles units: seconds, more on a loaded machine
DEEP_NESTING = (100, 2000, 100_000)  # JSON nesting depths a crafted part may hold
REPLAY_COMMANDS = "info; step 2; compare 3; show 1"
MAX_BLOCK = 4096  # largest block a variant overwrites


class Kind(str, enum.Enum):
    BIT_FLIP = "bit flip"
    TENSOR_BIT_FLIP = "tensor bit flip"
    OVERWRITE = "random block"
    ZEROS = "zeroed block"
    TRUNCATE = "truncation"
    STRUCTURE = "HDF5 edit"
    OP_TABLE = "op table edit"
    GRAPH = "graph edit"
    SOURCE_GRAPH = "source graph edit"  # the FX graph (v1.2, torch sources); a graph edit where absent
    META = "meta edit"


class Outcome(str, enum.Enum):
    OK = "ok"
    ERROR = "error line"
    TRACEBACK = "traceback"
    CRASH = "crash"
    HANG = "hang"
    BAD_JSON = "bad json"
    MISSED = "missed"  # info --verify passed a trace whose tensor data was changed


FAILURES = {Outcome.TRACEBACK, Outcome.CRASH, Outcome.HANG, Outcome.BAD_JSON, Outcome.MISSED}


@dataclass
class Result:
    outcome: Outcome
    place: str = ""  # where a traceback came from (file:line function), or what went wrong
    output: str = ""


# ---- the trace's layout -----------------------------------------------------------------------

@dataclass
class Extent:
    """Where one dataset's bytes lie in the file (contiguous datasets only)."""

    name: str
    offset: int
    size: int
    tensor: bool  # under /inputs, /params or /ops (not a /graph text)


def layout(path: Path) -> list[Extent]:
    extents = []

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset) and obj.id.get_offset() is not None and obj.id.get_storage_size():
            extents.append(Extent(name, obj.id.get_offset(), obj.id.get_storage_size(),
                                  not name.startswith("graph/")))

    with h5py.File(path, "r") as handle:
        handle.visititems(visit)
    return extents


def objects(handle: h5py.File) -> tuple[list[str], list[str]]:
    """(groups, datasets) of a trace, by path."""
    groups, datasets = [], []

    def visit(name, obj):
        (groups if isinstance(obj, h5py.Group) else datasets).append(name)

    handle.visititems(visit)
    return groups, datasets


# ---- byte-level damage ------------------------------------------------------------------------

def flip_bit(data: bytearray, rng: random.Random, start: int = 0, end: int | None = None) -> str:
    end = len(data) if end is None else end
    offset = rng.randrange(start, end)
    bit = rng.randrange(8)
    data[offset] ^= 1 << bit
    return f"bit {bit} of byte {offset}"


def block(data: bytearray, rng: random.Random, zeros: bool) -> str:
    size = min(len(data), int(2 ** rng.uniform(0, np.log2(MAX_BLOCK))))
    offset = rng.randrange(0, len(data) - size + 1)
    data[offset:offset + size] = bytes(size) if zeros else rng.randbytes(size)
    return f"{size} bytes at {offset}"


# ---- JSON damage ------------------------------------------------------------------------------

_NEST = "\u0000NEST{}\u0000"  # placeholder for a nesting too deep for json.dumps, spliced into the text


def random_value(rng: random.Random):
    choices = [
        lambda: None, lambda: True, lambda: rng.randint(-5, 5), lambda: -1, lambda: 10**30, lambda: 2**63,
        lambda: float("nan"), lambda: float("inf"), lambda: 1e308, lambda: -0.0, lambda: 0.5,
        lambda: "", lambda: "x" * rng.choice([1, 300, 100_000]), lambda: "ü\u202e\x1b[31m", lambda: "../../etc/passwd",
        lambda: '"""; import os; os.system("echo pwned") #', lambda: "[bold]markup[/]", lambda: "relax.call_py_func",
        lambda: [], lambda: [1, "a", None], lambda: {}, lambda: {"a": 1}, lambda: {"var": "nope"},
        lambda: _NEST.format(rng.choice(DEEP_NESTING)),
    ]
    return rng.choice(choices)()


def _slots(value, path=()):
    """Every (container, key) in a JSON value, for picking a place to edit."""
    out = []
    stack = [value]
    while stack:
        item = stack.pop()
        keys = list(item) if isinstance(item, dict) else range(len(item)) if isinstance(item, list) else []
        for key in keys:
            out.append((item, key))
            if isinstance(item[key], (dict, list)):
                stack.append(item[key])
    return out


def edit_json(value, rng: random.Random) -> tuple[object, str]:
    """One to three random edits of a parsed JSON value; returns (new value, what was done)."""
    done = []
    for _ in range(rng.randint(1, 3)):
        slots = _slots(value)
        if not slots or rng.random() < 0.04:
            value = random_value(rng)
            done.append("document replaced")
            continue
        container, key = rng.choice(slots)
        action = rng.random()
        if action < 0.25 and isinstance(container, dict):
            del container[key]
            done.append(f"deleted {key!r}")
        elif action < 0.35 and isinstance(container, list) and len(container) > 1:
            other = rng.randrange(len(container))
            container[key], container[other] = container[other], container[key]
            done.append(f"swapped [{key}] and [{other}]")
        elif action < 0.42 and isinstance(container, list):
            container.insert(key, container[key])
            done.append(f"duplicated [{key}]")
        else:
            container[key] = random_value(rng)
            done.append(f"[{key!r}] = {_short(container[key])}")
    return value, "; ".join(done)


def dump_json(value, rng: random.Random) -> str:
    text = json.dumps(value)
    while "\\u0000NEST" in text:  # json.dumps escapes the NULs of the placeholder
        start = text.index('"\\u0000NEST')
        end = text.index('\\u0000"', start) + len('\\u0000"')
        depth = int(text[start + len('"\\u0000NEST'):end - len('\\u0000"')])
        text = text[:start] + "[" * depth + "]" * depth + text[end:]
    if rng.random() < 0.05:  # not JSON at all
        cut = rng.randrange(len(text) + 1)
        text = text[:cut] + rng.choice(["", "}", "\x00", "\xff", "]]]"]) + text[cut:]
    return text


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def write_text(handle: h5py.File, path: str, text: str) -> None:
    """Replace a /graph text as a crafted file would: valid checksum, so validation is what catches it."""
    from tapml_dbg.trace import schema as S

    data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    del handle[path]
    ds = handle.create_dataset(path, data=data)
    ds.attrs[S.ATTR_CHECKSUM] = np.uint32(S.checksum(data))


def edit_text_dataset(path: Path, dataset: str, rng: random.Random) -> str:
    with h5py.File(path, "r+") as handle:
        value = json.loads(bytes(handle[dataset][()]).decode())
        value, what = edit_json(value, rng)
        write_text(handle, dataset, dump_json(value, rng))
    return what


def edit_meta(path: Path, rng: random.Random) -> str:
    from tapml_dbg.trace import schema as S

    with h5py.File(path, "r+") as handle:
        value = json.loads(S.decode_str(handle.attrs[S.ATTR_META]))
        if rng.random() < 0.3 and isinstance(value, dict):  # aim at the capture budget, which code reads
            value["capture"] = {"first": 0, "end": 3, "stored": [[0, 2]], "window": "0:3"}
        value, what = edit_json(value, rng)
        handle.attrs[S.ATTR_META] = S.encode_str(dump_json(value, rng))
    return what


# ---- structural HDF5 edits --------------------------------------------------------------------

def structural_edit(path: Path, rng: random.Random, foreign: Path) -> str:
    from tapml_dbg.trace import schema as S

    with h5py.File(path, "r+") as handle:
        groups, datasets = objects(handle)
        tensors = [d for d in datasets if not d.startswith("graph/")]
        target = rng.choice(datasets)
        edits = ["delete", "dataset_to_group", "group_to_dataset", "external_link", "soft_link", "external_storage",
                 "unknown_filter", "huge", "attr_type", "attr_delete", "dtype_attr", "storage_dtype", "rename",
                 "extra_group", "version", "markers", "string_dataset"]
        edit = rng.choice(edits)
        if edit == "delete":
            victim = rng.choice(groups + datasets)
            del handle[victim]
            return f"deleted /{victim}"
        if edit == "dataset_to_group":
            del handle[target]
            handle.create_group(target)
            return f"/{target} became a group"
        if edit == "group_to_dataset":
            victim = rng.choice(groups)
            del handle[victim]
            handle[victim] = np.zeros(3)
            return f"/{victim} became a dataset"
        if edit == "external_link":
            victim = rng.choice(groups + datasets)
            del handle[victim]
            handle[victim] = h5py.ExternalLink(str(foreign), "/" + victim)
            return f"/{victim} became an external link"
        if edit == "soft_link":
            victim = rng.choice(groups + datasets)
            del handle[victim]
            handle[victim] = h5py.SoftLink(rng.choice(["/", "/" + rng.choice(groups + datasets), "/nowhere"]))
            return f"/{victim} became a soft link"
        if edit in ("external_storage", "unknown_filter", "huge", "storage_dtype", "string_dataset"):
            victim = rng.choice(tensors or datasets)
            old = handle[victim]
            data, attrs = old[()], dict(old.attrs)
            del handle[victim]
            if edit == "external_storage":
                raw = path.with_suffix(".raw")
                np.asarray(data).tofile(raw)
                new = handle.create_dataset(victim, shape=np.shape(data), dtype=np.asarray(data).dtype,
                                            external=[(str(raw), 0, max(np.asarray(data).nbytes, 1))])
            elif edit == "unknown_filter":
                new = handle.create_dataset(victim, data=np.asarray(data).reshape(-1) if np.ndim(data) == 0 else data,
                                            chunks=True, compression=32015, allow_unknown_filter=True)
            elif edit == "huge":
                new = handle.create_dataset(victim, shape=(2**32,), dtype="f8", chunks=(1 << 16,))
            elif edit == "storage_dtype":
                new = handle.create_dataset(victim, data=np.asarray(data).astype(rng.choice(["f8", "i1", "u8", "f2"])))
            else:
                new = handle.create_dataset(victim, data=np.array([b"abc", b"def"]))
            for key, value in attrs.items():
                new.attrs[key] = value
            return f"/{victim}: {edit}"
        if edit in ("attr_type", "attr_delete", "dtype_attr"):
            holders = [h for h in ["/"] + groups + datasets if len(handle[h].attrs)]
            holder = handle[rng.choice(holders)]
            name = rng.choice(list(holder.attrs))
            if edit == "attr_delete":
                del holder.attrs[name]
                return f"deleted {holder.name}@{name}"
            if edit == "dtype_attr" and tensors:
                holder = handle[rng.choice(tensors)]
                name = S.ATTR_DTYPE
                holder.attrs[name] = S.encode_str(rng.choice(["bfloat16", "float99", "bool", "int64", "", "ü"]))
                return f"{holder.name}@dtype changed"
            holder.attrs[name] = rng.choice([np.int64(7), np.float64(np.nan), np.arange(3), "vlen string",
                                             np.array([b"a", b"b"]), S.encode_str("x" * 70000), np.int8(-1)])
            return f"{holder.name}@{name} retyped"
        if edit == "rename":
            ops = [g for g in groups if g.startswith("ops/") and len(handle[g])]
            if ops:
                group = handle[rng.choice(ops)]
                first = list(group)[0]
                group.move(first, rng.choice(["7", "x", "01", "-1"]))
                return f"{group.name}/{first} renamed"
            return "nothing to rename"
        if edit == "extra_group":
            where = rng.choice(["ops/999999", "ops/abc", "ops/01", "inputs/junk", "graph/extra"])
            if where not in handle:
                handle.create_group(where)
            return f"added /{where}"
        if edit == "version":
            name = rng.choice([S.ATTR_VERSION_MAJOR, S.ATTR_VERSION_MINOR, S.ATTR_FORMAT])
            handle.attrs[name] = rng.choice([np.int64(-1), np.int64(2**40), "1", np.array([1, 2]), np.int32(3)])
            return f"root @{name} changed"
        ops = [g for g in groups if g.startswith("ops/")]
        group = handle[rng.choice(ops)] if ops else handle
        handle.attrs[S.ATTR_COMPLETE] = np.uint8(rng.choice([0, 1, 7]))
        group.attrs[S.ATTR_DONE] = rng.choice([np.uint8(2), np.uint8(0), np.uint8(1), "1"])
        return f"markers of {group.name} changed"


# ---- variants ---------------------------------------------------------------------------------

@dataclass
class Variant:
    kind: Kind
    trace: str  # the base trace's label
    what: str
    path: Path


def make_variant(base: Path, extents: list[Extent], kind: Kind, rng: random.Random, path: Path,
                 foreign: Path) -> Variant:
    label = base.stem
    if kind in (Kind.STRUCTURE, Kind.OP_TABLE, Kind.GRAPH, Kind.SOURCE_GRAPH, Kind.META):
        shutil.copyfile(base, path)
        try:
            if kind == Kind.STRUCTURE:
                what = structural_edit(path, rng, foreign)
            elif kind == Kind.META:
                what = edit_meta(path, rng)
            else:
                what = edit_text_dataset(path, _text_of(kind, extents), rng)
        except (OSError, KeyError, ValueError, TypeError, RuntimeError) as exc:  # h5py refused the edit itself
            what = f"edit refused by h5py ({type(exc).__name__}); file left as copied"
        return Variant(kind, label, what, path)
    data = bytearray(base.read_bytes())
    if kind == Kind.BIT_FLIP:
        what = flip_bit(data, rng)
    elif kind == Kind.TENSOR_BIT_FLIP:
        extent = rng.choice([e for e in extents if e.tensor] or extents)
        what = f"/{extent.name}: " + flip_bit(data, rng, extent.offset, extent.offset + extent.size)
    elif kind in (Kind.OVERWRITE, Kind.ZEROS):
        what = block(data, rng, zeros=kind == Kind.ZEROS)
    else:
        cut = rng.randrange(len(data))
        data = data[:cut]
        what = f"cut at {cut} of {len(base.read_bytes())} bytes"
    path.write_bytes(bytes(data))
    return Variant(kind, label, what, path)


def _text_of(kind: Kind, extents: list[Extent]) -> str:
    if kind == Kind.OP_TABLE:
        return "graph/op_table"
    if kind == Kind.SOURCE_GRAPH and any(e.name == "graph/source_graph" for e in extents):
        return "graph/source_graph"
    return "graph/ir_json"


# ---- running one command ----------------------------------------------------------------------

def run_in_process(argv: list[str]) -> Result:
    """`tapml-dbg ARGV` through `cli.main` in this process, output captured, judged."""
    from tapml_dbg.ui import cli

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(list(argv))
    except SystemExit as exc:  # argparse
        code = exc.code if isinstance(exc.code, int) else 2
    except Exception as exc:  # noqa: BLE001 - anything that escapes main is what the fuzz looks for
        return Result(Outcome.TRACEBACK, _place(exc), err.getvalue()[-2000:])
    return judge(argv, code, out.getvalue(), err.getvalue())


def judge(argv: list[str], code: int, stdout: str, stderr: str) -> Result:
    text = stdout + stderr
    if "Traceback (most recent call last)" in text or "internal error:" in text:
        line = next((l for l in text.splitlines() if "internal error:" in l or l.startswith("  File")), "")
        return Result(Outcome.TRACEBACK, line.strip()[:160], text[-2000:])
    if "--json" in argv and code == 0:
        try:
            json.loads(stdout, parse_constant=_refuse_constant)
        except ValueError as exc:
            return Result(Outcome.BAD_JSON, str(exc)[:160], stdout[-2000:])
    if code == 0:
        return Result(Outcome.OK)
    errors = [l for l in stderr.splitlines() if l.startswith("error:")]
    if "--verify" in argv and code == 1:
        return Result(Outcome.ERROR, "", text[-2000:])
    if code == 1 and errors:
        return Result(Outcome.ERROR, "", errors[0][:300])
    return Result(Outcome.ERROR if code in (1, 2) else Outcome.TRACEBACK, f"exit {code}", text[-2000:])


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _place(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__)]
    ours = [f for f in frames if "tapml_dbg" in f.filename] or frames
    frame = ours[-1] if ours else None
    where = f"{Path(frame.filename).name}:{frame.lineno} {frame.name}" if frame else "?"
    return f"{type(exc).__name__} at {where}"


def commands(path: Path, deep: bool) -> list[tuple[str, list[str]]]:
    runs = [("info", ["info", str(path)]), ("info --json", ["info", str(path), "--json"]),
            ("info --verify", ["info", str(path), "--verify"])]
    if deep:
        runs += [("bisect --json", ["bisect", str(path), "--json", "--no-sweep"]),
                 ("replay -c", ["replay", str(path), "-c", REPLAY_COMMANDS])]
    return runs


# ---- the worker process -----------------------------------------------------------------------

def _serve(conn) -> None:
    os.environ.setdefault("TVM_LOG_DEBUG", "0")
    while True:
        try:
            argv = conn.recv()
        except EOFError:
            return
        conn.send(run_in_process(argv))


class Worker:
    """One process running commands in-process; replaced when it dies or hangs."""

    def __init__(self):
        self._context = multiprocessing.get_context("spawn")
        self._process = None
        self._conn = None

    def run(self, argv: list[str], timeout: float) -> Result:
        if self._process is None or not self._process.is_alive():
            self._start()
        self._conn.send(argv)
        if not self._conn.poll(timeout):
            self.stop()
            return Result(Outcome.HANG, f"no answer in {timeout:.0f} s")
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            self._process.join(5)
            code = self._process.exitcode
            self._process = None
            return Result(Outcome.CRASH, f"worker exit {code}")

    def _start(self) -> None:
        parent, child = self._context.Pipe()
        self._process = self._context.Process(target=_serve, args=(child,), daemon=True)
        self._process.start()
        child.close()
        self._conn = parent

    def stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.join(5)
            self._process = None


# ---- the campaign -----------------------------------------------------------------------------

def variant_kinds(count: int, rng: random.Random) -> list[Kind]:
    """`count` kinds, as even as possible, shuffled."""
    kinds = [list(Kind)[i % len(Kind)] for i in range(count)]
    rng.shuffle(kinds)
    return kinds


def variant_rng(seed: int, number: int) -> random.Random:
    """Each variant has its own generator: variant N of a seed is the same in any run (and a
    campaign can resume)."""
    return random.Random(seed * 1_000_003 + number)


def campaign(bases: list[Path], count: int, deep: int, seed: int, folder: Path, log: Path, report=print,
             jobs: int = 1) -> float:
    """Run the variants not yet in `log` (JSON lines, one per run, then one per finished variant), on
    `jobs` workers at once (threads, each driving its own worker process and variant file)."""
    layouts = {base: layout(base) for base in bases}
    foreign = folder / "foreign.h5"
    shutil.copyfile(bases[0], foreign)
    done = {entry["n"] for entry in read_log(log) if entry.get("done")}
    started = time.perf_counter()
    deep_every = max(1, count // deep) if deep else 0
    kinds = variant_kinds(count, random.Random(seed))
    todo = [(number, kind) for number, kind in enumerate(kinds) if number not in done]
    lock = threading.Lock()
    finished = [len(done)]

    def run_variant(worker: Worker, slot: int, number: int, kind: Kind, out) -> None:
        base = bases[number % len(bases)]
        variant = make_variant(base, layouts[base], kind, variant_rng(seed, number), folder / f"variant{slot}.h5",
                               foreign)
        is_deep = deep_every and number % deep_every == 0 and number // deep_every < deep
        lines = []
        for label, argv in commands(variant.path, bool(is_deep)):
            timeout = DEEP_TIMEOUT_S if label in ("bisect --json", "replay -c") else INFO_TIMEOUT_S
            began = time.perf_counter()
            result = worker.run(argv, timeout)
            seconds = time.perf_counter() - began
            if label == "info --verify" and kind == Kind.TENSOR_BIT_FLIP and result.outcome == Outcome.OK:
                result = Result(Outcome.MISSED, variant.what)
            failed = result.outcome in FAILURES
            lines.append(json.dumps({"n": number, "trace": variant.trace, "kind": kind.value, "command": label,
                                     "outcome": result.outcome.value, "place": result.place,
                                     "what": variant.what if failed else "",
                                     "output": result.output[-600:] if failed else "",
                                     "s": round(seconds, 3)}))
        lines.append(json.dumps({"n": number, "done": True}))
        with lock:
            out.write("\n".join(lines) + "\n")
            out.flush()
            finished[0] += 1
            if finished[0] % 100 == 0:
                report(f"  {finished[0]}/{count} variants, {time.perf_counter() - started:.0f} s", flush=True)

    def drive(slot: int, out) -> None:
        worker = Worker()
        try:
            for number, kind in todo[slot::jobs]:
                run_variant(worker, slot, number, kind, out)
        finally:
            worker.stop()

    with log.open("a") as out:
        threads = [threading.Thread(target=drive, args=(slot, out), daemon=True) for slot in range(jobs)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return time.perf_counter() - started


def read_log(log: Path) -> list[dict]:
    if not log.exists():
        return []
    entries = []
    for line in log.read_text().splitlines():
        try:
            entries.append(json.loads(line))
        except ValueError:  # the last line of a campaign that was killed mid-write
            continue
    return entries


def summary(entries: list[dict]) -> tuple[dict, dict]:
    """(command, kind) -> outcome counts, and failure place -> an example, over finished variants."""
    finished = {entry["n"] for entry in entries if entry.get("done")}
    table: dict = defaultdict(Counter)
    failures: dict[str, str] = {}
    for entry in entries:
        if entry.get("done") or entry["n"] not in finished:
            continue
        outcome = Outcome(entry["outcome"])
        table[(entry["command"], Kind(entry["kind"]))][outcome] += 1
        if outcome in FAILURES:
            key = f"{entry['command']}: {outcome.value}: {entry['place']}"
            failures.setdefault(key, f"{entry['trace']} {entry['kind']}: {entry['what']}\n{entry['output']}")
    return table, failures


def machine_text() -> str:
    import h5py as h5

    try:
        import tvm
        tvm_version = tvm.__version__
    except ImportError:
        tvm_version = "not installed"
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",)
    return (f"{platform.platform()}, {os.cpu_count()} CPUs (load {load[0]:.2f}), Python {platform.python_version()}, "
            f"h5py {h5.__version__}, HDF5 {h5.version.hdf5_version}, numpy {np.__version__}, tvm {tvm_version}")


def table_text(table: dict, commands_seen: list[str]) -> str:
    lines = []
    outcomes = [o for o in Outcome]
    for label in commands_seen:
        rows = {kind: counts for (cmd, kind), counts in table.items() if cmd == label}
        if not rows:
            continue
        total = Counter()
        for counts in rows.values():
            total.update(counts)
        shown = [o for o in outcomes if total[o]] or [Outcome.OK]
        lines.append(f"\n`{label}`: {sum(total.values())} runs\n")
        lines.append("| kind | " + " | ".join(o.value for o in shown) + " |")
        lines.append("|---|" + "---:|" * len(shown))
        for kind in Kind:
            if kind in rows:
                lines.append(f"| {kind.value} | " + " | ".join(str(rows[kind][o]) for o in shown) + " |")
        lines.append("| **all** | " + " | ".join(f"**{total[o]}**" for o in shown) + " |")
    return "\n".join(lines)


def timing_text(entries: list[dict], labels: list[str]) -> str:
    """Seconds per run of each command (median and slowest), from the log's timed entries."""
    lines = ["| command | runs | median s | slowest s |", "|---|---:|---:|---:|"]
    for label in labels:
        times = sorted(entry["s"] for entry in entries if entry.get("command") == label and "s" in entry)
        if times:
            lines.append(f"| `{label}` | {len(times)} | {times[len(times) // 2]:.2f} | {times[-1]:.1f} |")
    return "\n".join(lines)


def record_examples(names: list[str], folder: Path) -> list[Path]:
    paths = []
    for name in names:
        if Path(name).exists():
            paths.append(Path(name))
            continue
        out = folder / f"{name}.h5"
        if out.exists():  # a resumed campaign fuzzes the very same traces
            paths.append(out)
            continue
        subprocess.run([sys.executable, "-m", "tapml_dbg", "record", str(ROOT / "examples" / f"{name}.py"), "-o",
                        str(out)], check=True, capture_output=True)
        paths.append(out)
    return paths


def main() -> int:
    os.environ.setdefault("TAPML_SERVER", "0")  # each command a process of its own, as measured
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", nargs="+", default=list(DEFAULT_EXAMPLES), help="trace files or example names")
    parser.add_argument("--variants", type=int, default=DEFAULT_VARIANTS)
    parser.add_argument("--deep", type=int, default=DEFAULT_DEEP, help="variants also run through bisect and replay")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--jobs", type=int, default=1, help="variants run at once (one worker process each)")
    parser.add_argument("--work", metavar="DIR", help="keep the traces and the run log (fuzz-log.jsonl) here; the "
                                                      "same command with the same DIR resumes (default: a temp dir)")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        folder = Path(args.work) if args.work else Path(stack.enter_context(tempfile.TemporaryDirectory(
            prefix="tapml-fuzz-")))
        folder.mkdir(parents=True, exist_ok=True)
        bases = record_examples(args.traces, folder)
        sizes = ", ".join(f"{p.stem} ({p.stat().st_size // 1024} KiB, {len(layout(p))} datasets)" for p in bases)
        print(f"fuzzing {sizes}: {args.variants} variants, {args.deep} deep, seed {args.seed}", flush=True)
        log = folder / "fuzz-log.jsonl"
        seconds = campaign(bases, args.variants, args.deep, args.seed, folder, log, jobs=args.jobs)
        table, failures = summary(read_log(log))
    labels = ["info", "info --json", "info --verify", "bisect --json", "replay -c"]
    print(f"\nmachine: {machine_text()}")
    print(f"seed {args.seed}, {args.variants} variants of {len(bases)} traces ({sizes}), {args.deep} deep; "
          f"{seconds:.0f} s in this run")
    print(table_text(table, labels))
    print("\n" + timing_text(read_log(log), labels))
    print(f"\nfailures: {sum(n for counts in table.values() for o, n in counts.items() if o in FAILURES)}")
    for place, example in sorted(failures.items()):
        print(f"  {place}\n    e.g. {example[:600]}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

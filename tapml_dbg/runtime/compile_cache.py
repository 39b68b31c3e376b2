"""Compile a unit for a target, through an on-disk cache keyed by what is compiled.

The key is the structural hash of the unit *after* the user's transform (TVM's own
`structural_hash`, which ignores the names of variables), plus the target, the TVM version and
`BUILD_RECIPE`. So the same op in twelve identical transformer blocks compiles once, and an edited
transform recompiles only the units whose transformed module it changes: a pass that touches one
op kind leaves every other unit's key, and library, as it was.

The build itself is portable's (`tapml_dbg.portable.build`, what `Runner.build` and every repro
run): the target's default Relax pipeline, then the device-code check, so the engine and a repro
can never disagree about whether a unit compiles. A unit that fails the check raises before it
is exported, so the cache holds only units that passed it.

An entry is `KEY.so` (the exported library) and `KEY.json` (its size and sha256), written in that
order under temporary names and renamed into place; an entry is trusted only when both are there
and agree, else it is rebuilt. Two workers that need the same key take the key's lock (one of
`LOCK_STRIPES` lock files): the second waits and finds the first one's library. Runs inside the
worker process: a codegen segfault kills the worker, not the session (and releases its lock).

Small units are also built **together** (`build_together`: a chain's next units on a host target):
one Relax module of several units, one code generation and one link instead of one each (GPT-2's
68 distinct units: 1.3 s together against 3.7 s one by one on one core; docs/perf.md). Each
unit's entry is then named `main_<key>` (`portable.shared_entry`), and each key's `KEY.so` is a hard link
to the one library, with its own record: an entry is read and checked as any other.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

from tapml_dbg import portable, settings
from tapml_dbg.errors import UsageError
from tapml_dbg.model.serialize import function_from_json, without_names
from tapml_dbg.runtime.appended import AppendedLines
from tapml_dbg.runtime.target import parse_target

DEFAULT_CACHE_DIR = settings.value(settings.CACHE_DIR)
KEY_CHARS = 32
BUILD_RECIPE = 2  # bump when portable.build's pipeline changes what the library of a key holds
TOGETHER_MAX_UNITS = 32  # units built into one library at most (the first unit runs once all are built)
# target kinds whose units are built together: host code. On CUDA the same bytes come out (checked on an H100,
# 130 units of three models) at a fraction of the compile time, but a GPU unit's device-code check is per
# unit, and a chain's worker building 32 units in one go serializes what a GPU host's compile lanes build
# side by side (docs/perf.md "Run U")
TOGETHER_KINDS = ("llvm", "c")
LOCK_FOLDER = "locks"
INDEX_FOLDER = "index"  # UnitIndex files: one per (target, transform file text)
LOCK_STRIPES = 256  # keys share this many lock files (a key's lock: its first two hex digits)
ENTRY_META_SUFFIX = ".json"
KERNEL_STORE = "kernels"  # the folder of kernels built at run time (`kernel_store`)
HASH_BLOCK_BYTES = 1 << 20


@dataclass
class CompiledUnit:
    path: Path  # the exported library
    cached: bool  # found in the cache (False: compiled by this call)
    key: str = ""
    elsewhere: bool = False  # not built nor waited for: left to another worker (its library is not there yet)


def cache_key(transformed_module, target) -> str:
    """The key of a transformed unit: its structure (not its variable names), the target, TVM, the recipe."""
    import tvm
    import tvm_ffi

    text = json.dumps({"structure": str(tvm_ffi.structural_hash(transformed_module)), "target": str(target),
                       "tvm": tvm.__version__, "recipe": BUILD_RECIPE}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:KEY_CHARS]


def compile_unit(unit_json: dict, target: str, transform: str | None, cache_dir: Path,
                 export_format: str = "so", rebuild: bool = False, meanwhile=nullcontext,
                 wait: bool = True, build: bool = True) -> CompiledUnit:
    """Compile (or fetch from the cache) one unit; returns the exported library's path.

    `rebuild`: the entry's library failed to load although its checksum matched; build it again.
    `meanwhile()`: a context the wait for another worker's build, or the build, runs in (a
    worker reads ahead in it). `wait=False`: a key whose lock another worker holds is left to it
    (`elsewhere`; a compile lane building ahead goes on to its next unit). `build=False`: a unit
    not in the cache is left to the workers building ahead (`elsewhere`), not built nor waited for.
    Raises TargetError for a bad target string, PortableError for a broken transform or a unit
    without device code, and whatever TVM raises for any other compile failure.
    """
    tvm_target = parse_target(target)
    transformed = _transformed(unit_json, transform)
    entry = CacheEntry(Path(cache_dir), cache_key(transformed.result, tvm_target), export_format)
    if not rebuild and entry.valid():
        return CompiledUnit(entry.library, True, entry.key)
    if not build:
        return CompiledUnit(entry.library, False, entry.key, elsewhere=True)
    with meanwhile(), entry.locked(wait) as lock:
        if not lock.held:
            return CompiledUnit(entry.library, False, entry.key, elsewhere=True)
        if not rebuild and entry.valid():  # another worker built it while this one waited
            return CompiledUnit(entry.library, True, entry.key)
        entry.store(portable.build(transformed.original, tvm_target, transformed.apply))
    return CompiledUnit(entry.library, False, entry.key)


def build_together(unit_jsons: list[dict], target: str, transform: str | None, cache_dir: Path,
                   export_format: str = "so") -> set[str]:
    """Build the units the cache lacks into one library (a key per unit, `portable.shared_entry`
    naming each one's entry), for a TOGETHER_KINDS target; returns the keys it built. Best effort,
    never raises: a unit whose transformed module is more than its one function, whose key another
    worker is building (its lock is held: no waiting here), or a library that fails to build as a
    whole is left out, and the caller builds it alone as usual (a compile error is then that
    unit's own)."""
    try:
        tvm_target = parse_target(target)
        if tvm_target.kind.name not in TOGETHER_KINDS:
            return set()
        wanted: dict[str, tuple[CacheEntry, object]] = {}  # key -> (entry, its function after the transform)
        for unit_json in unit_jsons:
            transformed = _transformed(unit_json, transform).result
            entry = CacheEntry(Path(cache_dir), cache_key(transformed, tvm_target), export_format)
            if len(wanted) < TOGETHER_MAX_UNITS and _one_function(transformed) and not entry.valid():
                wanted.setdefault(entry.key, (entry, transformed[portable.ENTRY]))
    except Exception:  # noqa: BLE001 - a broken transform or target: each unit's own build says so
        return set()
    with _StripeLocks([entry for entry, _func in wanted.values()]) as held:
        built = {key: value for key, value in wanted.items() if key in held and not value[0].valid()}
        if len(built) < 2:  # one alone: the caller's usual build
            return set()
        try:
            _store_together(built, tvm_target, export_format)
        except Exception:  # noqa: BLE001 - one bad unit spoils the lot: each is built alone
            return set()
    return set(built)


def _one_function(mod) -> bool:
    """A transformed unit that is its one Relax function (what can share a module with others)."""
    functions = list(mod.functions_items())
    return len(functions) == 1 and functions[0][0].name_hint == portable.ENTRY


def _store_together(units: dict[str, tuple["CacheEntry", object]], target, export_format: str) -> None:
    """One module of every unit's function (each named `portable.shared_entry`), built once, exported once, and
    linked into the cache under each key, its record beside it, as `CacheEntry.store` writes one."""
    import tvm

    functions = {}
    for key, (entry, func) in units.items():
        name = portable.shared_entry(entry.library)
        functions[name] = func.with_attr("global_symbol", name)
    executable = portable.build(tvm.IRModule(functions), target)
    first = next(iter(units.values()))[0]
    shared = first.folder / f"together.tmp{os.getpid()}.{export_format}"
    try:
        executable.export_library(str(shared), **_link_options(shared.suffix))
        record = {"size": shared.stat().st_size, "sha256": _file_digest(shared)}
        for entry, _func in units.values():
            entry.store_file(shared, record)
    finally:
        shared.unlink(missing_ok=True)


def kernel_store(cache_dir: str | Path) -> str:
    """The cache's folder for kernels a unit builds when it runs (TVM's paged KV cache: portable/paged_kv.py)."""
    return str(Path(cache_dir) / KERNEL_STORE)


def library_key(library: str | Path) -> str:
    """The key of a library the cache holds (`CacheEntry` names it `KEY.so`)."""
    return Path(library).stem


def compile_only(unit_json: dict, target: str, transform: str | None) -> None:
    """Generate code without a device (and without the cache); raises as `compile_unit` does."""
    transformed = _transformed(unit_json, transform)
    portable.build(transformed.original, parse_target(target), transformed.apply)


class CacheEntry:
    """One key's files in the cache folder: the library, its checksum record, its lock."""

    def __init__(self, folder: Path, key: str, export_format: str = "so"):
        self.folder = folder
        self.key = key
        self.library = folder / f"{key}.{export_format}"  # `library_key` reads the key back from the name
        self.meta = folder / f"{key}{ENTRY_META_SUFFIX}"

    def valid(self) -> bool:
        """Both files there and the library's bytes the ones recorded (a torn or damaged entry is not).
        A pair this process checked and that is untouched since (same files, sizes, times) is not
        hashed again: a search loads one library for the same op in every layer."""
        try:
            seen = (_file_identity(self.library), _file_identity(self.meta))
            if _VALID.get(str(self.library)) == seen:
                return True
            record = json.loads(self.meta.read_text())
            good = (record.get("size") == self.library.stat().st_size
                    and record.get("sha256") == _known_digest(self.library, seen[0]))
        except (OSError, ValueError, AttributeError):
            return False
        if good:
            _VALID[str(self.library)] = seen
        return good

    def store(self, executable) -> None:
        """Export the library, then its record, each under a temporary name renamed into place."""
        library_tmp = self._temporary(self.library)
        executable.export_library(str(library_tmp), **_link_options(self.library.suffix))
        self._install(library_tmp, {"size": library_tmp.stat().st_size, "sha256": _file_digest(library_tmp)})

    def store_file(self, library: Path, record: dict) -> None:
        """This key's entry as a hard link to a library built already (with its record), as `store` writes one."""
        library_tmp = self._temporary(self.library)
        library_tmp.unlink(missing_ok=True)
        try:
            os.link(library, library_tmp)
        except OSError:  # a file system without hard links
            shutil.copyfile(library, library_tmp)
        self._install(library_tmp, record)

    @staticmethod
    def _temporary(path: Path) -> Path:
        """`path` under this process's temporary name (executor.py removes a killed worker's `*.tmpPID.*` files)."""
        return path.with_suffix(f".tmp{os.getpid()}{path.suffix}")

    def _install(self, library_tmp: Path, record: dict) -> None:
        """The record written beside it, then both renamed into place, library first."""
        meta_tmp = self._temporary(self.meta)
        meta_tmp.write_text(json.dumps(record))
        self.meta.unlink(missing_ok=True)  # never a new library under the old record
        os.replace(library_tmp, self.library)
        os.replace(meta_tmp, self.meta)

    def locked(self, wait: bool = True):
        return _KeyLock(self.lock_path, wait)

    @property
    def lock_path(self) -> Path:
        return self.folder / LOCK_FOLDER / f"{int(self.key[:2], 16) % LOCK_STRIPES:02x}.lock"


class UnitIndex:
    """What the cache holds for units as the engine builds them, known before any transform runs:
    the key each unit had the last time it ran under the same target and transform file.

    The session cannot compute a key itself (that means running the user's transform, which
    belongs in a worker), so a prepare step would have to start compile workers just to find out
    that everything is cached. The index is a hint only: a transform that imports another file may
    change without its own text changing, and the worker computes the real key whenever it compiles
    or runs a unit; the hint only decides which units are compiled ahead, side by side. Its file is
    named by the target and the transform alone (no TVM import needed to find it: `exists` tells a
    session at open whether compile lanes will be wanted); the TVM version and the build recipe
    are inside, and an index of another version reads as empty.
    """

    def __init__(self, cache_dir: Path, target: str, transform: str | None):
        self.folder = Path(cache_dir)
        self.transform = transform
        identity = json.dumps({"target": target, "transform": transform_identity(transform)}, sort_keys=True)
        self.path = self.folder / INDEX_FOLDER / f"{hashlib.sha256(identity.encode()).hexdigest()[:KEY_CHARS]}.json"
        self.entries: dict[str, str] | None = None

    def unit_id(self, unit_json: dict) -> str:
        return UNIT_IDS.get(unit_json, self.transform)

    def exists(self) -> bool:
        """Whether units ran under this target and transform text before (with any TVM)."""
        return self.path.is_file()

    def cached(self, unit_json: dict) -> bool:
        """Whether the unit's library, as of the last run, is in the cache and intact."""
        return self.holds(self.unit_id(unit_json))

    def holds(self, unit_id: str) -> bool:
        """`cached`, for a unit whose id the caller has already computed."""
        key = self._entries().get(unit_id)
        return bool(key) and CacheEntry(self.folder, key).valid()

    def record(self, pairs) -> None:
        """Remember (unit_json, key) pairs: written whole under a temporary name, renamed into place."""
        entries = dict(self._entries())
        entries.update((self.unit_id(unit), key) for unit, key in pairs if key)
        if entries == self.entries:
            return
        self.entries = entries
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps({"version": _built_by(), "entries": entries}))
            os.replace(tmp, self.path)
        except OSError:
            pass  # a read-only cache: no hint next time, nothing else lost

    def _entries(self) -> dict[str, str]:
        if self.entries is None:
            try:
                data = json.loads(self.path.read_text())
                entries = data.get("entries") if isinstance(data, dict) and data.get("version") == _built_by() else None
                self.entries = {str(k): str(v) for k, v in entries.items()} if isinstance(entries, dict) else {}
            except (OSError, ValueError):
                self.entries = {}
        return self.entries


class KeyLedger:
    """The keys a session's workers computed, shared while its commands run: a worker that computed
    a unit's key (a compile lane building ahead, the sweep, the chain) appends it, and one about to
    run the same unit takes it from here instead of running the transform again (on a fast device
    that was a third of the chain's time an op, while the compile lanes had just done it; docs/perf.md).

    A line is `SCOPE/IDENTITY UNIT_ID KEY`; a worker takes only the lines of the transform text it
    has loaded itself (`transform_identity`) and of its own environment (`scope`: a transform may
    read variables), so an edited pass never borrows a key of the old text. Each line is one
    `O_APPEND` write, whole. Unlike the `UnitIndex` it is no hint: its keys were computed in this
    session, under the same text and environment, as this worker would compute them."""

    def __init__(self, path: str, scope: str = ""):
        self.path = path
        self.scope = scope
        self._lines = AppendedLines(path)
        self._keys: dict[tuple[str, str], str] = {}

    def add(self, identity: str, unit_id: str, key: str) -> None:
        identity = f"{self.scope}/{identity}"
        if (identity, unit_id) in self._keys or not key:
            return
        self._keys[(identity, unit_id)] = key
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, f"{identity} {unit_id} {key}\n".encode())
            finally:
                os.close(fd)
        except OSError:
            pass  # a lost line only costs a worker the transform

    def get(self, identity: str, unit_id: str) -> str | None:
        identity = f"{self.scope}/{identity}"
        if (identity, unit_id) not in self._keys:
            self._read_new()
        return self._keys.get((identity, unit_id))

    def _read_new(self) -> None:
        for line in self._lines.new():
            parts = line.split(" ")
            if len(parts) == 3:
                self._keys.setdefault((parts[0], parts[1]), parts[2])


def environment_scope(environ, ignored=("TMPDIR",)) -> str:
    """A digest of an environment but `ignored` (TMPDIR: each worker's own folder): the ledger's scope."""
    text = json.dumps(sorted((name, value) for name, value in environ.items() if name not in ignored))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _built_by() -> str:
    """The TVM version and build recipe an index's keys were made under."""
    import tvm

    return f"tvm {tvm.__version__}, recipe {BUILD_RECIPE}"


def unit_id(unit_json: dict, transform: str | None) -> str:
    """A unit's id in the index and the ledger. Under a transform, the digest of its JSON: a pass may
    look at names (a planted fault does). Without one, of its JSON without names (`without_names`):
    the key is then its structure's, so the same op in every block, or in every decode step of a
    generation, is one id, keyed once a session instead of once an op."""
    data = unit_json if transform else without_names(unit_json)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:KEY_CHARS]


def _link_options(suffix: str) -> dict:
    """How `export_library` links a unit's objects into a shared library. TVM's default driver is
    g++, which searches libstdc++ that no kernel references (--as-needed drops it): the C driver
    with libm after the objects writes the same bytes (checked for llvm and cuda units, float32 and
    float16) in ~60% of the time (figures: docs/perf.md). TVM's default wherever $CXX or $CC picks
    the compiler, where there is no gcc, or for another format than a shared library."""
    if suffix != ".so" or os.environ.get("CXX") or os.environ.get("CC") or not shutil.which("gcc"):
        return {}
    return {"fcompile": _link_with_gcc}


def _link_with_gcc(output: str, objects: list[str], **kwargs) -> None:
    """Object files only: a unit whose export carries C or C++ source (a BYOC library's module)
    is built by TVM's default driver, which links the C++ runtime that source may need."""
    from tvm.support import cc

    if all(str(path).endswith(".o") for path in objects):
        cc.create_shared(output, [*objects, "-lm"], cc="gcc", **kwargs)
    else:
        cc.create_shared(output, objects, **kwargs)


class UnitIds:
    """`unit_id` by JSON object, each object keyed once: a search sends a unit per op, and the ops of
    every layer and decode step are the few JSON objects the engine keeps per op (never mutated).
    Each object is held while it is remembered (so its `id` is not reused); at most LIMIT of them."""

    LIMIT = 16384

    def __init__(self):
        self._ids: dict[tuple[int, str | None], tuple[dict, str]] = {}

    def get(self, unit_json: dict, transform: str | None) -> str:
        key = (id(unit_json), transform)
        known = self._ids.get(key)
        if known is not None and known[0] is unit_json:
            return known[1]
        if len(self._ids) >= self.LIMIT:
            self._ids.clear()
        found = unit_id(unit_json, transform)
        self._ids[key] = (unit_json, found)
        return found


UNIT_IDS = UnitIds()  # the session process's


def shared_units(request, transform: str | None):
    """A chain or batch as it is sent to a worker: each unit carries its id (computed here, once per
    JSON object: `UnitIds`), and the units of one id hold one JSON object, the first of them (pickled
    once). A request of one unit as it is: its worker keys it (a fused probe's JSON is large)."""
    if not hasattr(request, "units"):
        return request
    first: dict[str, dict] = {}
    units = []
    for unit in request.units:
        found = UNIT_IDS.get(unit.unit_json, transform)
        units.append(replace(unit, unit_json=first.setdefault(found, unit.unit_json), unit_id=found))
    return replace(request, units=units)


def transform_identity(spec: str | None) -> str:
    """The transform as the index (and a session watching for edits) knows it: its function and its
    file's bytes (a missing file: its spec)."""
    if not spec:
        return ""
    path, func = portable.split_spec(spec)
    try:
        return f"{func}:{hashlib.sha256(Path(path).read_bytes()).hexdigest()}"
    except OSError:
        return spec


class _KeyLock:
    """An exclusive `flock` on one stripe file; the kernel drops it when a killed worker dies.
    `wait=False`: not taken when another holds it (`held` False)."""

    def __init__(self, path: Path, wait: bool = True):
        self.path = path
        self.wait = wait
        self.handle = None
        self.held = False

    def __enter__(self) -> "_KeyLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.handle = open(self.path, "a")
        try:
            fcntl.flock(self.handle, fcntl.LOCK_EX if self.wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.held = True
        except BlockingIOError:
            pass
        return self

    def __exit__(self, *exc) -> None:
        if self.held:
            fcntl.flock(self.handle, fcntl.LOCK_UN)
        self.handle.close()


class _StripeLocks:
    """The lock of every entry's stripe that no other worker holds, taken without waiting (each stripe
    once: a process's second `flock` of a file it holds would wait on itself); `held` is the keys
    whose stripe this holds."""

    def __init__(self, entries: list[CacheEntry]):
        self.entries = entries
        self.locks: list[_KeyLock] = []
        self.held: set[str] = set()

    def __enter__(self) -> set[str]:
        stripes: dict[Path, _KeyLock] = {}
        for entry in self.entries:
            path = entry.lock_path
            if path not in stripes:
                lock = stripes[path] = _KeyLock(path, wait=False).__enter__()
                self.locks.append(lock)
            if stripes[path].held:
                self.held.add(entry.key)
        return self.held

    def __exit__(self, *exc) -> None:
        for lock in self.locks:
            lock.__exit__()


_VALID: dict[str, tuple] = {}  # library path -> (library, record) file identities when last found valid
_DIGESTS: dict[tuple, str] = {}  # a library file's identity -> its sha256 (the keys built together share one)


def _file_identity(path: Path) -> tuple:
    info = path.stat()
    return info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns


def _known_digest(path: Path, identity: tuple) -> str:
    """`_file_digest`, once per file (by inode, size and times): the keys built together are one file."""
    if identity not in _DIGESTS:
        _DIGESTS[identity] = _file_digest(path)
    return _DIGESTS[identity]


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(HASH_BLOCK_BYTES), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class _Transformed:
    """A unit before and after the user's transform (applied once: the key hashes its result)."""

    original: object
    result: object

    def apply(self, _mod):
        """What portable.build applies as the transform: the result already computed (it checks its type)."""
        return self.result


def _transformed(unit_json: dict, transform: str | None) -> _Transformed:
    import tvm

    mod = tvm.IRModule({portable.ENTRY: function_from_json(unit_json)})
    user_pass = load_transform(transform)
    return _Transformed(mod, portable.apply_transform(user_pass, mod) if user_pass is not None else mod)


def load_transform(spec: str | None):
    """The user's `FILE.py:FUNC` pass, through portable's loader (the one a repro uses).

    The loader keeps one module per version of the file's text, so an edited pass is reloaded
    rather than applied stale.
    """
    if not spec:
        return None
    path, func = portable.split_spec(spec)
    try:
        return portable.load_function(path, func, what="transform")
    except portable.PortableError as exc:  # the user's file: a user error, one line
        raise UsageError(str(exc)) from exc

"""What earlier runs on a trace established, kept so that a search after a pass edit starts where it changed something.

An edited pass changes the keys of a few units; every other unit computes what it computed before.
Two records, in the compile cache's folder under `memo/<trace identity>/`, let a worker skip them:
- **cleared**: an isolated unit (fed recorded values only) whose value cleared the screen, by a
  digest of its op, its library key, its inputs and the screen rule: a later sweep that meets the
  same digest clears the op without compiling or running it (`cleared-*.txt`, one line a unit);
- **checkpoints**: a screening chain's live values at a position (the values a later unit reads),
  by a digest of everything before it: each unit's op, key, inputs, and whether it was screened or
  accepted, every screened one having cleared. A later chain whose units up to there have the same
  digest starts from the latest such checkpoint (`chain-<digest>.npz`, plain arrays, no pickle),
  which also names the ops before it whose values cleared the isolated screen (`cleared_before`:
  a bisect's sweep does not run those alone, runtime/chain_log.py).
And one note for the session's scheduling: whether the last search's chain found its divergence
(`search-<salt>.json`; `runtime/overlap.py:SearchOverlap`).
The trace's identity is its file's (path, device, inode, size, modification time): a trace written
again is another trace. The digests also hold the target's device (`TargetSpec`: target, RPC
server or tracker and key) and the environment the workers run in (a pass may read variables).

Sound as far as a unit's outputs are a function of its library and its inputs: deterministic
kernels (a nondeterministic one cleared once is taken as cleared), and no runtime behaviour
outside the library that changes while its key does not (a packed function the pass registers and
the unit calls at run time). `TAPML_MEMO=0` turns it off; `memo/` may be deleted at any time.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from pathlib import Path

import numpy as np

from tapml_dbg import settings
from tapml_dbg.portable.codec import decode_array, encode_array, write_npz
from tapml_dbg.runtime.compile_cache import environment_scope

MEMO_FOLDER = "memo"
FORMAT = 1  # bump when what a digest covers changes
DIGEST_CHARS = 32
CHECKPOINTS_PER_CHAIN = 32  # a chain saves its live values about this many times along the way ...
CHECKPOINT_MIN_SPACING = 8  # ... but not more often than every this many units
CHECKPOINT_MAX_BYTES = 64 * 2**20  # live values bigger than this are not saved (a position further on may be smaller)
CHAIN_CHECKPOINT_BYTES = 512 * 2**20  # what one chain saves in all
TRACE_MEMO_BYTES = 2 * 2**30  # a trace's checkpoints past this: the oldest are removed
# variables that say nothing of what a unit computes: the shell's own, the cache's folder (the memo lives in it),
# TAPML_SERVER (set to 0 in a command `tapml-dbg serve` forked: which process runs it, not what it runs), and
# TRANSFORMERS_VERBOSITY (the CLI quiets transformers' logging with it: a bisect by the CLI and one by the
# API must share what either established), and tapml's knobs of how work is scheduled and kept (the memo
# itself turned on by name, lanes, side worker, zygote, write thread, history, debug text, worker recycling)
VOLATILE_VARIABLES = ("TMPDIR", "PWD", "OLDPWD", "SHLVL", "_", "TAPML_CACHE_DIR", "TAPML_SERVER",
                      "TRANSFORMERS_VERBOSITY", "OMP_WAIT_POLICY", settings.MEMO, settings.COMPILE_LANES, settings.SIDE_LANE,
                      settings.ZYGOTE, settings.WRITE_THREAD, settings.HISTORY, settings.DEBUG,
                      settings.WORKER_GROWTH_MIB)
SCREENED, ACCEPTED, UNSCREENED = "s", "a", "u"  # how a chain treated a unit (part of its digest)


def checkpoint_positions(units: int) -> frozenset[int]:
    """Where a chain of `units` units saves its live values (about CHECKPOINTS_PER_CHAIN of them)."""
    every = max(CHECKPOINT_MIN_SPACING, -(-units // CHECKPOINTS_PER_CHAIN))
    return frozenset(range(every, units, every))


def trace_identity(trace_path: str) -> str:
    """The trace file as it is now: written again (or replaced), it is another trace."""
    real = os.path.realpath(trace_path)
    info = os.stat(real)
    text = json.dumps([real, info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns])
    return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]


def _digest(parts) -> str:
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:DIGEST_CHARS]


def inputs_text(inputs: list[tuple]) -> list:
    """A unit's input references as digest text; an array handed by value by its bytes."""
    text = []
    for ref in inputs:
        if ref[0] == "value":
            array, name = encode_array(ref[1])
            text.append(["value", name, list(array.shape), hashlib.sha256(array.tobytes()).hexdigest()])
        else:
            text.append(list(ref))
    return text


class RunMemo:
    """One trace's memo on one target, in one worker."""

    def __init__(self, folder: Path, salt: str):
        self.folder = folder
        self.salt = salt
        self._cleared: dict[str, int] | None = None  # digest -> when recorded (ns), read on first use
        self._checkpoints: set[str] | None = None
        self._cleared_file = None
        self.saved_bytes = 0  # by this process's current chain (`start_chain` resets it)
        self.search_started_ns = 0  # when the current search began (`begin_request`): later records are its own

    @classmethod
    def open(cls, cache_dir: str, trace_path: str, spec) -> "RunMemo | None":
        """The trace's memo, or None: turned off, no cache folder, or a trace that cannot be looked at."""
        if not cache_dir or not settings.value(settings.MEMO):
            return None
        try:
            identity = trace_identity(trace_path)
        except OSError:
            return None
        device = [spec.target, spec.rpc, spec.tracker, spec.key]
        salt = _digest([FORMAT, device, environment_scope(os.environ, ignored=VOLATILE_VARIABLES)])
        return cls(Path(cache_dir) / MEMO_FOLDER / identity, salt)

    # -- cleared isolated units ----------------------------------------------------------
    def unit_digest(self, name: str, key: str, inputs: list[tuple], rule) -> str:
        return _digest([self.salt, "isolated", repr(rule), name, key, inputs_text(inputs)])

    def any_cleared(self) -> bool:
        return bool(self._cleared_digests())

    def cleared(self, digest: str) -> bool:
        return digest in self._cleared_digests()

    def earlier(self, digest: str) -> bool:
        """Whether a record (a cleared unit, a checkpoint) was made before the current search began: a
        chain run again within one search resumes from that search's own checkpoint, which no earlier
        run gave ("N unit run(s) not made again" counts only what earlier runs gave)."""
        made = self._cleared_digests().get(digest)
        if made is None:
            try:
                made = self._checkpoint_path(digest).stat().st_mtime_ns
            except OSError:
                return False
        return made < self.search_started_ns

    def begin_search(self) -> None:
        """A search begins (the engine's side): what is recorded from now on is its own."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._started_path().write_text(str(time.time_ns()))
        except OSError:
            return

    def begin_request(self) -> None:
        """A worker's chain or batch begins: when did its search begin (0: no search noted, nothing earlier)."""
        try:
            self.search_started_ns = self._started_path().stat().st_mtime_ns
        except OSError:
            self.search_started_ns = 0

    def _started_path(self) -> Path:
        return self.folder / f"started-{self.salt}"

    def _cleared_digests(self) -> dict[str, int]:
        """Every process's cleared lines, read once: digest -> when its file was last written (ns)."""
        if self._cleared is None:
            self._cleared = {}
            for path in self.folder.glob("cleared-*.txt"):
                try:
                    lines = path.read_text(errors="replace").split()
                    made = path.stat().st_mtime_ns
                except OSError:
                    continue
                for line in lines:
                    if len(line) == DIGEST_CHARS:
                        self._cleared[line] = min(made, self._cleared.get(line, made))
        return self._cleared

    def add_cleared(self, digest: str) -> None:
        """Appended to this process's own file, one line (a torn line matches no digest)."""
        try:
            if self._cleared_file is None:
                self.folder.mkdir(parents=True, exist_ok=True)
                self._cleared_file = open(self.folder / f"cleared-{os.getpid()}-{uuid.uuid4().hex[:8]}.txt", "a")
            self._cleared_file.write(digest + "\n")
            self._cleared_file.flush()
        except OSError:
            return
        if self._cleared is not None:
            self._cleared.setdefault(digest, time.time_ns())

    # -- chain checkpoints -------------------------------------------------------------------
    def chain_digest(self, rule) -> str:
        """The digest a screening chain starts from (its position 0)."""
        return _digest([self.salt, "chain", repr(rule)])

    @staticmethod
    def step(previous: str, name: str, key: str, inputs: list[tuple], treated: str) -> str:
        """The digest after one more unit (`treated`: SCREENED, ACCEPTED or UNSCREENED)."""
        return _digest([previous, name, key, inputs_text(inputs), treated])

    def has_checkpoint(self, digest: str) -> bool:
        return digest in self._checkpoint_digests()

    def any_checkpoint(self) -> bool:
        return bool(self._checkpoint_digests())

    def _checkpoint_digests(self) -> set[str]:
        """The checkpoints in the folder, listed once (again after one was removed)."""
        if self._checkpoints is None:
            try:
                self._checkpoints = {path.stem.removeprefix("chain-") for path in self.folder.glob("chain-*.npz")}
            except OSError:
                self._checkpoints = set()
        return self._checkpoints

    def load(self, digest: str) -> dict[str, list[np.ndarray]] | None:
        """The live values saved under `digest`; None (and the file removed) when it cannot be read."""
        path = self._checkpoint_path(digest)
        try:
            with np.load(path, allow_pickle=False) as archive:
                manifest = json.loads(bytes(archive["manifest"]).decode())
                values = {name: [decode_array(archive[f"v{index + i}"], dtype) for i, dtype in enumerate(dtypes)]
                          for name, index, dtypes in manifest}
        except Exception:  # noqa: BLE001 - any damage (a torn zip, a bad manifest, a wrong dtype): a miss
            path.unlink(missing_ok=True)
            self._checkpoints = None
            return None
        return values

    def cleared_before(self, digest: str, rule: str) -> list[str] | None:
        """The ops before checkpoint `digest` whose values cleared the isolated screen `rule` (its repr),
        as the chain that saved it found; None when it did not say, or said it for another rule."""
        try:
            with np.load(self._checkpoint_path(digest), allow_pickle=False) as archive:
                saved_rule, names = json.loads(bytes(archive["cleared"]).decode())
        except Exception:  # noqa: BLE001 - none saved, or unreadable: nothing is known
            return None
        return [str(name) for name in names] if saved_rule == rule and isinstance(names, list) else None

    def start_chain(self) -> None:
        """A new chain: CHAIN_CHECKPOINT_BYTES are its own to save; the trace's oldest checkpoints
        go first if the ones before it left more than TRACE_MEMO_BYTES."""
        self.saved_bytes = 0
        self._prune()

    def save(self, digest: str, values: dict[str, list[np.ndarray]],
             cleared: tuple[str, list[str]] | None = None) -> bool:
        """Save live values under `digest` (written under a temporary name, renamed into place); False
        when they are too big for one checkpoint or for what this chain may still save. `cleared`:
        (an isolated screen rule, the ops before it whose values cleared it), for `cleared_before`."""
        size = sum(array.nbytes for arrays in values.values() for array in arrays)
        if size > CHECKPOINT_MAX_BYTES or self.saved_bytes + size > CHAIN_CHECKPOINT_BYTES:
            return False
        path = self._checkpoint_path(digest)
        temporary = path.with_suffix(f".tmp{os.getpid()}.npz")
        manifest, arrays = [], []
        for name, outputs in values.items():
            encoded = [encode_array(array) for array in outputs]
            manifest.append([name, len(arrays), [dtype for _array, dtype in encoded]])
            arrays += [array for array, _dtype in encoded]
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            text = np.frombuffer(json.dumps(manifest).encode(), dtype=np.uint8)
            notes = [("cleared", np.frombuffer(json.dumps(list(cleared)).encode(), dtype=np.uint8))] if cleared else []
            write_npz(str(temporary), [("manifest", text)] + notes
                      + [(f"v{i}", array) for i, array in enumerate(arrays)])
            os.replace(temporary, path)
        except (OSError, ValueError):
            temporary.unlink(missing_ok=True)
            return False
        self.saved_bytes += size
        if self._checkpoints is not None:
            self._checkpoints.add(digest)
        return True

    def _checkpoint_path(self, digest: str) -> Path:
        return self.folder / f"chain-{digest}.npz"

    # -- the last search -----------------------------------------------------------------------
    def last_search(self) -> dict | None:
        """What the last search on this trace and device noted (`note_search`), or None (none, or unreadable)."""
        try:
            noted = json.loads(self._search_path().read_text())
        except (OSError, ValueError):
            return None
        return noted if isinstance(noted, dict) else None

    def note_search(self, chain_found: bool) -> None:
        """Note whether this search's per-op chain found the divergence (renamed into place: a reader
        sees the last note or the one before)."""
        path = self._search_path()
        temporary = path.with_suffix(f".tmp{os.getpid()}")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            temporary.write_text(json.dumps({"chain_found": bool(chain_found)}))
            os.replace(temporary, path)
        except OSError:
            temporary.unlink(missing_ok=True)

    def _search_path(self) -> Path:
        return self.folder / f"search-{self.salt}.json"

    def _prune(self) -> None:
        """The oldest checkpoints go once the trace's exceed TRACE_MEMO_BYTES."""
        try:
            files = [(info.st_mtime_ns, info.st_size, path) for path in self.folder.glob("chain-*.npz")
                     for info in [path.stat()]]
        except OSError:
            return
        total = sum(size for _time, size, _path in files)
        for _time, size, path in sorted(files):
            if total <= TRACE_MEMO_BYTES:
                break
            path.unlink(missing_ok=True)
            total -= size
            self._checkpoints = None

    def close(self) -> None:
        if self._cleared_file is not None:
            self._cleared_file.close()
            self._cleared_file = None

"""Writing a repro directory: the output folder, the shared lib, the data file, the transform copy."""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
from pathlib import Path

from tapml_dbg import __version__
from tapml_dbg import portable as lib
from tapml_dbg.errors import UsageError

LIB_SOURCE = Path(lib.__file__).parent  # the portable package, copied whole as LIB_PACKAGE
TRANSFORM_DIR = "transform"
WRITTEN_WITH = {"dump": "dumped_versions", "carve": "carved_versions"}  # meta key of the versions that wrote it
OLD_LIB_FILE = "_tapml_repro_lib.py"  # the one-file lib of earlier repros: a re-dump removes it
# files and folders a dump or carve writes; a re-dump into the same folder replaces exactly these
OWNED = ("README.md", "repro.py", "module.py", "modules", "test_ops.py", "conftest.py", "pytest.ini",
         lib.LIB_PACKAGE, OLD_LIB_FILE, lib.META_FILE, lib.DATA_FILE, TRANSFORM_DIR, "__pycache__")

_ENV_PATTERNS = (r"os\.environ\[\s*['\"](\w+)['\"]", r"os\.environ\.get\(\s*['\"](\w+)['\"]",
                 r"os\.getenv\(\s*['\"](\w+)['\"]")


def prepare_dir(path: str | Path) -> Path:
    """An empty folder, or one a previous dump/carve wrote (its files are replaced)."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{folder} exists and is not a directory; choose another -o DIR")
    if folder.is_dir() and any(folder.iterdir()):
        if not (folder / lib.META_FILE).is_file() or not _is_repro_meta(folder / lib.META_FILE):
            raise UsageError(f"{folder} is not empty and holds no tapml-dbg repro; choose a new -o DIR")
        for name in OWNED:
            target = folder / name
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _is_repro_meta(path: Path) -> bool:
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("format") == lib.FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def lib_files() -> list[Path]:
    """The portable package's modules, as a repro gets them (relative to LIB_SOURCE)."""
    return sorted(path.relative_to(LIB_SOURCE) for path in LIB_SOURCE.glob("*.py"))


def copy_lib(folder: Path) -> None:
    """Copy the portable package verbatim to `folder`/LIB_PACKAGE: repro.py and test_ops.py import it."""
    package = folder / lib.LIB_PACKAGE
    package.mkdir(exist_ok=True)
    for name in lib_files():
        shutil.copyfile(LIB_SOURCE / name, package / name)


def copy_transform(folder: Path, spec: str | None) -> dict | None:
    """Copy the `--transform FILE.py:FUNC` file as-is; note the environment variables it reads.

    The original is named as the user spelled it (no resolved absolute path: the folder's bytes must
    not depend on where the checkout lives)."""
    if not spec:
        return None
    path, func = lib.split_spec(spec)
    source = Path(path)
    (folder / TRANSFORM_DIR).mkdir(exist_ok=True)
    copied = folder / TRANSFORM_DIR / source.name
    shutil.copyfile(source, copied)
    text = source.read_text(encoding="utf-8", errors="replace")
    return {"file": f"{TRANSFORM_DIR}/{source.name}", "func": func, "original": path,
            "env": {name: os.environ.get(name) for name in transform_env_names(text)}}


def transform_env_names(text: str) -> list[str]:
    """Environment variables a transform's source seems to read (best effort, for the README).

    Names read literally (`os.environ["X"]`, `os.environ.get("X")`, `os.getenv("X")`), plus every
    variable set now whose name appears in the file (names built at run time, e.g. f-strings).
    """
    names = {name for pattern in _ENV_PATTERNS for name in re.findall(pattern, text)}
    if "environ" in text or "getenv" in text:
        names.update(name for name in os.environ if len(name) > 2 and re.search(rf"\b{re.escape(name)}\b", text))
    return sorted(names)


class DataWriter:
    """Collects the arrays of a repro, each stored once however many ops read it."""

    def __init__(self):
        self.arrays: dict[str, object] = {}

    def new_bytes(self, refs) -> int:
        seen: set[str] = set()
        total = 0
        for ref in refs:
            if ref.key not in self.arrays and ref.key not in seen:
                seen.add(ref.key)
                total += ref.nbytes
        return total

    def add(self, refs) -> None:
        for ref in refs:
            self.arrays.setdefault(ref.key, ref.array)

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays.values())

    def write(self, folder: Path) -> None:
        lib.write_npz(str(folder / lib.DATA_FILE),
                      ((key, lib.encode_array(array)[0]) for key, array in self.arrays.items()))


def write_payload(folder: Path, session, writer: "DataWriter", kind: str, command: str | None) -> dict:
    """What every repro folder holds: the data, the portable lib, the transform; returns the meta
    fields a dump and a carve share (`kind`: "dump" or "carve")."""
    writer.write(folder)
    copy_lib(folder)
    transform = copy_transform(folder, session.spec.transform)
    trace_meta = session.reader.meta
    return {
        "format": lib.FORMAT, "version": lib.FORMAT_VERSION, "kind": kind,
        "model": trace_meta.get("model", ""), "source": trace_meta.get("source", ""),
        "trace": str(Path(session.reader.path).resolve()), "recorded_versions": trace_meta.get("versions", {}),
        WRITTEN_WITH[kind]: versions(),
        "target": session.target, "transform": transform, "compare_rule": lib.COMPARE_RULE,
        "command": command or "",
    }


def write_meta(folder: Path, meta: dict) -> None:
    (folder / lib.META_FILE).write_text(json.dumps(meta, indent=1, default=_json_default) + "\n", encoding="utf-8")


def _json_default(value):
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def dir_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def human_bytes(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(count) < 1024 or unit == "GiB":
            return f"{count:.1f} {unit}" if unit != "B" else f"{int(count)} B"
        count /= 1024
    return f"{count:.1f} GiB"


def markdown_location(location: dict | None) -> str:
    """An op's model line in a README (a table cell too): `` `file:line` `code` ``; a library's line
    followed by `called from` and the user's line above it; "" when unknown."""
    if not location:
        return ""
    cell = " called from ".join(_markdown_line(where) for where in (location, location.get("user")) if where)
    return cell.replace("|", "\\|")  # a `|` in the code would end the table cell


def _markdown_line(location: dict) -> str:
    code = location.get("code", "")
    span = f"`` {code} ``" if "`" in code else f"`{code}`"
    return f"`{location['file']}:{location['line']}`" + (f" {span}" if code else "")


def safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def versions() -> dict:
    import numpy
    import tvm

    return {"tvm": tvm.__version__, "numpy": numpy.__version__, "python": platform.python_version(),
            "tapml_dbg": __version__}


def write_readme_sized(folder: Path, render) -> int:
    """Write README.md from `render(total_bytes)` so the size it states includes the README itself."""
    total = dir_bytes(folder)
    for _ in range(4):
        text = render(total)
        (folder / "README.md").write_text(text, encoding="utf-8")
        measured = dir_bytes(folder)
        if human_bytes(measured) == human_bytes(total):
            return measured
        total = measured
    return total

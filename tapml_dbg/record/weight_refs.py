"""Which params came from a safetensors checkpoint on disk, so the trace references them (v1.4).

The files: those a model (or any of its submodules) names, either opted in with
`tapml_dbg.weights_from(model, *paths)` (a user's own `load_state_dict` from safetensors) or found
through `from_pretrained`'s record of where it loaded from (`name_or_path` / `config._name_or_path`: a
local folder, or a model id in the Hugging Face cache; its `model.safetensors.index.json`, else its
`*.safetensors`). A param is referenced only when a tensor of those files has its state-dict name
(or that name without leading module prefixes, as a wrapper adds them), its dtype and shape, and
exactly its bytes: a model modified after loading, or cast to another dtype, is copied as before.
Checking the bytes reads each matched tensor once; its SHA-256 and CRC-32 are taken from the same read.
`.bin` (pickle) checkpoints are never opened.
"""

from __future__ import annotations

import glob
import json
import os

import numpy as np

from tapml_dbg import WEIGHT_FILES_ATTR, settings
from tapml_dbg.trace import schema as S
from tapml_dbg.trace.weight_refs import SafetensorsFile, WeightFile, WeightFileError, WeightRef, digests, refs_json

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
COMPARE_CHUNK = 1 << 20  # elements compared at a time (bounded temporaries)


def checkpoint_files(module) -> list[str]:
    """The safetensors files `module`'s weights may come from (absolute paths, each once)."""
    found: list[str] = []
    for sub in module.modules() if hasattr(module, "modules") else [module]:
        for path in list(getattr(sub, WEIGHT_FILES_ATTR, None) or []) + _pretrained_files(sub):
            path = os.path.abspath(os.fspath(path))
            if path not in found and os.path.isfile(path) and path.endswith(".safetensors"):
                found.append(path)
    return found


def _pretrained_files(sub) -> list[str]:
    config = getattr(sub, "config", None)
    name = getattr(sub, "name_or_path", None) or getattr(config, "_name_or_path", None)
    if not isinstance(name, str) or not name:
        return []
    if os.path.isdir(name):
        return _folder_files(name)
    return _cached_files(name)


def _folder_files(folder: str) -> list[str]:
    index = os.path.join(folder, INDEX_NAME)
    if os.path.isfile(index):
        return _index_files(index)
    return sorted(glob.glob(os.path.join(folder, "*.safetensors")))


def _index_files(index: str) -> list[str]:
    try:
        with open(index, encoding="utf-8") as handle:
            weight_map = json.load(handle).get("weight_map") or {}
    except (OSError, ValueError, AttributeError):
        return []
    folder = os.path.dirname(index)
    return [os.path.join(folder, name) for name in sorted(set(weight_map.values())) if isinstance(name, str)]


def _cached_files(model_id: str) -> list[str]:
    """A hub model id's safetensors in the local Hugging Face cache (never the network)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return []
    for name in (INDEX_NAME, SINGLE_NAME):
        try:
            path = try_to_load_from_cache(model_id, name)
        except Exception:  # noqa: BLE001 - not a repo id: nothing cached
            return []
        if isinstance(path, str):
            return _index_files(path) if name == INDEX_NAME else [path]
    return []


def referenced(module, program, params: dict[str, np.ndarray]) -> dict:
    """The trace writer's `params`, `weight_refs` and `weight_views` for a recording of `module` exported as
    `program`: the params to store, the JSON of the referenced ones (or None) and the referenced ones'
    values (TAPML_WEIGHT_REFS=0: every param stored)."""
    if not settings.value(settings.WEIGHT_REFS):
        return {"params": params, "weight_refs": None, "weight_views": None}
    targets = {spec.arg.name: spec.target for spec in program.graph_signature.input_specs
               if isinstance(getattr(spec, "target", None), str)}
    stored, refs = split_params(params, targets, checkpoint_files(module))
    return {"params": stored, "weight_refs": refs,
            "weight_views": {name: value for name, value in params.items() if name not in stored} or None}


def split_params(params: dict[str, np.ndarray], targets: dict[str, str], files: list[str]):
    """(the params to store, the JSON of /graph/weight_refs or None): each param whose bytes a checkpoint
    tensor of the same name holds is referenced instead of stored."""
    if not files:
        return params, None
    opened = []
    for path in files:
        try:
            opened.append(SafetensorsFile(path))
        except WeightFileError:
            continue  # not one we read: its params are copied
    try:
        refs = _match(params, targets, opened)
    finally:
        for source in opened:
            source.close()
    if not refs:
        return params, None
    used = sorted({ref.file for ref in refs.values()})
    renumber = {old: new for new, old in enumerate(used)}
    refs = {name: WeightRef(renumber[ref.file], ref.tensor, ref.dtype, ref.shape, ref.sha256, ref.crc32)
            for name, ref in refs.items()}
    weight_files = [WeightFile(opened[i].path, opened[i].size) for i in used]
    return {name: value for name, value in params.items() if name not in refs}, refs_json(weight_files, refs)


def _match(params: dict[str, np.ndarray], targets: dict[str, str], opened: list[SafetensorsFile]) -> dict:
    by_name: dict[str, list[int]] = {}
    for number, source in enumerate(opened):
        for tensor in source.tensors:
            by_name.setdefault(tensor, []).append(number)
    refs: dict[str, WeightRef] = {}
    tied: dict[tuple, WeightRef] = {}  # a tied param (the same memory under two names) reads the same tensor
    for name, value in params.items():
        array = S.normalized(value)
        memory = (array.__array_interface__["data"][0], array.shape, array.dtype.str)
        for tensor in _candidates(targets.get(name, ""), by_name):
            ref = next((r for r in (_same(opened, number, tensor, array) for number in by_name[tensor]) if r), None)
            if ref is not None:
                refs[name] = tied[memory] = ref
                break
        else:
            if memory in tied and array.size:
                refs[name] = tied[memory]
    return refs


def _candidates(target: str, by_name: dict) -> list[str]:
    """The checkpoint names a state-dict name may have: itself, then without each leading prefix."""
    parts = target.split(".") if target else []
    return [".".join(parts[i:]) for i in range(len(parts)) if ".".join(parts[i:]) in by_name]


def _same(opened: list[SafetensorsFile], number: int, tensor: str, array: np.ndarray) -> WeightRef | None:
    source = opened[number]
    span = source.tensors[tensor]
    if span.dtype != array.dtype.name or span.shape != tuple(array.shape) or array.size == 0:
        return None
    data = source.read_bytes(span)
    if not _equal_bytes(S.storage_view(array)[0].reshape(-1).view(np.uint8), data):
        return None
    sha256, crc32 = digests(data)
    return WeightRef(number, tensor, span.dtype, span.shape, sha256, crc32)


def _equal_bytes(left: np.ndarray, right: np.ndarray) -> bool:
    """Byte equality of two uint8 arrays, compared as the widest words their length allows (fast)."""
    if left.size != right.size:
        return False
    word = next(size for size in (8, 4, 2, 1) if left.size % size == 0)
    kind = np.dtype(f"u{word}")
    left, right = left.view(kind), right.view(kind)
    return all(np.array_equal(left[i:i + COMPARE_CHUNK], right[i:i + COMPARE_CHUNK])
               for i in range(0, left.size, COMPARE_CHUNK))

"""Weights by reference (trace v1.4): a `from_pretrained` safetensors checkpoint stays on disk.

A tiny Llama is saved with `save_pretrained` and loaded back with `from_pretrained`; its trace holds
references to the checkpoint's tensors (file, name, SHA-256, CRC-32), not copies. Replay reads them
from the file; `info --verify` names a checkpoint that changed; a missing one is a one-line error;
models with random or modified weights are copied as before.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from conftest import fault_transform, run_cli
from tapml_dbg.engine.session import Session
from tapml_dbg.record.recorder import record
from tapml_dbg.trace import TraceReader
from tapml_dbg.trace.inspect import trace_info
from tapml_dbg.trace.verify import verify_trace
from tapml_dbg.trace.weight_refs import WeightFileError

CONFIG = dict(num_hidden_layers=2, hidden_size=256, intermediate_size=1024, num_attention_heads=4, num_key_value_heads=2,
              vocab_size=2048, attn_implementation="eager")
SEQ = 6


def _model_file(folder, body: str) -> str:
    path = folder / f"model_{abs(hash(body)) % 10**8}.py"
    path.write_text(f"""import torch
from transformers import LlamaConfig, LlamaForCausalLM


def build():
    torch.manual_seed(0)
{body}
    return model.eval(), (torch.randint(0, 2048, (1, {SEQ})),)
""")
    return str(path)


def _from_pretrained(folder, checkpoint, then: str = "") -> str:
    return _model_file(folder, f"    model = LlamaForCausalLM.from_pretrained({str(checkpoint)!r}, "
                               f"attn_implementation='eager')\n{then}")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny Llama saved with save_pretrained (model.safetensors, 12 MB) and its trace recorded from
    `from_pretrained` (weights referenced)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("weight_refs")
    torch.manual_seed(1)
    LlamaForCausalLM(LlamaConfig(**CONFIG)).save_pretrained(folder / "ckpt")
    trace = folder / "referenced.h5"
    record(_from_pretrained(folder, folder / "ckpt"), trace)
    return folder, folder / "ckpt" / "model.safetensors", trace


def _referenced(trace) -> dict:
    with TraceReader(trace) as reader:
        return dict(reader.weights.refs.params) if reader.weights.refs is not None else {}


def test_a_pretrained_checkpoint_is_referenced_not_copied(checkpoint):
    from safetensors import safe_open

    _, weights, trace = checkpoint
    assert os.path.getsize(trace) < os.path.getsize(weights) / 5  # the trace holds activations, not weights
    with TraceReader(trace) as reader, safe_open(str(weights), framework="numpy") as source:
        refs = reader.weights.refs.params
        assert reader.version == (1, 4) and len(refs) == len(reader.outline.param_names) == len(reader.meta["params"])
        for name in reader.outline.param_names:  # read back from the checkpoint, bit for bit
            assert np.array_equal(reader.tensors.param(name), source.get_tensor(refs[name].tensor)), name
        assert reader.tensors.tensor_bytes() < sum(ref.nbytes for ref in refs.values()) / 2
    info = trace_info(trace)["weights"]
    assert info["params"] == len(refs) and info["files"][0]["path"] == str(weights)
    assert info["files"][0]["found"] == str(weights)


def test_bisect_reads_the_referenced_weights(checkpoint, tmp_path):
    _, _, trace = checkpoint
    with Session.open(trace) as session:
        clean = session.bisect()
    assert not clean.diverged, clean.culprit
    refs = _referenced(trace)
    with TraceReader(trace) as reader:  # a fault at the first op that reads a referenced weight
        target = next(op for op in reader.outline.ops if set(op["inputs"]) & set(refs) and op["op"] != "aten.embedding.default"
                      and op["outputs"][0]["dtype"] == "float32")
    with Session.open(trace, transform=fault_transform(tmp_path, "scale", target["name"])) as session:
        found = session.bisect(sweep=False)
    assert found.diverged and (found.culprit.index, found.culprit.name) == (target["index"], target["name"])


def test_verify_names_a_changed_checkpoint(checkpoint):
    _, weights, trace = checkpoint
    assert verify_trace(trace).ok and verify_trace(trace).weight_files == [str(weights)]
    original = weights.read_bytes()
    try:
        data = bytearray(original)
        data[-5] ^= 0x10  # a bit of the last tensor's bytes
        weights.write_bytes(bytes(data))
        report = verify_trace(trace)
        assert not report.ok and len(report.damaged) == 1
        message = report.damaged[0].message
        assert message.startswith(f"the checkpoint {weights} changed since the recording: it holds other bytes for "
                                  "tensor '") and "record the model again" in message
        with TraceReader(trace) as reader:  # replay reads it: the same line, not a wrong value
            changed = next(name for name, ref in reader.weights.refs.params.items()
                           if f"tensor {ref.tensor!r} " in message)
            with pytest.raises(WeightFileError, match="changed since the recording"):
                reader.tensors.param(changed)
    finally:
        weights.write_bytes(original)
    assert verify_trace(trace).ok


def test_a_missing_checkpoint_is_one_clear_line_and_can_be_found_elsewhere(checkpoint, tmp_path, monkeypatch):
    folder, weights, trace = checkpoint
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.move(weights, moved / weights.name)
    try:
        info = run_cli("info", str(trace))
        flat = "".join(info.stdout.split())  # the table wraps a long path (a test folder under xdist) at its width
        assert info.returncode == 0 and f"{weights}(" in flat and "MISSING" in info.stdout
        replay = run_cli("bisect", str(trace))
        assert replay.returncode != 0
        assert replay.stderr.strip().splitlines() == [
            f"error: the checkpoint {weights} the trace reads its weights from does not exist; put the checkpoint "
            "back where it was recorded, or set TAPML_WEIGHTS to the folder that holds it, or record the model again"]
        assert "does not exist" in verify_trace(trace).damaged[0].message
        monkeypatch.setenv("TAPML_WEIGHTS", str(moved))  # the trace moved to another machine: found by name
        assert trace_info(trace)["weights"]["files"][0]["found"] == str(moved / weights.name)
        assert verify_trace(trace).ok
    finally:
        shutil.move(moved / weights.name, weights)


def test_random_and_modified_weights_are_copied(checkpoint):
    folder, _, _ = checkpoint
    random = folder / "random.h5"
    one_layer = dict(CONFIG, num_hidden_layers=1)
    record(_model_file(folder, f"    model = LlamaForCausalLM(LlamaConfig(**{one_layer!r}))"), random)
    with TraceReader(random) as reader:
        assert reader.weights.refs is None and reader.version == (1, 4)
    modified = folder / "modified.h5"  # one weight changed after loading: that one is copied, the rest referenced
    record(_from_pretrained(folder, folder / "ckpt", "    with torch.no_grad():\n"
                                                    "        model.model.norm.weight.mul_(2)\n"), modified)
    refs = _referenced(modified)
    with TraceReader(modified) as reader:
        stored = [name for name in reader.outline.param_names if name not in refs]
        assert stored == ["p_model_norm_weight"] and len(refs) == len(reader.outline.param_names) - 1
        assert np.all(reader.tensors.param("p_model_norm_weight") == 2)


def test_a_users_own_load_state_dict_opts_in_with_weights_from(tmp_path):
    model = tmp_path / "own.py"
    model.write_text(f"""import safetensors.torch
import torch
import tapml_dbg


def build():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    safetensors.torch.save_file(net.state_dict(), {str(tmp_path / "own.safetensors")!r})
    fresh = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    fresh.load_state_dict(safetensors.torch.load_file({str(tmp_path / "own.safetensors")!r}))
    return tapml_dbg.weights_from(fresh, {str(tmp_path / "own.safetensors")!r}).eval(), (torch.randn(2, 64),)
""")
    record(f"{model}:build", tmp_path / "own.h5")
    with TraceReader(tmp_path / "own.h5") as reader:
        assert sorted(ref.tensor for ref in reader.weights.refs.params.values()) == ["0.bias", "0.weight", "2.bias",
                                                                                 "2.weight"]
        assert reader.recorded.weight_views()  # the linears' transposed weights are views of them, not copies
    assert verify_trace(tmp_path / "own.h5").ok


def test_a_view_and_its_param_read_the_file_once_per_reader(checkpoint, monkeypatch):
    """With TAPML_WEIGHT_CACHE_MIB, a linear's transposed weight (a view) and the weight itself share one
    read of the checkpoint, in either order."""
    from tapml_dbg.trace.weight_refs import SafetensorsFile

    _, _, trace = checkpoint
    reads: list[tuple[int, int]] = []
    real = SafetensorsFile.read_bytes
    monkeypatch.setattr(SafetensorsFile, "read_bytes", lambda self, span: reads.append((span.begin, span.end))
                        or real(self, span))
    monkeypatch.setenv("TAPML_WEIGHT_CACHE_MIB", "64")
    with TraceReader(trace) as reader:
        views = reader.recorded.weight_views()
        assert len(views) >= 7 * CONFIG["num_hidden_layers"]  # q k v o gate up down of every layer
        for index, (param, axes) in views.items():  # the view first, then its param
            value = reader.tensors.op_outputs(index)[0]
            weight = reader.tensors.param(param)
            assert value.flags.c_contiguous and np.array_equal(value, weight.transpose(axes)), index
            assert not weight.flags.writeable  # kept and shared: no caller may change it in place
        for name in reader.outline.param_names:
            reader.tensors.param(name)
        assert len(reads) == len(set(reads)) == len(reader.weights.refs.params)  # each tensor read once
        assert reader.weights.refs.file_reads == len(reads)


def test_a_view_streams_its_weight_by_default_bit_exact_and_checked(checkpoint, monkeypatch):
    """Without a cache (the default), a view reads its weight again through a small buffer: the same
    values as the kept weight transposed, a changed tensor still refused."""
    from tapml_dbg.trace.weight_refs import SafetensorsFile

    monkeypatch.setattr("tapml_dbg.trace.weight_refs.STREAM_BYTES", 4096)  # several blocks of rows a weight
    _, weights, trace = checkpoint
    with TraceReader(trace) as reader:
        views = reader.recorded.weight_views()
        for index, (param, axes) in views.items():
            value = reader.tensors.op_outputs(index)[0]
            assert value.flags.c_contiguous and np.array_equal(value, reader.tensors.param(param).transpose(axes)), index
        assert reader.weights.refs.file_reads == 2 * len(views)  # each view and its param: the file twice
        index, (param, _) = next(iter(views.items()))
        tensor = reader.weights.refs.params[param].tensor
    source = SafetensorsFile(str(weights))
    span = source.tensors[tensor]
    source.close()
    original = weights.read_bytes()
    try:
        data = bytearray(original)
        data[span.end - 3] ^= 0x01  # a bit of the view's weight, in its last block of rows
        weights.write_bytes(bytes(data))
        with TraceReader(trace) as reader, pytest.raises(WeightFileError, match=f"tensor {tensor!r}"):
            reader.tensors.op_outputs(index)  # read before its param: its CRC-32 checked on the way
    finally:
        weights.write_bytes(original)


def test_views_read_from_two_threads_are_each_exact(checkpoint):
    """A worker's read-ahead thread may still be streaming a view when the worker reads another."""
    from concurrent.futures import ThreadPoolExecutor

    _, _, trace = checkpoint
    with TraceReader(trace) as reader:
        views = list(reader.recorded.weight_views().items()) * 3
        expected = {index: reader.tensors.param(param).transpose(axes) for index, (param, axes) in views}
        with ThreadPoolExecutor(2) as pool:
            values = list(pool.map(lambda item: reader.tensors.op_outputs(item[0])[0], views))
    assert all(np.array_equal(value, expected[index]) for value, (index, _) in zip(values, views))


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "bool", "uint8"])
def test_a_weight_view_is_transposed_exactly(dtype):
    from tapml_dbg.trace.weight_refs import transposed

    rng = np.random.default_rng(0)
    for shape, axes in (((37, 19), (1, 0)), ((5, 300), (1, 0)), ((300, 5), (1, 0)), ((1, 7), (1, 0)), ((0, 4), (1, 0)),
                        ((3, 4, 5), (2, 0, 1)), ((6, 7), (0, 1))):
        value = (rng.random(shape) * 100).astype(dtype)
        out = transposed(value, axes)
        assert out.flags.c_contiguous and out.dtype == value.dtype
        assert np.array_equal(out, value.transpose(axes)), (shape, axes)


def test_a_reference_targets_values_reference_the_checkpoint_too(checkpoint):
    """--reference-target keeps the reference target's values as a trace of their own: its params stay in the
    checkpoint as the recorded trace's do, not copied into the cache."""
    import tapml_dbg

    _, weights, trace = checkpoint
    with tapml_dbg.open(trace, reference_target="llvm") as replay:  # the suite's compile cache: llvm's kernels once
        derived = replay.reference.trace
        assert not replay.bisect().diverged
    assert derived.stat().st_size < weights.stat().st_size / 5
    with TraceReader(derived) as reader:
        assert reader.weights.refs is not None and set(reader.weights.refs.params) == set(_referenced(trace))

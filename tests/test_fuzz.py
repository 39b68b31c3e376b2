"""The trace boundary under fuzz: damaged and crafted variants of a real trace never give a
traceback, a crash or a hang, and every bit flip inside tensor data is detected.

Seeded, so a failure reproduces: the variants come from `benchmarks/fuzz.py` (the long run,
thousands of variants, is `python benchmarks/fuzz.py`; its figures are in docs/reliability.md).
Every command runs in this process through `cli.main`, output captured (`info` takes a few ms; a
bisect starts its worker process, compiles and runs units). A crash takes the test run down with
it, which fails it too; a hang is cut by an alarm.
"""

from __future__ import annotations

import random
import signal
from collections import Counter

import pytest

from conftest import load_benchmark

SEED = 1729
VARIANTS = 200  # 20 of each kind: each label meets both outcomes 10+ times whichever mlp recording is the base
DEEP_KINDS = ("tensor bit flip", "HDF5 edit")  # variants that still open, so the engine reads them
HANG_S = 30  # one in-process `info` takes milliseconds
DEEP_HANG_S = 300  # a bisect compiles units: seconds


fuzz = load_benchmark("fuzz", "tapml_fuzz")


class Hang(BaseException):
    """Raised by the alarm in a command that ran past HANG_S (BaseException: main() must not catch it)."""


def _run(argv: list[str], seconds: int = HANG_S):
    def alarm(*_):
        raise Hang()

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        return fuzz.run_in_process(argv)
    except Hang:
        return fuzz.Result(fuzz.Outcome.HANG, f"past {seconds} s")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="module", autouse=True)
def one_parser():
    """`cli.main` builds tapml-dbg's whole argument parser for each command (every subcommand's options,
    the installed versions for `--version`): half the CPU of an in-process `info`. The module's hundreds
    of commands parse with one parser, built once here (a parser keeps no state between parses)."""
    from tapml_dbg.ui import cli

    parser = cli.build_parser()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cli, "build_parser", lambda: parser)
        yield


@pytest.fixture(scope="module")
def base(traces, tmp_path_factory):
    """A private copy of the mlp trace: other tests may hold the shared one open (HDF5 refuses to
    open a file twice in one process with different locking flags)."""
    path = tmp_path_factory.mktemp("fuzz") / "mlp.h5"
    path.write_bytes(traces.get("mlp").read_bytes())
    return path


def test_info_never_fails_on_a_damaged_trace(base, tmp_path):
    rng = random.Random(SEED)
    extents = fuzz.layout(base)
    foreign = tmp_path / "foreign.h5"
    foreign.write_bytes(base.read_bytes())
    outcomes: Counter = Counter()
    failures = []
    for number, kind in enumerate(fuzz.variant_kinds(VARIANTS, rng)):
        variant = fuzz.make_variant(base, extents, kind, rng, tmp_path / "variant.h5", foreign)
        for label, argv in fuzz.commands(variant.path, deep=False):
            result = _run(argv)
            if label == "info --verify" and kind == fuzz.Kind.TENSOR_BIT_FLIP and result.outcome == fuzz.Outcome.OK:
                result = fuzz.Result(fuzz.Outcome.MISSED, "a flipped bit in tensor data passed --verify")
            outcomes[label, result.outcome] += 1
            if result.outcome in fuzz.FAILURES:
                failures.append(f"variant {number} ({kind.value}: {variant.what}) {label}: {result.outcome.value} "
                                f"{result.place}\n{result.output[-800:]}")
    assert not failures, "\n\n".join(failures[:5])
    # the variants reach both sides of the boundary: refused files and files that still read
    for label in ("info", "info --json", "info --verify"):
        assert outcomes[label, fuzz.Outcome.OK] > 10 and outcomes[label, fuzz.Outcome.ERROR] > 10, outcomes


def test_every_tensor_bit_flip_is_reported_by_verify(base, tmp_path):
    rng = random.Random(SEED + 1)
    extents = fuzz.layout(base)
    for _ in range(40):
        variant = fuzz.make_variant(base, extents, fuzz.Kind.TENSOR_BIT_FLIP, rng, tmp_path / "v.h5", base)
        result = _run(["info", str(variant.path), "--verify"])
        assert result.outcome == fuzz.Outcome.ERROR and "checksum mismatch" in result.output, variant.what


@pytest.mark.parametrize("kind", DEEP_KINDS)
def test_bisect_and_replay_never_fail_on_a_damaged_trace(base, tmp_path, kind):
    rng = random.Random(SEED)
    foreign = tmp_path / "foreign.h5"
    foreign.write_bytes(base.read_bytes())
    variant = fuzz.make_variant(base, fuzz.layout(base), fuzz.Kind(kind), rng, tmp_path / "variant.h5", foreign)
    for label, argv in fuzz.commands(variant.path, deep=True)[3:]:  # bisect --json, replay -c
        result = _run(argv, DEEP_HANG_S)
        assert result.outcome not in fuzz.FAILURES, (
            f"{kind}: {variant.what}: {label}: {result.outcome.value} {result.place}\n{result.output}")

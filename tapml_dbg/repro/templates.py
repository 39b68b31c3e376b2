"""The small Python files a dump or carve writes beside `_tapml_repro_lib/`.

They hold no per-op code: everything they run is in the shared lib (a verbatim copy of
`tapml_dbg/portable`, the runtime the engine uses too) and meta.json, so a dump's repro.py, a
carved test and the engine run the same machinery.
"""

REPRO_PY = '''#!/usr/bin/env python3
"""Standalone repro of op #{index} {name} ({source_op}) of {model}; written by tapml-dbg.

Needs only tvm and numpy. Builds the op's module from module.py, runs it on the recorded
inputs (data.npz) on the target, compares with the recorded source output under the recorded
tolerance (meta.json), prints the metrics.

    python repro.py [--target T] [--rpc HOST:PORT | --tracker HOST:PORT --key KEY]

Exit 1: the divergence reproduces (or the op fails to compile or run); 0: it does not;
2: the repro itself cannot run. Runs from any working directory.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # leave the repro folder as it was written

import _tapml_repro_lib as lib  # noqa: E402  (copied from tapml-dbg; tvm + numpy only)

if __name__ == "__main__":
    sys.exit(lib.repro_main(HERE, sys.argv[1:]))
'''

TEST_OPS_PY = '''"""One test per op of {model}, carved by tapml-dbg: each op alone, fed its recorded inputs.

Run with `pytest {folder_hint}` from anywhere; `--target T` and `--rpc HOST:PORT` pick where
the ops run (default: {target}, locally). Needs only tvm, numpy and pytest.
"""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import _tapml_repro_lib as lib  # noqa: E402  (copied from tapml-dbg; tvm + numpy only)

META = lib.read_meta(HERE)
OPS = META["ops"]


@pytest.mark.parametrize("op", OPS, ids=[lib.op_id(op) for op in OPS])
def test_op(op, tapml_runner, tapml_data):
    try:
        check = lib.check_op(HERE, META, op, tapml_runner, tapml_data)
    except lib.PortableError as exc:
        pytest.fail(f"the carved test cannot run: {{exc}}", pytrace=False)
    assert check.passed, check.report()
'''

CONFTEST_PY = '''"""Options of the carved op tests: where the ops run."""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import _tapml_repro_lib as lib  # noqa: E402


def pytest_addoption(parser):
    group = parser.getgroup("tapml", "tapml-dbg carved op tests")
    group.addoption("--target", default=None, help="TVM target (default: the carve's, {target})")
    group.addoption("--rpc", default=None, metavar="HOST:PORT", help="run the ops on a TVM RPC server")
    group.addoption("--tracker", default=None, metavar="HOST:PORT", help="lease a device from a tracker")
    group.addoption("--key", default=None, help="device key at the tracker")


@pytest.fixture(scope="session")
def tapml_runner(request):
    meta = lib.read_meta(HERE)
    option = request.config.getoption
    try:
        return lib.Runner(option("--target") or meta.get("target", "llvm"), option("--rpc"),
                          option("--tracker"), option("--key"))
    except lib.PortableError as exc:
        pytest.exit(f"cannot set up the target: {{exc}}", returncode=2)


@pytest.fixture(scope="session")
def tapml_data():
    data = lib.Data(HERE)
    yield data
    data.close()
'''

PYTEST_INI = '''[pytest]
# written by tapml-dbg carve: keeps this suite independent of any surrounding project's settings
testpaths = test_ops.py
addopts = -p no:cacheprovider
'''

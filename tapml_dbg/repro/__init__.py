"""Standalone repros: `dump` one op into a folder that needs only tvm + numpy; `carve` every op
into a pytest suite. Both ship a verbatim copy of `tapml_dbg.portable`, the code the engine's
worker compiles, runs and judges with, so a repro and the engine agree on every unit.
"""

from tapml_dbg.repro.carve import DEFAULT_CARVE_MAX_MB, CarveResult, carve
from tapml_dbg.repro.dump import DumpResult, dump_op
from tapml_dbg.repro.unit import RoundTripError

__all__ = ["DEFAULT_CARVE_MAX_MB", "CarveResult", "DumpResult", "RoundTripError", "carve", "dump_op"]

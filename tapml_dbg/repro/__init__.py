"""Standalone repros: `dump` one op into a folder that needs only tvm + numpy; `carve` every op
into a pytest suite. Both share one runtime file, `standalone.py`, copied into the folder."""

from .carve import DEFAULT_CARVE_MAX_MB, CarveResult, carve
from .dump import DumpResult, dump_op
from .unit import RoundTripError

__all__ = ["dump_op", "carve", "DumpResult", "CarveResult", "DEFAULT_CARVE_MAX_MB", "RoundTripError"]

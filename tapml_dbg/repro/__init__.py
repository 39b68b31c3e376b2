"""Standalone repros: `dump` one op into a folder that needs only tvm + numpy; `carve` every op
into a pytest suite. Both share one runtime file, `standalone.py`, copied into the folder.

Names are imported lazily: the engine's `compare` uses `standalone` too, and must not pull in
the session through this package.
"""

_EXPORTS = {"carve": "carve_suite", "CarveResult": "carve_suite", "DEFAULT_CARVE_MAX_MB": "carve_suite",
            "dump_op": "dump_dir", "DumpResult": "dump_dir", "RoundTripError": "unit"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(name)
    import importlib

    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)

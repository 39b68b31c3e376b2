"""tapml-dbg: record a model on a trusted source, replay it on a TVM target, find what diverges."""

__version__ = "0.1.0"

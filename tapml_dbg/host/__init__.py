"""The torch-on-host side: the source runner and what it needs (helper bindings' float64 values, low-precision
recomputation, exact torch <-> numpy). Torch on the host CPU, never a target: runtime/ holds the target workers."""

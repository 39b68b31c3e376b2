"""A planted sticky fault for tests: the op named in SETTINGS poisons the process that runs it.

What a CUDA fault does (docs/reliability.md, "Sticky faults"): once one kernel faults, every later
call in that process fails. Here the op's unit fails at run time with a CUDA-like runtime error and
marks its process (a flag keyed by `os.getpid()`); every other op's value goes through a check
that fails the same way in a marked process. Nothing is decided at compile time (units compile in
other processes and come from the compile cache): the check and the fault are packed functions
this file registers when a worker loads it.

With `"silent"` in SETTINGS the op itself gives its right value and only later units fail (a fault
reported asynchronously). Configure with a copy of this file that sets `SETTINGS = {"op": NAME}` (see
`tests/test_sticky_faults.py`; the compile cache keys on the transform file's text).
"""

import os

import tvm
from tvm import relax

SETTINGS: dict = {}
MESSAGE = "CUDA Runtime Error: misaligned address (simulated sticky fault)"
FIRE = "tapml_test.poison_fire"  # the named op: marks the process, then fails
FIRE_SILENTLY = "tapml_test.poison_silently"  # ("silent" in SETTINGS) marks it, and gives a right value
CHECK = "tapml_test.poison_check"  # every other value: fails in a marked process, else a copy of it
_POISONED: set = set()  # pids of the processes the named op ran in


def _fire(value):
    _POISONED.add(os.getpid())
    raise RuntimeError(MESSAGE)


def _fire_silently(value):  # a fault reported later, by another unit (an asynchronous CUDA error)
    _POISONED.add(os.getpid())
    return tvm.runtime.tensor(value.numpy(), value.device)


def _check(value):
    if os.getpid() in _POISONED:
        raise RuntimeError(MESSAGE)
    return tvm.runtime.tensor(value.numpy(), value.device)  # a copy: the VM may reuse the input's storage


tvm.register_global_func(FIRE, _fire, override=True)
tvm.register_global_func(FIRE_SILENTLY, _fire_silently, override=True)
tvm.register_global_func(CHECK, _check, override=True)


def poison(mod):
    """The named op's value through FIRE, every other tensor value through CHECK."""
    target = SETTINGS.get("op", os.environ.get("TAPML_FAULT_OP"))
    fire = FIRE_SILENTLY if SETTINGS.get("silent") else FIRE

    @relax.expr_functor.mutator
    class Poisoner(relax.PyExprMutator):
        def visit_var_binding_(self, binding):
            value = self.visit_expr(binding.value)
            info = binding.var.ty
            if isinstance(info, relax.TensorType):
                inner = self.builder_.emit(value)
                func = fire if binding.var.name == target else CHECK
                value = relax.op.call_pure_packed(func, inner, ty_args=info)
            new_var = self.builder_.emit(value, binding.var.name)
            self.set_var_remap(binding.var, new_var)

    mutator = Poisoner(mod)
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gvar, mutator.visit_expr(func))
    return mutator.builder_.get()

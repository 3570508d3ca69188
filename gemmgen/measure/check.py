"""`gemmgen.measure.check`: the check of checking.py, importable either way.

`from gemmgen.measure.check import check` and `from gemmgen.measure import check` both
give something you call as check(fn, problem, ...): once this submodule is imported,
Python binds the package attribute `check` to the module, so the module itself is
made callable (the pattern of gemmgen/compile.py).
"""
import sys
import types

from gemmgen.measure.checking import CaseResult, CheckResult, check

__all__ = ["CaseResult", "CheckResult", "check"]


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        return check(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

"""Spying on the ctypes functions of the loaded libspattn (test helper): inside ``wrapped``,
each named function of the library handle is replaced by ``make(name, original)``, and put
back on exit.  The argument types of the varlen and plan functions are declared on the real
functions first (their modules declare them lazily), so the originals keep them."""
from __future__ import annotations

import contextlib

from spattn import _lib


@contextlib.contextmanager
def wrapped(names, make):
    from spattn import _varlen
    from spattn import block_mask as _bm
    h = _lib.lib()
    _varlen._h()
    _bm.plan_lib()
    saved = {}
    try:
        for name in names:
            orig = saved[name] = getattr(h, name)
            setattr(h, name, make(name, orig))
        yield
    finally:
        for name, orig in saved.items():
            setattr(h, name, orig)

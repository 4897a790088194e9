"""Runs the Python tests (unittest) and prints a summary with skip reasons and recorded errors.

Usage: python tests/run.py [test_module ...]   (default: every test_*.py here)
Exit status 0 iff nothing failed.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import metrics  # noqa: E402


def main(argv) -> int:
    loader = unittest.TestLoader()
    names = argv[1:] or sorted(f[:-3] for f in os.listdir(HERE) if f.startswith("test_") and f.endswith(".py"))
    notes = []
    if importlib.util.find_spec("numpy") is None and "test_numpy" in names:
        names.remove("test_numpy")
        notes.append("SKIPPED test_numpy: NumPy not importable")
    suite = unittest.TestSuite(loader.loadTestsFromName(n) for n in names)
    t0 = time.time()
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    dt = time.time() - t0

    def base(t):  # the test a subtest belongs to
        return getattr(t, "test_case", t).id()

    failed = {base(t) for t, _ in result.failures + result.errors}
    skipped = {t.id() for t, _ in result.skipped if not hasattr(t, "test_case")}
    sub_skips = sum(1 for t, _ in result.skipped if hasattr(t, "test_case"))
    print("\n== python test summary ==")
    for note in notes:
        print(note)
    if result.skipped:
        reasons = {}
        for test, why in result.skipped:
            reasons.setdefault(why, []).append(test.id().split(".")[-1])
        for why, tests in reasons.items():
            print(f"SKIPPED {len(tests)}: {why}")
    if metrics.RECORDED:
        print("max errors (|actual - golden|):")
        for key in sorted(metrics.RECORDED):
            print(f"  {key}: {metrics.RECORDED[key]:.3g}")
    missing = []
    if os.environ.get("SPATTN_REQUIRE_TORCH") == "1":
        # python/run_tests.sh installed torch and hypothesis: a skip for lack of them is a failure
        missing = [why for _, why in result.skipped if "not importable" in why]
        if importlib.util.find_spec("torch") is None:
            missing.append("torch not importable")
        for why in sorted(set(missing)):
            print(f"FAILED (SPATTN_REQUIRE_TORCH=1): {why}")
    n_pass = result.testsRun - len(failed) - len(skipped - failed)
    extra = f", {sub_skips} subtests skipped" if sub_skips else ""
    print(f"{n_pass} passed, {len(failed)} failed, {len(skipped - failed)} skipped{extra} "
          f"({result.testsRun} tests, {dt:.1f} s)")
    return 0 if result.wasSuccessful() and not missing else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))

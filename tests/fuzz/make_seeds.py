"""Writes the seed corpus of fuzz_api (tests/fuzz/corpus/api): one input per entry point and
base layout, no mutations, so that the fuzzer starts from calls that pass validation and run
the kernels.  Format: see LLVMFuzzerTestOneInput in fuzz_api.c (entry byte, dtype, sizes,
layout bytes, 4 seed bytes, mutation count).  Usage: python3 tests/fuzz/make_seeds.py"""
import os

HERE = os.path.dirname(os.path.abspath(__file__))
out = os.path.join(HERE, "corpus", "api")
os.makedirs(out, exist_ok=True)
for entry in range(11):
    for variant, (dtype, sizes, lay) in enumerate([(0, 3, 0), (1, 7, 1), (2, 11, 2), (0, 5, 3),
                                                   (1, 9, 4), (0, 13, 5)]):
        if entry == 10 and variant > 1:
            break
        body = bytes([entry, dtype]) + bytes([sizes + i for i in range(12)])
        body += bytes([lay + i for i in range(14)]) + bytes([7, 7, 7, 7]) + bytes([0])
        with open(os.path.join(out, f"seed-{entry:02d}-{variant}"), "wb") as f:
            f.write(body)

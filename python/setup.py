"""Build hook: runs CMake on the repository to build libspattn.so and ships it in spattn/lib/.

Environment:
  SPATTN_LIBRARY=/path/libspattn.so  bundle this existing library instead of building one
  SPATTN_CUDA=ON|OFF                 force the CUDA backend on/off (default: CMake decides)
  SPATTN_SOURCE_DIR=/path/repo       the C sources (default: ./_csrc in an sdist, else ..)
  SPATTN_BUILD_JOBS=N                parallel build jobs (default: CMAKE_BUILD_PARALLEL_LEVEL or all cores)
"""
import os
import shutil
import subprocess
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
C_PARTS = ("CMakeLists.txt", "include", "src")


def source_dir() -> Path:
    env = os.environ.get("SPATTN_SOURCE_DIR")
    cands = [Path(env)] if env else [HERE / "_csrc", HERE.parent]
    for c in cands:
        if (c / "CMakeLists.txt").is_file() and (c / "include" / "spattn.h").is_file():
            return c.resolve()
    raise RuntimeError("spattn: C sources not found (looked in %s); build from the repository's python/ "
                       "folder or set SPATTN_SOURCE_DIR" % ", ".join(map(str, cands)))


def cmake_config(build_temp: Path, env=os.environ):
    """(build folder, configure arguments) for the SPATTN_CUDA setting in env.

    SPATTN_CUDA is always passed (unset = ON: CUDA when nvcc is found) and each setting has its
    own folder: a cache left by an earlier SPATTN_CUDA=OFF build (e.g. the tests') must not turn
    a later plain `pip install ./python` into a CPU-only package."""
    cuda = env.get("SPATTN_CUDA", "")
    if not cuda:
        mode = "auto"
    else:
        mode = "on" if cuda.upper() in ("1", "ON", "TRUE", "YES") else "off"
    bdir = build_temp / ("cmake-cuda-" + mode)
    args = ["cmake", "-S", str(source_dir()), "-B", str(bdir), "-DCMAKE_BUILD_TYPE=Release",
            "-DSPATTN_TESTS=OFF", "-DSPATTN_CUDA=" + ("OFF" if mode == "off" else "ON")]
    return bdir, args


def build_library(build_temp: Path) -> Path:
    bdir, args = cmake_config(build_temp)
    jobs = os.environ.get("SPATTN_BUILD_JOBS") or os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") \
        or str(os.cpu_count() or 2)
    print("spattn: " + " ".join(args), flush=True)
    subprocess.check_call(args)
    subprocess.check_call(["cmake", "--build", str(bdir), "--target", "spattn", "-j", jobs])
    libs = sorted(p for p in bdir.rglob("libspattn.so*") if not p.is_symlink())
    if not libs:
        raise RuntimeError(f"spattn: the CMake build produced no libspattn.so under {bdir}")
    return libs[0]


class BuildPy(build_py):
    """build_py + libspattn.so into spattn/lib/."""

    def run(self):
        super().run()
        env_lib = os.environ.get("SPATTN_LIBRARY")
        if env_lib:
            lib = Path(env_lib).resolve()
            if not lib.is_file():
                raise RuntimeError(f"SPATTN_LIBRARY={env_lib}: no such file")
        else:
            build_temp = Path(self.get_finalized_command("build").build_temp).resolve()
            lib = build_library(build_temp)
        dest = Path(self.build_lib) / "spattn" / "lib"
        dest.mkdir(parents=True, exist_ok=True)
        for old in dest.glob("libspattn.so*"):
            old.unlink()
        shutil.copy2(lib, dest / "libspattn.so")


class Sdist(sdist):
    """sdist that carries the C sources (./_csrc) so it builds away from the repository."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        src, out = source_dir(), Path(base_dir) / "_csrc"
        for part in C_PARTS:
            p = src / part
            if p.is_dir():
                shutil.copytree(p, out / part, dirs_exist_ok=True)
            else:
                out.mkdir(parents=True, exist_ok=True)
                shutil.copy2(p, out / part)


class BinaryDistribution(Distribution):
    """Platform wheel: the package ships a native library."""

    def has_ext_modules(self):
        return True


if __name__ == "__main__":  # pip runs this file as __main__; tests import cmake_config
    setup(cmdclass={"build_py": BuildPy, "sdist": Sdist}, distclass=BinaryDistribution)

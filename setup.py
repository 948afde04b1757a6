"""Builds poptorch: CMake compiles the C++ core into poptorch/_C.

Build with ``pip install --no-build-isolation -e .`` (or ``scripts/setup.sh``):
an isolated build environment would download a different torch.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
VERSION = re.search(r'__version__ = "([^"]+)"', (ROOT / "poptorch" / "_version.py").read_text())[1]


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    """Configures once into build/cmake, then builds incrementally."""

    def build_extension(self, ext: Extension) -> None:
        build_dir = ROOT / "build" / "cmake"
        build_dir.mkdir(parents=True, exist_ok=True)
        if not (build_dir / "build.ninja").exists():
            subprocess.check_call(
                [
                    "cmake", "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja",
                    f"-DPython3_EXECUTABLE={sys.executable}",
                    "-DCMAKE_BUILD_TYPE=Release",
                    "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache",
                ]
            )
        jobs = os.environ.get("POPTORCH_BUILD_JOBS", "2")
        subprocess.check_call(["cmake", "--build", str(build_dir), "-j", jobs])
        # CMake writes the module into poptorch/; copy it where setuptools expects it.
        built = next((ROOT / "poptorch").glob("_C*.so"))
        target = Path(self.get_ext_fullpath(ext.name))
        if target.resolve() != built.resolve():
            target.parent.mkdir(parents=True, exist_ok=True)
            self.copy_file(str(built), str(target))


setup(
    name="poptorch",
    version=VERSION,
    description="An ipu device and the PopTorch programming model for PyTorch",
    packages=find_packages(include=["poptorch", "poptorch.*"]),
    ext_modules=[CMakeExtension("poptorch._C")],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.10",
    install_requires=["torch==2.13.0", "tqdm"],
    # Named after its module, so that a suite that also lists it in
    # `pytest_plugins` (as tests/conftest.py does) does not register it twice.
    entry_points={"pytest11": ["poptorch.testing.pytest_plugin = poptorch.testing.pytest_plugin"]},
)

# SPDX-License-Identifier: Apache-2.0
"""Builds the _memdecay extension with the project's CMake (target memdecay_python) for `pip install .`."""
import os
import pathlib
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = pathlib.Path(self.build_temp).resolve() / "cmake"
        out = pathlib.Path(self.get_ext_fullpath(ext.name)).resolve()
        subprocess.check_call([
            "cmake", "-S", str(ROOT), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
            f"-DPython3_EXECUTABLE={sys.executable}", "-DMEMDECAY_BUILD_TESTS=OFF", "-DMEMDECAY_BUILD_BENCHMARKS=OFF",
            "-DMEMDECAY_BUILD_EXAMPLES=OFF", "-DMEMDECAY_BUILD_TOOLS=OFF", "-DMEMDECAY_INSTALL=OFF",
            "-DMEMDECAY_BUILD_C=OFF",
        ])
        subprocess.check_call(["cmake", "--build", str(build), "--target", "memdecay_python",
                               "-j", str(os.cpu_count() or 1)])
        built = next((build / "python" / "memdecay").glob("_memdecay*.so"))
        out.parent.mkdir(parents=True, exist_ok=True)
        self.copy_file(str(built), str(out))


setup(ext_modules=[CMakeExtension("memdecay._memdecay")], cmdclass={"build_ext": CMakeBuild})

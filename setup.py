"""Builds the `kvstash` Python package's extension with the project's CMake (see pyproject.toml).

The extension is CMake's kvstash_python target: the whole store linked statically into
`kvstash/_kvstash*.so`, so the installed package needs no libkvstash beside it (it does use the
system's shared OpenSSL, and libcurl/json-c, libmicrohttpd and the CUDA runtime when the build
found them). A CUDA build is chosen when nvcc is found (on PATH, $CUDACXX, or
/usr/local/cuda/bin/nvcc) and CMake's probe of it succeeds; KVSTASH_CUDA=0 forces a build
without it, KVSTASH_CUDA=1 insists on it (the build fails without a working nvcc). KVSTASH_CMAKE_ARGS adds
configure arguments (space separated). Offline: nothing is downloaded."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def version():
    text = (ROOT / "CMakeLists.txt").read_text()
    m = re.search(r"project\(kvstash VERSION ([0-9.]+)", text)
    if not m:
        raise RuntimeError("setup.py: no project(kvstash VERSION ...) in CMakeLists.txt")
    return m.group(1)


def find_nvcc():
    want = os.environ.get("KVSTASH_CUDA", "")
    if want == "0":
        return None
    for cand in (os.environ.get("CUDACXX"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and os.access(cand, os.X_OK):
            return cand
    if want == "1":
        raise RuntimeError("setup.py: KVSTASH_CUDA=1 but no nvcc was found (PATH, $CUDACXX, "
                           "/usr/local/cuda/bin/nvcc)")
    return None


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        if shutil.which("cmake") is None:
            raise RuntimeError("setup.py: cmake is needed to build kvstash (Debian: cmake)")
        out = Path(self.get_ext_fullpath(ext.name)).resolve()
        build = Path(self.build_temp).resolve() / "cmake"
        args = [f"-DPython3_EXECUTABLE={sys.executable}", "-DBUILD_TESTING=OFF",
                "-DCMAKE_BUILD_TYPE=Release"]
        nvcc = find_nvcc()
        env = dict(os.environ)
        if nvcc and os.environ.get("KVSTASH_CUDA") == "1":
            args.append(f"-DCMAKE_CUDA_COMPILER={nvcc}")  # no working nvcc: the build fails
        elif nvcc:
            # CMake probes it (and builds without CUDA if the probe fails); ON overrides a
            # KVS_CUDA=OFF cached by an earlier KVSTASH_CUDA=0 build in the same build/pip.
            env["CUDACXX"] = nvcc
            args.append("-DKVS_CUDA=ON")
        else:
            args.append("-DKVS_CUDA=OFF")
        args += os.environ.get("KVSTASH_CMAKE_ARGS", "").split()
        print(f"kvstash: building with CMake in {build} "
              f"({'nvcc ' + nvcc if nvcc else 'no nvcc: no CUDA'})", flush=True)
        subprocess.check_call(["cmake", "-S", str(ROOT), "-B", str(build), *args], env=env)
        jobs = str(os.cpu_count() or 2)
        subprocess.check_call(["cmake", "--build", str(build), "--target", "kvstash_python",
                               "-j", jobs], env=env)
        built = sorted((build / "python" / "kvstash").glob("_kvstash*.so"))
        if len(built) != 1:
            raise RuntimeError(f"setup.py: expected one _kvstash*.so in {build}, found {built}")
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built[0], out)


try:
    (ROOT / "build").mkdir(exist_ok=True)  # setup.cfg keeps egg-info there, out of the tree
except OSError as e:
    sys.exit(f"setup.py: cannot create {ROOT / 'build'} ({e}); build from a writable copy")
setup(version=version(), ext_modules=[Extension("kvstash._kvstash", sources=[])],
      cmdclass={"build_ext": CMakeBuild})

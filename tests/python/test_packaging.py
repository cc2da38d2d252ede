"""The Python package installed the way users install it, offline, with Debian's setuptools:
 1. `python3 -m build --wheel --no-isolation` builds a wheel from a copy of the tree, which
    `pip install --no-index` puts into a fresh `python3 -m venv`;
 2. `pip install --no-build-isolation --no-index .` builds and installs into another venv
    (with the system's site packages, where setuptools and wheel are);
 3. `python3 -m build --sdist` makes an sdist, which pip builds and installs alone.
From each, outside the source and build trees, `import kvstash` must load the installed copy
and a put/get round trip against a real kvstash-server must return the same bytes.

The interpreter is $KVS_PACKAGING_PYTHON (default /usr/bin/python3: Debian's, with
python3-build, python3-setuptools, python3-wheel, python3-venv and python3-dev). Exits 77 when
it lacks one of them."""
import os
import shutil
import subprocess
import sys
import tempfile
import time

from kvs_harness import Server

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PY = os.environ.get("KVS_PACKAGING_PYTHON", "/usr/bin/python3")

ROUND_TRIP = r"""
import os, sys
import kvstash
print("kvstash from", kvstash.__file__)
here = os.path.realpath(kvstash.__file__)
assert here.startswith(os.path.realpath(sys.prefix)), (here, sys.prefix)
assert not here.startswith(os.path.realpath(sys.argv[2])), "loaded from the source tree"
s = kvstash.MooncakeDistributedStore()
rc = s.setup("localhost", "", 0, "16MB", "tcp", "", sys.argv[1])
assert rc == 0, rc
data = os.urandom(3 << 20)
assert s.put("pkg-round-trip", data) == 0
assert s.get("pkg-round-trip") == data
assert s.remove("pkg-round-trip") == 0
s.close()
print("round trip: 3 MiB put and read back, equal")
"""


def run(cmd, **kw):
    t0 = time.monotonic()
    print("+", " ".join(c if len(c) < 200 else "<script>" for c in cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-15:])
    print(tail)
    print(f"  ({time.monotonic() - t0:.1f} s, rc {r.returncode})", flush=True)
    if r.returncode != 0:
        raise SystemExit(f"FAILED: {' '.join(cmd)}")
    return r


def clean_env():
    env = dict(os.environ)
    for k in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        env.pop(k, None)
    return env


def round_trip(venv, master, cwd):
    run([os.path.join(venv, "bin", "python"), "-c", ROUND_TRIP, master, ROOT], cwd=cwd,
        env=clean_env())


def main():
    if not os.path.exists(PY):
        print(f"SKIP: no {PY}")
        return 77
    probe = subprocess.run([PY, "-c", "import setuptools, wheel, build, venv, ensurepip, "
                                      "sysconfig, os; assert os.path.exists("
                                      "sysconfig.get_paths()['include'] + '/Python.h')"],
                           capture_output=True, text=True, env=clean_env())
    if probe.returncode != 0:
        print(f"SKIP: {PY} lacks setuptools, wheel, build, venv or Python.h (Debian: "
              f"python3-setuptools python3-wheel python3-build python3-venv python3-dev)\n"
              f"{probe.stderr.strip()}")
        return 77
    if shutil.which("cmake") is None:
        print("SKIP: no cmake")
        return 77
    tmp = tempfile.mkdtemp(prefix="kvs-pkg-")
    srv = Server(segment="64MiB")
    try:
        src = os.path.join(tmp, "src")
        shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
            "build", "build-*", ".git", "__pycache__", "*.egg-info"))
        env = clean_env()
        # 1. A wheel, installed into a fresh venv from the wheel alone.
        dist = os.path.join(tmp, "dist")
        run([PY, "-m", "build", "--wheel", "--no-isolation", "--outdir", dist, src], env=env)
        wheels = [f for f in os.listdir(dist) if f.endswith(".whl")]
        assert len(wheels) == 1, wheels
        venv = os.path.join(tmp, "venv")
        run([PY, "-m", "venv", venv], env=env)
        run([os.path.join(venv, "bin", "pip"), "install", "--no-index",
             os.path.join(dist, wheels[0])], env=env)
        round_trip(venv, srv.master, tmp)
        # 2. pip install from the tree, no build isolation, into a venv that sees Debian's
        # setuptools and wheel.
        shutil.rmtree(os.path.join(src, "build"))  # built again from nothing
        venv2 = os.path.join(tmp, "venv-sys")
        run([PY, "-m", "venv", "--system-site-packages", venv2], env=env)
        run([os.path.join(venv2, "bin", "pip"), "install", "--no-build-isolation", "--no-index",
             src], env=env)
        round_trip(venv2, srv.master, tmp)
        # 3. An sdist holds what the build needs: pip builds and installs from it alone.
        shutil.rmtree(os.path.join(src, "build"))
        sdist = os.path.join(tmp, "sdist")
        run([PY, "-m", "build", "--sdist", "--no-isolation", "--outdir", sdist, src], env=env)
        tarballs = [f for f in os.listdir(sdist) if f.endswith(".tar.gz")]
        assert len(tarballs) == 1, tarballs
        run([os.path.join(venv2, "bin", "pip"), "install", "--no-build-isolation", "--no-index",
             "--force-reinstall", os.path.join(sdist, tarballs[0])], env=env)
        round_trip(venv2, srv.master, tmp)
        print("packaging: the wheel, pip install of the tree and of an sdist all work from a "
              "fresh environment")
        return 0
    finally:
        srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

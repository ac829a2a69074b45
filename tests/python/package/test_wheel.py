"""The self-contained wheel and the sdist that ``packaging/build.sh`` makes, proven rather than
assumed.

The wheel (built once per session: it compiles the whole core) is installed into a fresh
virtualenv and used inside a bubblewrap sandbox in which the system's ``libhiredis.so*``,
``libssl.so*`` and ``libcrypto.so*`` are bind-mounted over with empty files, so that any
library the wheel failed to carry in ``redcount.libs/`` fails to load. Python's own ``ssl``
module links the system's OpenSSL, so it is gone in the sandbox too: ``import redcount``,
the ``redcount`` command and both ``redis://`` and ``rediss://`` (TLS is the core's, on the
OpenSSL inside the wheel) must do without it. The counter and limiter run against real
redis-server processes started outside the sandbox (plain and TLS-only, with
tests/tls/make_certs.sh's certificates).

The sdist, installed in a sandbox without the build packages' headers (hiredis, OpenSSL),
must fail with the one CMake message that names the packages to install.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REDIS_SERVER, RedisServer
from redcount.tools.servers import Tls

ROOT = Path(__file__).resolve().parents[3]
BUILD_SH = ROOT / "packaging" / "build.sh"
TOOLS = ROOT / "build" / "packaging" / "venv" / "bin"  # build.sh's own virtualenv
HIDDEN_LIBRARIES = ("hiredis", "ssl", "crypto")

pytestmark = [pytest.mark.wheel, pytest.mark.slow]


def _require(tool: str, package: str) -> str:
    found = shutil.which(tool)
    if found is None:
        pytest.fail(f"{tool} not found on PATH (apt-get install {package}): the wheel test needs it", pytrace=False)
    return found


@dataclass
class Dist:
    wheel: Path
    sdist: Path
    seconds: float  # how long packaging/build.sh took


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    """packaging/build.sh's repaired wheel and sdist, built once per session into a temporary
    folder. Its build directory (build/packaging/) is its own, not the test command's
    `pip install .` one (an isolated build and this one would rebuild each other's objects);
    it and ccache, when installed, keep a rebuild short."""
    out = tmp_path_factory.mktemp("dist")
    env = {**os.environ, "DIST": str(out), "PYTHON": sys.executable}
    env.pop("PYTHONPATH", None)
    started = time.monotonic()
    done = subprocess.run(["bash", str(BUILD_SH)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, f"packaging/build.sh failed:\n{done.stdout[-6000:]}\n{done.stderr[-6000:]}"
    wheels = sorted(out.glob("redcount-*manylinux*.whl"))
    sdists = sorted(out.glob("redcount-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in out.iterdir())
    return Dist(wheels[0], sdists[0], time.monotonic() - started)


@pytest.fixture(scope="session")
def wheel_venv(dist: Dist, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the repaired wheel installed (and nothing else)."""
    venv = tmp_path_factory.mktemp("wheel-venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index", "--disable-pip-version-check",
         str(dist.wheel)],
        check=True, timeout=300, env=_clean_env(venv),
    )
    return venv


def _clean_env(venv: Path | None = None, home: Path | None = None) -> dict[str, str]:
    """No PYTHONPATH (the source tree must not stand in for the installed wheel), no
    LD_LIBRARY_PATH."""
    path = "/usr/local/bin:/usr/bin:/bin"
    env = {"PATH": f"{venv / 'bin'}:{path}" if venv else path, "LANG": "C.UTF-8"}
    if home is not None:
        env["HOME"] = str(home)
    return env


# --- the sandbox ----------------------------------------------------------------------------


def _library_dirs() -> list[str]:
    dirs = {"/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib"}
    multiarch = sysconfig.get_config_var("MULTIARCH")
    if multiarch:
        dirs |= {f"/lib/{multiarch}", f"/usr/lib/{multiarch}", f"/usr/local/lib/{multiarch}"}
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    if os.path.exists(ldconfig):
        listing = subprocess.run([ldconfig, "-p"], capture_output=True, text=True).stdout
        dirs |= {os.path.dirname(line.rsplit("=>", 1)[1].strip()) for line in listing.splitlines() if "=>" in line}
    return sorted(d for d in dirs if os.path.isdir(d))


def system_libraries(names: Sequence[str] = HIDDEN_LIBRARIES) -> list[str]:
    """Every file (symlinks resolved) that is a ``lib<name>.so*`` in the loader's directories."""
    found = {
        os.path.realpath(p)
        for d in _library_dirs()
        for name in names
        for p in glob.glob(os.path.join(d, f"lib{name}.so*"))
    }
    return sorted(p for p in found if os.path.isfile(p))


def bwrap(cmd: Sequence[str], hide_files: Sequence[str] = (), hide_dirs: Sequence[str] = (), *,
          cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Runs ``cmd`` in a bubblewrap sandbox: the machine's file system, its network (the test's
    redis-servers listen on loopback), each of ``hide_files`` replaced by an empty file and
    each of ``hide_dirs`` by an empty directory."""
    empty = cwd / ".empty"
    empty.write_bytes(b"")
    args = [_require("bwrap", "bubblewrap"), "--bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--die-with-parent"]
    for f in hide_files:
        args += ["--ro-bind", str(empty), f]
    for d in hide_dirs:
        args += ["--tmpfs", d]
    args += ["--chdir", str(cwd), "--", *cmd]
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)


# --- servers --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_server(topology_certs: Path) -> Iterator[RedisServer]:
    """A TLS-only redis-server with make_certs.sh's server certificate."""
    files = Tls(cert=str(topology_certs / "server.pem"), key=str(topology_certs / "server.key"),
                ca=str(topology_certs / "ca.pem"))
    server = RedisServer(REDIS_SERVER, tls=files).start()
    try:
        yield server
    finally:
        server.cleanup()


USE_BOTH_SCHEMES = r"""
import json, sys
import redcount
from redcount import _core

out = {"file": redcount.__file__, "version": redcount.__version__, "core": _core.__file__,
       "ssl_loaded": "_ssl" in sys.modules, "testing": hasattr(_core, "_testing")}
for scheme, url in (("redis", sys.argv[1]), ("rediss", sys.argv[2])):
    store = redcount.connect(url, ssl_ca_certs=sys.argv[3] if scheme == "rediss" else None)
    counter = redcount.FixedWindowCounter(store, "wheel-" + scheme, window=3600)
    counts = [counter.incr("k"), counter.incr("k", 2), counter.incr("k", request_id="r1"),
              counter.incr("k", request_id="r1")]
    limiter = redcount.Limiter(store, "sliding-window")
    decisions = [bool(limiter.hit("3/hour", "wheel-" + scheme)) for _ in range(5)]
    out[scheme] = {"store": store.url, "counts": counts, "decisions": decisions}
    store.close()
print(json.dumps(out))
"""


# --- the tests ------------------------------------------------------------------------------


def test_the_wheel_holds_what_users_need_and_the_libraries(dist: Dist) -> None:
    names = zipfile.ZipFile(dist.wheel).namelist()
    libs = [n.split("/", 1)[1] for n in names if n.startswith("redcount.libs/")]
    for name in HIDDEN_LIBRARIES:
        assert any(lib.startswith(f"lib{name}") for lib in libs), (name, libs)
    assert "redcount/py.typed" in names and "redcount/_core.pyi" in names
    assert len([n for n in names if n.startswith("redcount/_core") and n.endswith(".so")]) == 1, names
    assert "redcount/_version.py" in names and "redcount/tools/cli.py" in names
    unwanted = [n for n in names if n.endswith((".pem", ".key", ".crt", ".pyc", ".cpp", ".h"))
                or "/tests/" in n or "__pycache__" in n]
    assert unwanted == []
    # The platform tag is a manylinux one, and auditwheel finds no library outside the policy.
    assert "-manylinux_" in dist.wheel.name, dist.wheel.name
    shown = subprocess.run([str(TOOLS / "auditwheel"), "show", "--json", str(dist.wheel)],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    assert report["external_libs"] == {}, report["external_libs"]  # nothing beyond the policy's set
    assert report["overall_tag"] in dist.wheel.name, report["overall_tag"]


def test_the_wheel_works_without_the_systems_hiredis_and_openssl(
    dist: Dist, wheel_venv: Path, redis_server: RedisServer, tls_server: RedisServer, topology_certs: Path,
    tmp_path: Path,
) -> None:
    hidden = system_libraries()
    assert any("libssl" in p for p in hidden) and any("libcrypto" in p for p in hidden), hidden
    python = str(wheel_venv / "bin" / "python")
    env = _clean_env(wheel_venv, home=tmp_path)

    def run(*cmd: str) -> subprocess.CompletedProcess[str]:
        return bwrap(cmd, hide_files=hidden, cwd=tmp_path, env=env)

    # The hiding works: the system's libraries no longer load, so neither does Python's ssl.
    probe = run(python, "-c", "import ctypes, sys\n"
                "for lib in sys.argv[1:]:\n"
                "    try: ctypes.CDLL(lib)\n"
                "    except OSError: print('hidden', lib)\n"
                "try: import ssl\n"
                "except ImportError: print('no ssl')\n", *hidden)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.count("hidden ") == len(hidden) and "no ssl" in probe.stdout, probe.stdout

    version = run(str(wheel_venv / "bin" / "redcount"), "--version")
    assert version.returncode == 0, version.stderr
    expected_version = dist.wheel.name.split("-")[1]
    assert version.stdout.strip() == f"redcount {expected_version}"

    demo = run(str(wheel_venv / "bin" / "redcount"), "demo", "--windows", "2", "--clients", "100")
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "memory://" in demo.stdout or "allowed" in demo.stdout, demo.stdout[-3000:]

    tls_url = f"rediss://localhost:{tls_server.port}/0"
    use = run(python, "-c", USE_BOTH_SCHEMES, redis_server.url, tls_url, str(topology_certs / "ca.pem"))
    assert use.returncode == 0, use.stdout[-3000:] + use.stderr[-3000:]
    out = json.loads(use.stdout.strip().splitlines()[-1])
    assert out["file"].startswith(str(wheel_venv)), out  # the wheel's, not the source tree's
    assert out["core"].startswith(str(wheel_venv)) and out["version"] == expected_version
    assert out["ssl_loaded"] is False and out["testing"] is False, out
    for scheme in ("redis", "rediss"):
        assert out[scheme]["counts"] == [1, 3, 4, 4], out
        assert out[scheme]["decisions"] == [True, True, True, False, False], out
    assert out["rediss"]["store"].startswith("rediss://"), out


def _dev_files() -> tuple[list[str], list[str]]:
    """What the build packages (libhiredis-dev, libssl-dev) add that a build looks for: the
    pkg-config files and the header folders. (Their unversioned ``lib*.so`` links are left:
    bubblewrap would mount over the runtime library they point to, which cmake itself needs.)"""
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    dirs = [d for base in ("/usr/include", "/usr/local/include") for sub in ("hiredis", "openssl", f"{multiarch}/openssl")
            if os.path.isdir(d := os.path.join(base, sub))]
    pc_dirs = {os.path.join(d, "pkgconfig") for d in _library_dirs()} | {"/usr/share/pkgconfig"}
    files = {os.path.realpath(p) for d in pc_dirs for pc in ("hiredis", "openssl", "libssl", "libcrypto")
             for p in glob.glob(os.path.join(d, f"{pc}.pc"))}
    return sorted(files), dirs


def test_the_sdist_holds_the_sources_and_no_tests(dist: Dist, tmp_path: Path) -> None:
    with tarfile.open(dist.sdist) as tar:
        names = [n.split("/", 1)[1] for n in tar.getnames() if "/" in n]
        # The "data" filter where this Python has it (3.11.4 and later; Debian 12 ships 3.11.2).
        if hasattr(tarfile, "data_filter"):
            tar.extractall(tmp_path, filter="data")
        else:
            tar.extractall(tmp_path)
    for needed in ("pyproject.toml", "CMakeLists.txt", "README.md", "LICENSE", "PKG-INFO",
                   "python/redcount/_version.py", "python/redcount/py.typed", "python/redcount/_core.pyi",
                   "bindings/module.cpp", "cpp/src/open_store.cpp"):
        assert needed in names, needed
    assert not [n for n in names if n.split("/")[0] in {"tests", "docs", "notebooks", ".ci", "build", "dist"}
                or n.endswith(".so")]
    # With the build packages present it configures (compiling is what pip install adds).
    src = next(tmp_path.glob("redcount-*"))
    configured = subprocess.run(
        ["cmake", "-S", str(src), "-B", str(tmp_path / "b"), "-DREDCOUNT_BUILD_PYTHON=OFF"],
        capture_output=True, text=True, timeout=300,
    )
    assert configured.returncode == 0, configured.stdout[-3000:] + configured.stderr[-3000:]


def test_the_sdist_without_the_build_packages_names_them(dist: Dist, tmp_path: Path) -> None:
    files, dirs = _dev_files()
    assert dirs, "no hiredis/OpenSSL headers found to hide"
    # build.sh's own virtualenv has the build requirements, so pip needs no index (the
    # sandbox hides nothing it needs for that).
    cmd = [str(TOOLS / "python"), "-m", "pip", "install", "--no-build-isolation", "--no-index", "--no-deps",
           "--no-cache-dir", "--disable-pip-version-check", "--target", str(tmp_path / "target"), str(dist.sdist)]
    done = bwrap(cmd, hide_files=files, hide_dirs=dirs, cwd=tmp_path, env=_clean_env(home=tmp_path), timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-3000:]
    assert output.count("CMake Error") == 1, output[-5000:]
    assert "Traceback" not in output, output[-5000:]
    for words in ("missing hiredis", "OpenSSL >= 3",
                  "Debian/Ubuntu:  apt-get install g++ pkg-config libhiredis-dev libssl-dev",
                  "Fedora/RHEL:    dnf install gcc-c++ pkgconf-pkg-config hiredis-devel openssl-devel",
                  "Alpine:         apk add g++ pkgconf hiredis-dev openssl-dev"):
        assert words in output, (words, output[-5000:])

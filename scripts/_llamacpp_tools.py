"""llama.cpp's own command-line tools, built once from the pinned llama-cpp-python's vendored tree.

The measuring scripts (scripts/compare_llamacpp, scripts/llama_bench_compare.py, scripts/load_bench) compare edgespec
with the llama.cpp it is built on, so the tools come from the same source: the sdist of the
llama-cpp-python version pinned in pyproject.toml. They are built with this CPU's flags
(`python -m edgespec.hardware --cmake-args`, never -DGGML_NATIVE=ON: on AMX CPUs the native build
segfaults in ggml_backend_amx_mul_mat) and otherwise llama.cpp's defaults (llamafile ON, weight
repacking, flash attention auto), into

    $EDGESPEC_HOME/llama.cpp-tools/<version>-<flags hash>/build/bin/

never into the repository. A `tools.json` stamp written after a successful build marks the
directory complete; an interrupted build resumes incrementally on the next call. A file lock keeps
two concurrent callers from building at the same time.

    python scripts/_llamacpp_tools.py        # build if needed, print the tool paths
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# llama-tokenize: checks that llama.cpp tokenizes the rendered chat text as edgespec does.
# There is no plain-decoding tool here that takes -t and prints a decode speed (llama-simple has
# no thread option; speculative-simple refuses --spec-type none), so plain runs use
# speculative-simple with an n-gram key that can never match (see compare_llamacpp).
# llama-server: the anchor for concurrent serving (scripts/load_bench --llama-server).
TOOLS = ("llama-speculative-simple", "llama-bench", "llama-tokenize", "llama-server")

# Not kernel settings: they keep the configure step off the network and skip what we do not build.
_FIXED_ARGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_APP=OFF",
)


class ToolsError(RuntimeError):
    pass


def _say(msg: str) -> None:
    print(f"[llama.cpp tools] {msg}", file=sys.stderr, flush=True)


def pinned_version() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    m = re.search(r"llama-cpp-python\s*==\s*([0-9][0-9.]*)", text)
    if not m:
        raise ToolsError("pyproject.toml pins no llama-cpp-python version")
    return m.group(1)


def cpu_cmake_args() -> list[str]:
    out = subprocess.run(
        [sys.executable, "-m", "edgespec.hardware", "--cmake-args"],
        capture_output=True, text=True, check=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    ).stdout.split()
    if any(a.upper() in ("-DGGML_NATIVE=ON", "-DGGML_NATIVE=1") for a in out):
        raise ToolsError("refusing -DGGML_NATIVE=ON: the native build crashes on AMX CPUs")
    return out


def cmake_args() -> list[str]:
    return cpu_cmake_args() + list(_FIXED_ARGS)


def _home() -> Path:
    from edgespec import paths

    return paths.home()


def tools_root() -> Path:
    return _home() / "llama.cpp-tools"


def build_dir(version: str, args: list[str]) -> Path:
    key = hashlib.sha256(f"{version}|{' '.join(args)}".encode()).hexdigest()[:12]
    return tools_root() / f"{version}-{key}"


def _sdist(version: str) -> Path:
    cache = tools_root() / "sdist"
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob(f"llama_cpp_python-{version}.tar.gz"))
    if found:
        return found[0]
    _say(f"downloading the llama-cpp-python {version} sdist")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
         f"llama-cpp-python=={version}", "-d", str(cache)],
        check=True, stdout=sys.stderr,
    )
    found = sorted(cache.glob(f"llama_cpp_python-{version}.tar.gz"))
    if not found:
        raise ToolsError(f"pip download left no llama_cpp_python-{version}.tar.gz in {cache}")
    return found[0]


def _extract_vendor(sdist: Path, dest: Path) -> None:
    prefix = f"{sdist.name[: -len('.tar.gz')]}/vendor/llama.cpp/"
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(sdist) as tar:
        members = []
        for m in tar.getmembers():
            if m.name.startswith(prefix) and (m.isfile() or m.isdir()):
                m.name = m.name[len(prefix):]
                if m.name:
                    members.append(m)
        tar.extractall(tmp, members=members)
    tmp.rename(dest)


def _read_stamp(d: Path) -> dict | None:
    try:
        stamp = json.loads((d / "tools.json").read_text())
    except (OSError, ValueError):
        return None
    if all(Path(stamp.get("tools", {}).get(t, "")).is_file() for t in TOOLS):
        return stamp
    return None


def ensure_tools() -> dict[str, Path]:
    """The tools' paths, building them first when this version + flags has no complete build."""
    version = pinned_version()
    args = cmake_args()
    d = build_dir(version, args)
    stamp = _read_stamp(d)
    if stamp:
        return {t: Path(p) for t, p in stamp["tools"].items()}
    d.mkdir(parents=True, exist_ok=True)
    with open(d / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building this very directory
        stamp = _read_stamp(d)
        if stamp:
            return {t: Path(p) for t, p in stamp["tools"].items()}
        src, build = d / "src", d / "build"
        if not (src / "CMakeLists.txt").is_file():
            shutil.rmtree(src, ignore_errors=True)
            _extract_vendor(_sdist(version), src)
        jobs = str(os.cpu_count() or 2)
        _say(f"building {' '.join(TOOLS)} (llama-cpp-python {version}, ~5 min on 2 cores) in {d}")
        _say("cmake " + " ".join(args))
        gen = ["-G", "Ninja"] if shutil.which("ninja") and not (build / "Makefile").exists() else []
        subprocess.run(["cmake", "-S", str(src), "-B", str(build), *gen, *args],
                       check=True, stdout=sys.stderr)
        subprocess.run(["cmake", "--build", str(build), "-j", jobs, "--target", *TOOLS],
                       check=True, stdout=sys.stderr)
        tools = {t: str(build / "bin" / t) for t in TOOLS}
        missing = [t for t, p in tools.items() if not Path(p).is_file()]
        if missing:
            raise ToolsError(f"the build produced no {', '.join(missing)} under {build / 'bin'}")
        (d / "tools.json").write_text(json.dumps(
            {"version": version, "cmake_args": args, "tools": tools}, indent=2) + "\n")
        return {t: Path(p) for t, p in tools.items()}


def tool(name: str) -> Path:
    return ensure_tools()[name]


if __name__ == "__main__":
    for name, path in ensure_tools().items():
        print(f"{name}\t{path}")

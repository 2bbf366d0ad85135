"""Running a Python script as one job of N processes under ``tessera launch`` (the tests of
test_launch.py): where the ``tessera`` binary is, whether this package can run as a rank, and
each rank's printed results.

The binary is ``$TESSERA_BIN``, else ``tessera`` on the PATH, else the repository's
``target/debug/tessera``; it and this package must be built with MPI (the ``mpi`` cargo
feature). Without them the tests skip, unless ``TESSERA_REQUIRE_LAUNCH=1`` (set by CI), which
makes a missing piece a failure."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from tessera._tessera import mpi_available

REPO = pathlib.Path(__file__).resolve().parents[2]
RESULT = "RESULT "  # the prefix of the line a rank prints its results on


def tessera_binary():
    for candidate in (os.environ.get("TESSERA_BIN"), shutil.which("tessera"),
                      str(REPO / "target" / "debug" / "tessera")):
        if candidate and os.path.isfile(candidate):
            return candidate
    return None


def require_launch():
    """Skips (or, under ``TESSERA_REQUIRE_LAUNCH=1``, fails) when no MPI-enabled binary and
    package are at hand."""
    missing = []
    if tessera_binary() is None:
        missing.append("no tessera binary ($TESSERA_BIN, PATH, target/debug)")
    if not mpi_available():
        missing.append("this tessera package was built without the mpi feature")
    if missing:
        reason = "; ".join(missing)
        if os.environ.get("TESSERA_REQUIRE_LAUNCH") == "1":
            pytest.fail(reason)
        pytest.skip(reason)


def run(script, nproc, tmp_path, env=None, timeout=600):
    """Runs ``script`` (a path) as ``nproc`` ranks under ``tessera launch``, or alone when
    ``nproc`` is None; returns the completed process (stdout and stderr as text)."""
    cmd = [sys.executable, str(script)]
    if nproc is not None:
        cmd = [tessera_binary(), "launch", "--nproc", str(nproc), "--log_dir",
               str(tmp_path / f"logs_{nproc}"), "--"] + cmd
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env,
                          cwd=tmp_path)


def results(proc):
    """``{rank: result}`` from the ``RESULT {json}`` lines the ranks printed (``[worker r] ``
    prefixes under the launcher)."""
    out = {}
    for line in proc.stdout.splitlines():
        if line.startswith("[worker "):
            line = line.split("] ", 1)[1]
        if line.startswith(RESULT):
            value = json.loads(line[len(RESULT):])
            out[value["rank"]] = value
    return out

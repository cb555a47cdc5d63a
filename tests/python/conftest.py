"""Fixtures of the Python package's tests: the models scripts/get-model fetched, the C++ oracle,
a redis-server on a loopback port."""

import json
import os
import shutil
import socket
import subprocess
import time

import pytest


def model_path(name="smollm2"):
    """The fetched model's path, or None (RELOKV_MODEL_DIR or ~/.cache/relokv)."""
    files = {
        "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "qwen2.5-0.5b": "Qwen2.5-Coder-0.5B-Instruct.gguf",
        "gemma3-270m": "gemma-3-270m-q4_k_m.gguf",
    }
    d = os.environ.get("RELOKV_MODEL_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "relokv")
    p = os.path.join(d, files[name])
    return p if os.path.isfile(p) and os.path.getsize(p) > 0 else None


def need(what, ok):
    """Skips without `what`, but fails under CI=true, where the scripts provide everything."""
    if ok:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is missing (CI=true: the scripts install and fetch it)")
    pytest.skip(f"no {what}")


@pytest.fixture
def smollm2():
    p = model_path("smollm2")
    need("SmolLM2 (scripts/get-model smollm2)", p)
    return p


def run_oracle(tmp_path, spec):
    """What the C++ oracle (relokv_py_oracle) prints for `spec`."""
    exe = os.environ.get("RELOKV_PY_ORACLE")
    need("relokv_py_oracle (run through ctest)", exe and os.path.exists(exe))
    f = tmp_path / "spec.json"
    f.write_text(json.dumps(spec))
    out = subprocess.run([exe, str(f)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture
def redis_url():
    """A redis-server of its own on a free loopback port, stopped after the test."""
    exe = shutil.which("redis-server")
    need("redis-server", exe)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    p = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.025)
        yield f"redis://127.0.0.1:{port}"
    finally:
        p.terminate()
        p.wait(timeout=10)

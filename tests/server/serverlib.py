"""Starting and stopping relokv_server (and redis-server) for the tests and the load client.

Every process listens on loopback only, on a port the kernel picks, and is stopped by the
fixture that started it (SIGTERM, then SIGKILL after a bound)."""
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def server_binary():
    b = os.environ.get("RELOKV_SERVER_BIN")
    if b and os.path.exists(b):
        return b
    for d in ("build-cold", "build"):
        p = os.path.join(ROOT, d, "examples", "server", "relokv_server")
        if os.path.exists(p):
            return p
    return None


def model_path(name="SmolLM2-135M-Instruct.Q4_1.gguf"):
    m = os.environ.get("RELOKV_MODEL")
    if m and os.path.exists(m):
        return m
    d = os.environ.get("RELOKV_MODEL_DIR", os.path.join(os.path.expanduser("~"), ".cache", "relokv"))
    p = os.path.join(d, name)
    return p if os.path.exists(p) else None


class Server:
    """relokv_server on 127.0.0.1 and a free port; `url` is its /v1 base."""

    def __init__(self, *args, model=None, timeout=120, env=None):
        self.log = tempfile.NamedTemporaryFile("w+", prefix="relokv_server_", suffix=".log",
                                               delete=False)
        cmd = [server_binary(), "--model", model or model_path(), "--host", "127.0.0.1",
               "--port", "0", *map(str, args)]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})
        deadline = time.time() + timeout
        self.port = None
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("relokv_server exited: " + self.output())
            m = re.search(r"listening on (https?)://127\.0\.0\.1:(\d+)", self.output())
            if m:
                self.scheme, self.port = m.group(1), int(m.group(2))
                break
            time.sleep(0.05)
        if self.port is None:
            self.stop()
            raise RuntimeError("relokv_server did not start: " + self.output())
        self.base = f"{self.scheme}://127.0.0.1:{self.port}"
        m = re.search(r"metrics on http://127\.0\.0\.1:(\d+)", self.output())
        self.metrics_port = int(m.group(1)) if m else None
        self.url = self.base + "/v1"

    def output(self):
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def get(self, path):
        with urllib.request.urlopen(self.base + path, timeout=30) as r:
            return r.read().decode()

    def metric(self, name):
        """The value of a metric line `name` (with its labels, if any), or None."""
        for line in self.get("/metrics").splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        return None

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stop(self, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    """redis-server on 127.0.0.1 and a free port, no persistence."""

    def __init__(self):
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed")
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="relokv_redis_")
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("redis-server did not start")

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class SlowProxy:
    """A TCP proxy on loopback to 127.0.0.1:`port` that answers every command `delay` seconds
    late (a reply is not forwarded before `delay` after the command that asked for it): a
    distant or loaded store server. `delay` may change while it runs."""

    def __init__(self, port, delay=0.0):
        self.delay = delay
        self.upstream = port
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.conns = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def _accept(self):
        while not self.closed:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            u = socket.create_connection(("127.0.0.1", self.upstream))
            self.conns += [c, u]
            asked = [0.0]  # when the client last sent a command
            threading.Thread(target=self._pump, args=(c, u, asked, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(u, c, asked, True), daemon=True).start()

    def _pump(self, src, dst, asked, reply):
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                if not reply:
                    asked[0] = time.time()
                elif self.delay:
                    wait = asked[0] + self.delay - time.time()
                    if wait > 0:
                        time.sleep(wait)
                dst.sendall(data)
        except OSError:
            pass
        for x in (src, dst):
            try:
                x.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def stop(self):
        self.closed = True
        self.sock.close()
        for c in self.conns:
            try:
                c.close()
            except OSError:
                pass

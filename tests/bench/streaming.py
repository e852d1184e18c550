"""Shared pieces of the streaming benchmarks (tests/bench/isolation, tests/bench/soak).

Standard library only: child processes in their own process groups, a
policy folder with two tenants of our making, a streaming OpenAI client that
times every SSE chunk, /metrics parsing and /proc readings.
"""
from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TARGET_DIR = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
RESULTS_DIR = REPO / "target" / "bench-results"
QUIET = REPO.parent / "shared" / "tools" / "quiet"
MODEL_NAME = "bulkhead-demo-tiny"
STARTUP_TIMEOUT_S = 180
# Each tenant's [limits]: far out of reach, so the gateway admits everything
# (every check still runs) and what we measure is the gpu-host.
OPEN_LIMITS = """
[limits]
requests_per_s = 1000000
burst = 1000000
tokens_per_min = 1000000000000
max_concurrent = 100000
max_tokens = 512
"""


def log(name: str, msg: str) -> None:
    print(f"{name}: {msg}", file=sys.stderr, flush=True)


class Failure(Exception):
    """A component did not start or answered wrongly: the run is void."""


# ---------------------------------------------------------------- processes

class Processes:
    """Every child we start, each in its own process group, stopped on exit."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.children: list[tuple[str, subprocess.Popen]] = []

    def start(self, label: str, argv: list[str], log_path: Path, stdout_path: Path) -> subprocess.Popen:
        log(self.name, f"starting {label}: {' '.join(argv)}")
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=open(stdout_path, "ab"),
                                stderr=open(log_path, "ab"), start_new_session=True, cwd=REPO)
        self.children.append((label, proc))
        return proc

    def stop(self, proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            log(self.name, f"pid {proc.pid} ignored SIGTERM; killing its group")
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        # The gateway's gpu-host child shares its group.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.children = [(n, p) for n, p in self.children if p is not proc]

    def stop_all(self) -> None:
        for _, proc in reversed(list(self.children)):
            self.stop(proc)


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_for_line(proc: subprocess.Popen, out: Path, pattern: str, log_path: Path) -> re.Match:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise Failure(f"exited with {proc.returncode} before it was ready:\n{tail(log_path)}")
        try:
            m = re.search(pattern, out.read_text(errors="replace"), re.MULTILINE)
            if m:
                return m
        except FileNotFoundError:
            pass
        time.sleep(0.1)
    raise Failure(f"not ready after {STARTUP_TIMEOUT_S} s:\n{tail(log_path)}")


def http_get(port: int, path: str, token: str | None = None, timeout: float = 10) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    finally:
        conn.close()


def wait_ready(port: int, proc: subprocess.Popen, log_path: Path, admin: int) -> None:
    """Waits for /readyz (the gpu-host is up) and for the model to be listed
    in the metrics of the admin listener on port `admin`."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise Failure(f"gateway exited with {proc.returncode}:\n{tail(log_path)}")
        try:
            status, _ = http_get(port, "/readyz")
            if status == 200:
                status, text = http_get(admin, "/metrics")
                if re.search(rf'bulkhead_model_serving\{{[^}}]*model="{MODEL_NAME}"[^}}]*\}} 1', text):
                    return
        except OSError:
            pass
        time.sleep(0.25)
    raise Failure(f"gateway not ready after {STARTUP_TIMEOUT_S} s:\n{tail(log_path)}")


def children_of(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def wait_quiet(name: str, max_wait: str = "300", load: str = "0.5") -> str:
    """Waits (bounded) for a calm machine with ../shared/tools/quiet; returns its line."""
    if not QUIET.exists():
        return f"quiet: {QUIET} missing; start load {loadavg()}"
    done = subprocess.run([str(QUIET), "--max-wait", max_wait, "--load", load, "--", "true"],
                          capture_output=True, text=True)
    line = " | ".join(done.stderr.strip().splitlines()[-2:])
    log(name, line)
    return line


# ---------------------------------------------------------------- policies

@dataclass
class Tenant:
    id: str
    gpu: str = ""  # a `[gpu]` table, or "" for none
    token: str = ""
    # An operator token (partitions:read), the same for every tenant.
    admin_token: str = ""


def write_policies(tmp: Path, bulkhead: Path, tenants: list[Tenant], host: str) -> Path:
    """A copy of the repo's policies/ with the demo tenant replaced by
    `tenants` (each with its own Ed25519 JWT key, limits out of reach) and
    `host` (a `[local_gpu_host]` or `[upstream]` section with its models)
    in place of the repo's. Tokens are minted into each Tenant."""
    policies = tmp / "policies"
    if policies.exists():
        shutil.rmtree(policies)
    shutil.copytree(REPO / "policies", policies, ignore=shutil.ignore_patterns("*.example"))
    (policies / "tenants" / "demo.toml").unlink()
    keys = policies / "bench-keys"
    keys.mkdir()
    for t in tenants:
        subprocess.run([str(bulkhead), "token", "keygen", "--out", str(keys / t.id)], check=True,
                       capture_output=True)
        (policies / "tenants" / f"{t.id}.toml").write_text(
            f'id = "{t.id}"\nclass = "standard"\nmodels = ["{MODEL_NAME}"]\n\n'
            f'[jwt]\nissuer = "bench-{t.id}"\naudience = ["bulkhead"]\nalgorithms = ["EdDSA"]\n'
            f'public_keys = ["bench-keys/{t.id}.pub.pem"]\n'
            f'dev_signing_key = "bench-keys/{t.id}.key.pem"\n'
            + OPEN_LIMITS + ("\n" + t.gpu if t.gpu else ""))
    gateway = policies / "gateway.toml"
    # The operator API and /metrics on a port of the bench's own (the
    # default 8081 may be taken); admin_port() reads it back.
    gateway.write_text(drop_tables(gateway.read_text(), ("upstream", "local_gpu_host", "admin"))
                       + f'\n[admin]\nlisten = "127.0.0.1:{free_port()}"\n' + host)
    check = subprocess.run([str(bulkhead), "policy", "check", str(policies)],
                           capture_output=True, text=True)
    if check.returncode != 0:
        raise Failure(f"bulkhead policy check refused the bench policies:\n{check.stdout}{check.stderr}")
    operator = issue(bulkhead, policies, None, ["partitions:read"])
    for t in tenants:
        t.token = issue(bulkhead, policies, t.id, ["inference"])
        t.admin_token = operator
    return policies


def admin_port(policies: Path) -> int:
    """The admin listener's port `write_policies` put in gateway.toml."""
    m = re.search(r'^\[admin\]\s*\nlisten = "127\.0\.0\.1:(\d+)"',
                  (policies / "gateway.toml").read_text(), re.M)
    if not m:
        raise Failure("gateway.toml has no [admin] listen on 127.0.0.1")
    return int(m.group(1))


def issue(bulkhead: Path, policies: Path, tenant: str | None, scopes: list[str]) -> str:
    """A token for `tenant`, or an operator token when `tenant` is None."""
    who = ["--tenant", tenant] if tenant else ["--operator"]
    done = subprocess.run([str(bulkhead), "token", "issue", "--policies", str(policies),
                           *who, "--ttl", "1d", "--scope", *scopes],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise Failure(f"bulkhead token issue failed:\n{done.stderr}")
    return done.stdout.strip()


def model_entry(section: str) -> str:
    model_dir = REPO / "models" / MODEL_NAME
    return (f'\n[[{section}.models]]\nname = "{MODEL_NAME}"\n'
            f'dir = "{model_dir}"\nsignature = "{model_dir}.sig"\n')


def drop_tables(toml_text: str, names: tuple[str, ...]) -> str:
    """`toml_text` without the tables `names` and their sub-tables."""
    out, skipping = [], False
    for line in toml_text.splitlines():
        m = re.match(r"\s*\[\[?\s*([A-Za-z0-9_.\-\"]+)\s*\]\]?", line)
        if m:
            skipping = m.group(1).strip('"').split(".")[0] in names
        if not skipping:
            out.append(line)
    return "\n".join(out) + "\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- client

@dataclass
class Sample:
    """One streamed request as the client saw it (times in seconds from its start)."""
    tenant: str
    start: float  # time.monotonic() when sent
    status: int = 0
    ttft_s: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    end: float = 0.0
    error: str = ""
    disconnected: bool = False

    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])]

    def as_json(self) -> dict:
        return {"tenant": self.tenant, "start": self.start, "status": self.status,
                "ttft_s": self.ttft_s, "chunk_times_s": [round(t, 6) for t in self.chunk_times],
                "completion_tokens": self.completion_tokens, "duration_s": self.end - self.start,
                "error": self.error, "disconnected": self.disconnected}


class Client:
    """One keep-alive HTTP/1.1 connection to the gateway."""

    def __init__(self, port: int, token: str) -> None:
        self.port, self.token = port, token
        self.conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self.conn:
            self.conn.close()
            self.conn = None

    def complete(self, tenant: str, body: dict, stop_after_chunks: int | None = None) -> Sample:
        """POSTs /v1/completions; streams if `body["stream"]`. With
        `stop_after_chunks`, closes the connection after that many text
        chunks (a client going away mid-stream)."""
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
            self.conn.connect()
            self.conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sample = Sample(tenant=tenant, start=time.monotonic())
        t0 = time.perf_counter()
        try:
            self.conn.request("POST", "/v1/completions", json.dumps(body),
                              {"Authorization": f"Bearer {self.token}",
                               "Content-Type": "application/json"})
            resp = self.conn.getresponse()
            sample.status = resp.status
            if resp.status != 200:
                sample.error = resp.read().decode(errors="replace")[:300]
            elif not body.get("stream"):
                whole = json.loads(resp.read())
                sample.completion_tokens = whole["usage"]["completion_tokens"]
            else:
                for raw in resp:
                    line = raw.strip()
                    if not line.startswith(b"data: "):
                        continue
                    data = line[6:]
                    if data == b"[DONE]":
                        resp.read()  # the chunked body's end, so the connection is reusable
                        break
                    event = json.loads(data)
                    if "error" in event:
                        sample.error = json.dumps(event["error"])[:300]
                        self.close()
                        break
                    if event.get("usage"):
                        sample.completion_tokens = event["usage"]["completion_tokens"]
                    choices = event.get("choices") or []
                    if choices and choices[0].get("text"):
                        now = time.perf_counter() - t0
                        if sample.ttft_s is None:
                            sample.ttft_s = now
                        sample.chunk_times.append(now)
                        if stop_after_chunks is not None and len(sample.chunk_times) >= stop_after_chunks:
                            sample.disconnected = True
                            self.close()
                            break
        except (OSError, http.client.HTTPException, ValueError) as e:
            sample.error = f"{type(e).__name__}: {e}"
            self.close()
        sample.end = time.monotonic()
        return sample


# ---------------------------------------------------------------- statistics

def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * p // 100))
    return ordered[int(rank) - 1]


def ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f}"


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def metric_values(text: str, name: str) -> dict[str, float]:
    """Every sample of Prometheus metric `name` in `text`, keyed by its label set."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name) and (len(line) == len(name) or line[len(name)] in " {"):
            key, _, value = line.rpartition(" ")
            out[key[len(name):]] = float(value)
    return out

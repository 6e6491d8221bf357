"""Starts `vllm serve` (as `python -m vllm.entrypoints.openai.api_server`: the
`vllm` console script fails with the CPU wheel) on a local random model, for
tests and benchmarks. Loopback only."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Optional, Sequence

from . import models


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(proc: subprocess.Popen, url: str, what: str, patience_sec: float) -> None:
    """Polls `url`/health until it answers 200; raises if `proc` exits first
    or `patience_sec` passes."""
    deadline = time.monotonic() + patience_sec
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} (see its log)")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{what} did not become healthy")


class Server:
    def __init__(
        self,
        gate: bool,
        size: str = "tiny",
        num_blocks: int = 400,
        config: str = "",
        log_path: Optional[str] = None,
        env: Optional[dict[str, str]] = None,
        extra_args: Sequence[str] = (),
        port: Optional[int] = None,
    ) -> None:
        """`env`: variables set for the server on top of this process's
        (e.g. KVGATE_VLLM_REFUSE_NEW); `extra_args`: more `vllm serve` flags;
        `port`: a fixed port (default: a free one)."""
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        model = models.make_model(size)
        self.model = str(model)
        server_env = dict(os.environ)
        server_env["KVGATE_VLLM_GATE"] = "1" if gate else "0"
        server_env["KVGATE_VLLM_CONFIG"] = config
        server_env.setdefault("VLLM_PLUGINS", "kvgate")
        server_env.update(env or {})
        cmd = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.model, "--host", "127.0.0.1", "--port", str(self.port),
            "--skip-tokenizer-init", "--enable-prefix-caching", "--block-size", "32",
            "--num-gpu-blocks-override", str(num_blocks), "--max-model-len", "8192",
            "--max-num-batched-tokens", "2048", "--max-num-seqs", "64",
            "--gpu-memory-utilization", "0.3", "--enforce-eager", *extra_args,
        ]  # fmt: skip
        self.log = open(log_path or os.devnull, "wb")
        self.proc = subprocess.Popen(cmd, env=server_env, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, patience_sec: float = 600.0) -> None:
        wait_healthy(self.proc, self.url, "vllm serve", patience_sec)

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            return r.read().decode()

    def kill(self) -> None:
        """SIGKILL to the server and every process under it (engine core,
        workers, resource tracker): a replica that dies (the scale-out fault
        tests). stop() afterwards only closes the log. (Not a process group of
        its own: `vllm serve` started with start_new_session=True answered
        /metrics seconds late while a request streamed.)"""
        import psutil  # a vLLM dependency

        try:
            victims = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            victims = []
        for p in victims:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        self.proc.wait()
        psutil.wait_procs(victims, timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    from prometheus_client.parser import text_string_to_metric_families

    total, seen = 0.0, False
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
                seen = True
    if not seen:
        raise KeyError(name)
    return total


def metric_or_zero(text: str, name: str, **labels: str) -> float:
    """`metric`, or 0 where no sample has that name (kvgate's families
    appear once the first gated request has made the gate)."""
    try:
        return metric(text, name, **labels)
    except KeyError:
        return 0.0

"""Starts vLLM's router (`vllm-router`, installed by scripts/install-router.sh
into its own venv) in front of `vllm serve` replicas, for the scale-out tests
and benchmark. Loopback only.

The policy is `consistent_hash` unless told otherwise, whose first key is the
`X-Session-ID` header: every turn of a session goes to one replica while that
replica is healthy. `sticky_least_loaded` sends a new session to the replica
with the fewest sessions the router has placed and keeps it there.
Retries and the circuit breaker are off, so a replica's answer (a 429 of the
refusal mode included) reaches the client as it is, and a replica is taken
out only by its failed health checks.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
from typing import Optional, Sequence

from .launcher import free_port, wait_healthy

ROUTER_ENV = "KVGATE_ROUTER_VENV"


def router_binary() -> pathlib.Path:
    """$KVGATE_ROUTER_VENV/bin/vllm-router (default venv
    $HOME/.cache/kvgate/router-venv). Missing: an error naming the install
    script, never a skip."""
    venv = os.environ.get(ROUTER_ENV) or str(pathlib.Path.home() / ".cache" / "kvgate" / "router-venv")
    path = pathlib.Path(venv) / "bin" / "vllm-router"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no router; run scripts/install-router.sh (or set {ROUTER_ENV})")
    return path


class Router:
    def __init__(
        self,
        workers: Sequence[str],
        log_path: Optional[str] = None,
        health_check_interval_sec: int = 1,
        extra_args: Sequence[str] = (),
        policy: str = "consistent_hash",
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [
            str(router_binary()), "--host", "127.0.0.1", "--port", str(self.port),
            "--worker-urls", *workers, "--policy", policy,
            "--disable-retries", "--disable-circuit-breaker",
            "--health-check-interval-secs", str(health_check_interval_sec),
            "--health-failure-threshold", "1", "--prometheus-port", str(free_port()),
            "--log-level", "info", *extra_args,
        ]  # fmt: skip
        self.log = open(log_path or os.devnull, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, patience_sec: float = 300.0) -> None:
        wait_healthy(self.proc, self.url, "vllm-router", patience_sec)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

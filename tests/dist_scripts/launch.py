"""Runs a script under torchrun on loopback, bounded in time, leaving nothing behind."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(script: str, *args: str, nproc: int = 2, timeout: float = 180,
             torchrun_args: Optional[List[str]] = None,
             env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node nproc script args`` over 127.0.0.1 (``script``
    in this directory, or a path). The whole
    process group (torchrun and its workers) is killed if it outlives
    ``timeout``, which raises ``subprocess.TimeoutExpired``."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.setdefault("OMP_NUM_THREADS", "1")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
               "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
               *(torchrun_args or []), str(SCRIPTS / script), *args]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=full_env, start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    finally:
        try:  # workers that outlived torchrun (they share its session)
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def per_process(path: Path, nproc: int, **load_args: Any) -> List[Any]:
    """What each process of a script saved to ``{path}.{rank}``. The scripts
    save their results each to its own file rather than gathering them with
    ``all_gather_object`` at the end: gloo's worker thread may let go of that
    collective's tensors while the interpreter finalises, and taking the GIL
    to free them then aborts the process (PyTorch's own hazard, seen in these
    tests; poptorch's collectives on ipu tensors are kept from it)."""
    return [torch.load(f"{path}.{rank}", **load_args) for rank in range(nproc)]


def processes(script: str, *args: str, nproc: int = 2, timeout: float = 180,
              wait_for: int = 0) -> subprocess.CompletedProcess:
    """Starts ``nproc`` processes of ``script`` with torchrun's variables (no
    agent: none stops the others when one ends), waits for process
    ``wait_for`` at most ``timeout`` seconds, then kills them all and returns
    process ``wait_for``'s result."""
    port = str(free_port())
    started = []
    try:
        for rank in range(nproc):
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank),
                       WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
            env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
            started.append(subprocess.Popen([sys.executable, str(SCRIPTS / script), *args],
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                            text=True, env=env, start_new_session=True))
        out, err = started[wait_for].communicate(timeout=timeout)
        return subprocess.CompletedProcess(started[wait_for].args,
                                           started[wait_for].returncode, out, err)
    finally:
        for process in started:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.communicate()

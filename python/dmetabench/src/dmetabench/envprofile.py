"""Environment profile stored with every result set (seed 003 §3.2.6, §3.3.3)."""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import sys


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def mount_of(path: str) -> dict:
    """File system type, device and mount options of the mount holding `path`."""
    path = os.path.realpath(path)
    best = {"mountpoint": "/", "fstype": "unknown", "device": "", "options": ""}
    for line in _read("/proc/mounts").splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        dev, mnt, fstype, opts = parts[:4]
        mnt = mnt.replace("\\040", " ")
        inside = path == mnt or path.startswith(mnt.rstrip("/") + "/")
        if inside and len(mnt) >= len(best["mountpoint"]):
            best = {"mountpoint": mnt, "fstype": fstype, "device": dev, "options": opts}
    return best


def _versions() -> dict:
    v = {"python": sys.version.split()[0]}
    for mod in ("mpi4py", "matplotlib", "plusfs"):
        try:
            m = __import__(mod)
            v[mod] = getattr(m, "__version__", "present")
        except ImportError:
            pass
    if shutil.which("mpirun"):
        try:
            out = subprocess.run(
                ["mpirun", "--version"], check=False, capture_output=True, text=True, timeout=10
            ).stdout
            v["mpirun"] = out.splitlines()[0] if out else ""
        except (OSError, subprocess.TimeoutExpired):
            pass
    return v


def vmstat(seconds: int) -> str:
    """`vmstat 1 seconds`: system load before the run."""
    if seconds <= 0 or not shutil.which("vmstat"):
        return ""
    try:
        return subprocess.run(
            ["vmstat", "1", str(seconds)], check=False, capture_output=True, text=True, timeout=seconds + 10
        ).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"vmstat failed: {e}"


def collect(workdir: str, vmstat_seconds: int = 15) -> dict:
    """Hardware, OS, kernel, target file system, software versions, and vmstat output."""
    cpus = [
        line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines() if line.startswith("model name")
    ]
    mem = next(
        (line.split(":", 1)[1].strip() for line in _read("/proc/meminfo").splitlines() if line.startswith("MemTotal")),
        "",
    )
    os_release = dict(line.split("=", 1) for line in _read("/etc/os-release").splitlines() if "=" in line)
    target = workdir if os.path.exists(workdir) else os.path.dirname(os.path.abspath(workdir)) or "/"
    return {
        "host": socket.gethostname(),
        "cpu_model": cpus[0] if cpus else platform.processor(),
        "cpus": os.cpu_count(),
        "memory": mem,
        "os": os_release.get("PRETTY_NAME", "").strip('"'),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "workdir": workdir,
        "filesystem": mount_of(target),
        "versions": _versions(),
        "vmstat": vmstat(vmstat_seconds),
    }


def render(profiles: dict[str, dict]) -> str:
    """Human-readable text of the profiles of all nodes."""
    out = []
    for node, p in sorted(profiles.items()):
        fs = p.get("filesystem", {})
        out.append(f"== node {node}")
        out.append(f"cpu: {p.get('cpus')} x {p.get('cpu_model')}; memory {p.get('memory')}")
        out.append(f"os: {p.get('os')}; kernel {p.get('kernel')} ({p.get('machine')})")
        out.append(
            f"target: {p.get('workdir')} on {fs.get('mountpoint')} type {fs.get('fstype')} "
            f"({fs.get('device')}) options {fs.get('options')}"
        )
        out.append("versions: " + ", ".join(f"{k} {v}" for k, v in p.get("versions", {}).items()))
        if p.get("vmstat"):
            out.append("vmstat before the run:")
            out.append(p["vmstat"].rstrip())
    return "\n".join(out)

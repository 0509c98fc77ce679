"""The environment a run records, and which of its keys must match for two runs to compare.

One table (``ENVIRONMENT_KEYS``) says, for each key, its label and whether a difference refuses
a ``--resume`` (the two parts of one run must be comparable in every respect) or is warned about
by ``compare`` (two runs of different commits are compared on purpose; a different device or
torch changes what the comparison means).
"""

from __future__ import annotations

import hashlib
import os
import platform
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnbench._version import __version__
from attnbench.devices import cpu_model, device_name
from attnbench.vcs import git_output


@dataclass(frozen=True)
class EnvironmentKey:
    key: str
    label: str
    resume: bool  # a resumed run must match it (else refused without --force)
    compare: bool  # compare warns when the two runs differ in it


ENVIRONMENT_KEYS: tuple[EnvironmentKey, ...] = (
    EnvironmentKey("attnbench_version", "attnbench", resume=True, compare=False),
    EnvironmentKey("device_name", "device", resume=True, compare=True),
    EnvironmentKey("torch_version", "torch", resume=True, compare=True),
    EnvironmentKey("cuda_version", "CUDA", resume=True, compare=True),
    EnvironmentKey("cudnn_version", "cuDNN", resume=True, compare=True),
    EnvironmentKey("torch_threads", "threads", resume=True, compare=True),
    EnvironmentKey("python_version", "Python", resume=True, compare=False),
    EnvironmentKey("hostname", "host", resume=True, compare=False),
    EnvironmentKey("cpu_model", "CPU", resume=True, compare=False),
    EnvironmentKey("git_commit", "commit", resume=True, compare=False),
    EnvironmentKey("code_digest", "attnbench's code", resume=True, compare=False),
)


def changes(before: Mapping[str, Any], after: Mapping[str, Any], keys: Any) -> dict[str, list[Any]]:
    """``{key: [before, after]}`` for each of ``keys`` whose value differs."""
    return {
        key: [before.get(key), after.get(key)] for key in keys if before.get(key) != after.get(key)
    }


def resume_keys() -> list[str]:
    return [k.key for k in ENVIRONMENT_KEYS if k.resume]


def key_labels() -> dict[str, str]:
    """Every recorded key's name as a line says it ("attnbench's code" for code_digest)."""
    return {k.key: k.label for k in ENVIRONMENT_KEYS}


def compare_keys() -> dict[str, str]:
    return {k.key: k.label for k in ENVIRONMENT_KEYS if k.compare}


def git_info(where: Path) -> dict[str, Any]:
    """Commit and dirty flag of the git checkout holding ``where`` (None outside one)."""
    commit = git_output(where, "rev-parse", "HEAD", timeout=5)
    if commit is None:
        return {"git_commit": None, "git_dirty": None}
    status = git_output(where, "status", "--porcelain", "--untracked-files=no", timeout=5)
    return {"git_commit": commit.strip(), "git_dirty": bool(status and status.strip())}


# What a sweep's times do not depend on: how the terminal shows them and how charts draw them.
NOT_MEASURING = ("cli", "render")


def code_digest(root: Path | None = None) -> str:
    """The sha256 of the package's source but the terminal's and the charts'
    (``NOT_MEASURING``), by path and bytes: attnbench's own code, as a plugin's sha256 is the
    plugin's. Two sweeps with the same digest ran the same code, committed or not; a commit of
    docs or tests keeps it, an edit to the fits or the loader starts anew with the timing's
    (``results.reruns``: a case's history across sweeps). A file that cannot be read (an
    editor's dangling lock link) is left out."""
    package = root or Path(__file__).resolve().parent.parent
    found = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        if relative.parts[0] in NOT_MEASURING:
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        found.update(relative.as_posix().encode() + b"\0")
        found.update(data + b"\0")
    return found.hexdigest()


def environment(device: str = "cpu") -> dict[str, Any]:
    """What a reader needs to trust or reproduce a run: versions, hardware, threads, commit.

    The git commit is that of the checkout attnbench runs from (the layers measured live there).
    """
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "attnbench_version": __version__,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": device,
        "device_name": device_name(device),
        "cuda_version": torch.version.cuda,
        "cudnn_version": cudnn,
        "cuda_device_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        **git_info(Path(__file__).resolve().parent),
        "code_digest": code_digest(),
    }

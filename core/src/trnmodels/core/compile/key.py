"""The cache key: everything that changes what a graph computes or how it is compiled.

Model config, runtime config, the graph's phase and bucket, dtype, torch version, compiler flags, and
a digest of the source of core and the plugin that the graph runs. Not the rank: every rank runs the
same graph with the rank as an input, so all ranks share one entry.
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

# Fields that do not change the graph: where the config was read from, which transformers wrote it, and
# the checkpoint's storage dtype (the runtime dtype is part of the key on its own).
VOLATILE_CONFIG_FIELDS = ("_name_or_path", "transformers_version", "_commit_hash", "dtype", "torch_dtype")


@functools.cache
def source_digest(*packages: ModuleType) -> str:
    """sha256 over every ``.py`` file of the given packages (relative paths and contents)."""
    digest = hashlib.sha256()
    for package in packages:
        root = Path(next(iter(package.__path__)))
        for path in sorted(root.rglob("*.py")):
            digest.update(f"{package.__name__}/{path.relative_to(root)}".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def model_config_fingerprint(config_dict: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config_dict.items() if k not in VOLATILE_CONFIG_FIELDS}


def cache_key(
    *,
    model_config: dict[str, Any],
    runtime_config: dict[str, Any],
    graph: str,
    bucket: tuple[int, ...],
    dtype: str,
    compiler_flags: dict[str, Any],
    source: str,
) -> tuple[str, dict[str, Any]]:
    """``(key, fields)``: the key is a sha256 prefix of the canonical JSON of ``fields``."""
    fields = {
        "model_config": model_config_fingerprint(model_config),
        "runtime_config": runtime_config,
        "graph": graph,
        "bucket": list(bucket),
        "dtype": dtype,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "compiler_flags": compiler_flags,
        "source": source,
    }
    blob = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:40], fields

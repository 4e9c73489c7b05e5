"""A compile's manifest: the cache keys a checkpoint's graphs resolved to, so a warm compile skips transformers.

A graph's key hashes the config as transformers reads it, and building a transformers config imports
most of transformers: 4 of the 7.5 s a warm, all-hits ``trnmodels compile`` took (the rest being the
imports ``trnmodels info`` pays too). The keys are a function of the ``config.json`` bytes, the
transformers version and what else goes into a key (runtime config, graphs, compiler flags, torch,
source of core and the plugin), so after a compile leaves every graph in the cache, the manifest
records them under a digest of exactly those inputs. A later compile with the same digest looks the
entries up directly, skipping the config and the model's validation, which passed for the same inputs.
Any change of input changes the digest, so a stale manifest is never read; a missing one, or one whose
entries are no longer all in the cache, means the full path.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

from ..hf_config import CONFIG_NAME, read_config_dict
from ..plugins import plugin_for_architecture
from ..runner.graphs import GraphSpec
from .cache import ArtifactCache
from .key import cache_key

Keys = dict[GraphSpec, tuple[str, dict[str, Any]]]


def manifest_digest(
    checkpoint_dir: str, runtime_fields: dict[str, Any], specs: Sequence[GraphSpec], common: dict[str, Any]
) -> str:
    """The manifest's name: a key over the raw config file, the transformers version that reads it, and
    the key fields every graph shares (``common``: dtype, compiler flags, source digest)."""
    config_file = Path(checkpoint_dir) / CONFIG_NAME
    key, _ = cache_key(
        model_config={
            "config.json sha256": hashlib.sha256(config_file.read_bytes()).hexdigest(),
            "transformers": version("transformers"),
        },
        runtime_config=runtime_fields,
        graph="manifest:" + ",".join(spec.name for spec in specs),
        bucket=(),
        **common,
    )
    return key


def plugin_package(checkpoint_dir: str) -> str | None:
    """The import name of the plugin serving the checkpoint, from the raw ``config.json``; None when it
    names no architecture (the full path then refuses it with the reason)."""
    architectures = read_config_dict(checkpoint_dir).get("architectures")
    if not architectures or not isinstance(architectures, list):
        return None
    return plugin_for_architecture(architectures[0]).package


def recorded_keys(cache: ArtifactCache, digest: str, specs: Sequence[GraphSpec]) -> Keys | None:
    """The keys the manifest ``digest`` records for ``specs``, or None if it records other graphs."""
    record = cache.read_record(digest)
    graphs = (record or {}).get("graphs")
    if not isinstance(graphs, dict) or sorted(graphs) != sorted(spec.name for spec in specs):
        return None
    try:
        return {spec: (str(graphs[spec.name]["key"]), dict(graphs[spec.name]["fields"])) for spec in specs}
    except (KeyError, TypeError, ValueError):
        return None


def record_keys(cache: ArtifactCache, digest: str, keys: Keys) -> None:
    cache.write_record(
        digest,
        {"graphs": {spec.name: {"key": key, "fields": fields} for spec, (key, fields) in keys.items()}},
    )

"""Read a checkpoint's ``config.json`` into a transformers config, with errors that name the problem.

transformers accepts almost anything and fills defaults silently; a port must not. A model says which
fields it needs, and a missing one fails here instead of deep inside a forward.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from transformers import AutoConfig, PretrainedConfig

from .errors import ConfigError

CONFIG_NAME = "config.json"


def read_config_dict(checkpoint_dir: str | Path) -> dict[str, Any]:
    """Parse ``config.json`` strictly: a missing file or malformed JSON names the file and position."""
    path = Path(checkpoint_dir) / CONFIG_NAME
    if not path.is_file():
        raise ConfigError(f"{path}: no {CONFIG_NAME} in checkpoint directory {checkpoint_dir}")
    return read_json_object(path)


def _non_finite(value: Any, key: str) -> Iterator[tuple[str, float]]:
    if isinstance(value, float) and not math.isfinite(value):
        yield key, value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _non_finite(v, f"{key}.{k}" if key else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _non_finite(v, f"{key}[{i}]")


def refuse_non_finite(config: PretrainedConfig | Mapping[str, Any], where: str = "config.json: ") -> None:
    """Refuse NaN or infinity anywhere in a config, naming the first such field (nested ones dotted).

    Python's json reads ``NaN`` and ``Infinity`` without complaint, and a config built in memory (vLLM
    hands plugins one) can hold them too; a non-finite eps, RoPE base or scale would only show as NaN
    logits much later."""
    data = config.to_dict() if isinstance(config, PretrainedConfig) else config
    bad = next(_non_finite(data, ""), None)
    if bad is not None:
        raise ConfigError(f"{where}{bad[0]}: expected a finite number, got {bad[1]}")


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON file holding one object; malformed JSON, non-UTF-8 text, another JSON type or a NaN or
    infinite number names the file (and the position or field)."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: malformed JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text ({e.reason})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object, got {type(data).__name__}")
    refuse_non_finite(data, f"{path}: ")
    return data


def load_hf_config(checkpoint_dir: str | Path, required: Iterable[str] = ()) -> PretrainedConfig:
    """Load the transformers config of a local checkpoint, checking that ``required`` fields are present.

    ``required`` names fields that must be written in ``config.json`` itself, not defaulted.
    """
    raw = read_config_dict(checkpoint_dir)
    path = Path(checkpoint_dir) / CONFIG_NAME
    missing = [f for f in required if f not in raw]
    if missing:
        raise ConfigError(f"{path}: missing required field(s): {', '.join(missing)}")
    if "model_type" not in raw:
        raise ConfigError(f"{path}: missing required field 'model_type'")
    try:
        return AutoConfig.from_pretrained(str(checkpoint_dir), local_files_only=True)
    except Exception as e:  # transformers 5 raises huggingface_hub validation errors, not ValueError
        raise ConfigError(f"{path}: transformers cannot build a config from it: {e}") from None

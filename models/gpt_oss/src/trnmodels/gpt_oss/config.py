"""gpt-oss config: the fields the model reads from the HF config, and the runtime settings it runs with."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PretrainedConfig

from trnmodels.core.decoder_config import DecoderConfig
from trnmodels.core.errors import ConfigError
from trnmodels.core.runtime_config import NeuronConfig

LAYER_TYPES = ("sliding_attention", "full_attention")


@dataclass(frozen=True)
class GptOssConfig(DecoderConfig):
    intermediate_size: int
    num_experts: int
    experts_per_token: int
    sliding_window: int | None
    layer_types: tuple[str, ...]
    swiglu_alpha: float
    swiglu_limit: float
    mxfp4: bool
    ep_degree: int

    @classmethod
    def from_configs(
        cls, hf_config: PretrainedConfig, neuron_config: NeuronConfig, *, mxfp4: bool = False
    ) -> GptOssConfig:
        num_layers = hf_config.num_hidden_layers
        layer_types = tuple(
            getattr(hf_config, "layer_types", None)
            or ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(num_layers)]
        )
        if len(layer_types) != num_layers:
            raise ConfigError(
                f"config.json: layer_types has {len(layer_types)} entries, expected num_hidden_layers={num_layers}"
            )
        unknown = sorted(set(layer_types) - set(LAYER_TYPES))
        if unknown:
            raise ConfigError(f"config.json: layer_types: expected entries in {LAYER_TYPES}, got {unknown}")
        return cls(
            **cls.common_fields(hf_config, neuron_config),
            intermediate_size=hf_config.intermediate_size,
            num_experts=hf_config.num_local_experts,
            experts_per_token=hf_config.num_experts_per_tok,
            sliding_window=getattr(hf_config, "sliding_window", None),
            layer_types=layer_types,
            swiglu_alpha=float(getattr(hf_config, "swiglu_alpha", 1.702)),
            swiglu_limit=float(getattr(hf_config, "swiglu_limit", 7.0)),
            mxfp4=mxfp4,
            ep_degree=neuron_config.ep_degree,
        )

    def window(self, layer_idx: int) -> int | None:
        return self.sliding_window if self.layer_types[layer_idx] == "sliding_attention" else None

"""The UMT5 text encoder (transformers' ``UMT5EncoderModel``), TP-sharded, behind the wrapper contract
the pipeline calls: ``load_weights(path)``, ``compile(...)``, ``forward(input_ids, attention_mask)``
returning an object with ``.last_hidden_state``.

Heads (and each layer's relative-position bias table, one column per head) and the gated FFN width are
split over TP; the vocabulary is split over TP too. UMT5 does not scale the attention scores, and every
layer carries its own relative-position bias.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trnmodels.core.compile.diffusion import (
    ComponentGraph,
    ComponentResult,
    compile_components,
    load_component_graph,
    signature,
)
from trnmodels.core.errors import ConfigError
from trnmodels.core.hf_config import read_json_object
from trnmodels.core.ops import gelu_tanh, rms_norm
from trnmodels.core.parallel import (
    MergedColumnParallelLinear,
    ParallelLayout,
    QKVParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    check_divisible,
    get_parallel_layout,
    get_tp_group,
)
from trnmodels.core.weights import load_checkpoint_dir, set_weight_loader, sharded

KeyDict = dict[str, str | list[str]]


@dataclass(frozen=True)
class UMT5Config:
    vocab_size: int
    d_model: int
    d_kv: int
    d_ff: int
    num_layers: int
    num_heads: int
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "text_encoder config") -> UMT5Config:
        act = raw.get("feed_forward_proj", "gated-gelu")
        if act != "gated-gelu":
            raise ConfigError(f"{source}: feed_forward_proj: expected 'gated-gelu' (UMT5), got {act!r}")
        missing = [
            k for k in ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads") if k not in raw
        ]
        if missing:
            raise ConfigError(f"{source}: missing field(s) {', '.join(missing)}")
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in raw.items() if k in names})

    @classmethod
    def from_pretrained(cls, path: str | Path) -> UMT5Config:
        file = Path(path) / "config.json"
        if not file.is_file():
            raise ConfigError(f"{path}: no config.json (expected a transformers text_encoder folder)")
        return cls.from_dict(read_json_object(file), str(file))


def relative_position_buckets(length: int, num_buckets: int, max_distance: int, device=None) -> torch.Tensor:
    """T5's bidirectional bucket of every (query, key) offset, ``[length, length]``."""
    position = torch.arange(length, device=device)
    relative = position[None, :] - position[:, None]
    num_buckets //= 2
    buckets = (relative > 0).long() * num_buckets
    distance = relative.abs()
    max_exact = num_buckets // 2
    log_ratio = torch.log(distance.float() / max_exact) / math.log(max_distance / max_exact)
    large = (max_exact + (log_ratio * (num_buckets - max_exact)).long()).clamp(max=num_buckets - 1)
    return buckets + torch.where(distance < max_exact, distance, large)


@dataclass
class TextEncoderOutput:
    last_hidden_state: torch.Tensor


class UMT5Layer(nn.Module):
    def __init__(self, cfg: UMT5Config, dtype: torch.dtype):
        super().__init__()
        tp = get_tp_group()
        self.cfg = cfg
        self.heads = check_divisible("num_heads", cfg.num_heads, tp.world_size)
        inner = cfg.num_heads * cfg.d_kv
        self.attn_norm = nn.Parameter(torch.empty(cfg.d_model, dtype=dtype), requires_grad=False)
        self.qkv = QKVParallelLinear(cfg.d_model, cfg.d_kv, cfg.num_heads, cfg.num_heads, dtype=dtype)
        self.o = RowParallelLinear(inner, cfg.d_model, dtype=dtype)
        self.position_bias = nn.Parameter(
            torch.empty(cfg.relative_attention_num_buckets, self.heads, dtype=dtype), requires_grad=False
        )
        set_weight_loader(self.position_bias, sharded(1))
        self.ffn_norm = nn.Parameter(torch.empty(cfg.d_model, dtype=dtype), requires_grad=False)
        self.wi = MergedColumnParallelLinear(cfg.d_model, [cfg.d_ff, cfg.d_ff], dtype=dtype)
        self.wo = RowParallelLinear(cfg.d_ff, cfg.d_model, dtype=dtype)

    @staticmethod
    def checkpoint_keys(prefix: str) -> KeyDict:
        attn, ffn = f"{prefix}layer.0.", f"{prefix}layer.1."
        return {
            "attn_norm": f"{attn}layer_norm.weight",
            "qkv.weight": [f"{attn}SelfAttention.{p}.weight" for p in "qkv"],
            "o.weight": f"{attn}SelfAttention.o.weight",
            "position_bias": f"{attn}SelfAttention.relative_attention_bias.weight",
            "ffn_norm": f"{ffn}layer_norm.weight",
            "wi.weight": [f"{ffn}DenseReluDense.wi_0.weight", f"{ffn}DenseReluDense.wi_1.weight"],
            "wo.weight": f"{ffn}DenseReluDense.wo.weight",
        }

    def forward(self, x: torch.Tensor, buckets: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        eps = self.cfg.layer_norm_epsilon
        q, k, v = self.qkv(rms_norm(x, self.attn_norm, eps))  # [B, T, H, D] each
        bias = F.embedding(buckets, self.position_bias).permute(2, 0, 1)[None]  # [1, H, T, T]
        scores = torch.matmul(q.transpose(1, 2), k.permute(0, 2, 3, 1)) + bias + key_mask
        probs = torch.softmax(scores.float(), dim=-1).to(v.dtype)
        out = torch.matmul(probs, v.transpose(1, 2)).transpose(1, 2).flatten(2)
        x = x + self.o(out)
        gate, up = self.wi(rms_norm(x, self.ffn_norm, eps)).chunk(2, dim=-1)
        return x + self.wo(gelu_tanh(gate) * up)


class UMT5Encoder(nn.Module):
    """``forward(input_ids [B, T], attention_mask [B, T])`` → ``TextEncoderOutput``."""

    # The encoder's embedding is tied to ``shared``; exports may store it under both names.
    IGNORED_CHECKPOINT_KEYS = ("encoder.embed_tokens.weight",)

    def __init__(self, cfg: UMT5Config, *, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.tp = get_tp_group()
        self.config, self.dtype = cfg, dtype
        self.embed = VocabParallelEmbedding(cfg.vocab_size, cfg.d_model, dtype=dtype)
        self.layers = nn.ModuleList([UMT5Layer(cfg, dtype) for _ in range(cfg.num_layers)])
        self.final_norm = nn.Parameter(torch.empty(cfg.d_model, dtype=dtype), requires_grad=False)
        self._graphs: dict[Any, Callable[..., Any]] = {}

    def checkpoint_keys(self) -> KeyDict:
        keys: KeyDict = {"embed.weight": "shared.weight", "final_norm": "encoder.final_layer_norm.weight"}
        for i, layer in enumerate(self.layers):
            for name, key in layer.checkpoint_keys(f"encoder.block.{i}.").items():
                keys[f"layers.{i}.{name}"] = key
        return keys

    @classmethod
    def from_pretrained(cls, path: str | Path, *, dtype: torch.dtype = torch.float32) -> UMT5Encoder:
        model = cls(UMT5Config.from_pretrained(path), dtype=dtype)
        model.load_weights(path)
        return model

    def load_weights(self, path: str | Path) -> None:
        keys = self.checkpoint_keys()
        load_checkpoint_dir(self, path, keys, self.tp, ignore=self.IGNORED_CHECKPOINT_KEYS, progress=False)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def component_graph(self, *, batch_size: int, seq_len: int) -> ComponentGraph:
        return text_encoder_component_graph(
            self.config,
            batch_size=batch_size,
            seq_len=seq_len,
            dtype=self.dtype,
            layout=get_parallel_layout(),
        )

    def compile(
        self,
        *,
        batch_size: int = 1,
        seq_len: int = 512,
        cache_dir: str | Path | None = None,
        on_result: Callable[[ComponentResult], None] | None = None,
    ) -> list[ComponentResult]:
        """Compile (or find in the cache) the encoder for ``[batch_size, seq_len]`` prompts (the pipeline
        pads every prompt to ``max_sequence_length``) and use the graph from then on."""
        graph = self.component_graph(batch_size=batch_size, seq_len=seq_len)
        results = compile_components([graph], cache_dir, on_result)
        loaded = load_component_graph(graph, TextEncoderGraph(self), cache_dir)
        if loaded is not None:
            self._graphs[graph.inputs] = loaded
        return results

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, tp_rank: torch.Tensor | None = None
    ) -> TextEncoderOutput:
        """``tp_rank`` (0-d int64, defaults to this rank) masks the vocab shard; it is an input so every
        TP rank runs the same compiled graph."""
        rank = self.tp.rank_tensor() if tp_rank is None else tp_rank
        graph = self._graphs.get(signature((input_ids, attention_mask)))
        if graph is not None:
            out = graph(input_ids, attention_mask, rank)
            return TextEncoderOutput(out[0] if isinstance(out, list | tuple) else out)
        return TextEncoderOutput(self.run(input_ids, attention_mask, rank))

    def run(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, tp_rank: torch.Tensor
    ) -> torch.Tensor:
        """The encoder's math: the last hidden state ``[B, T, d_model]``."""
        cfg = self.config
        x = self.embed(input_ids, tp_rank)
        buckets = relative_position_buckets(
            input_ids.shape[1], cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance
        )
        # Additive key mask as transformers builds it: the dtype's minimum where a key is padding.
        key_mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, buckets, key_mask)
        return rms_norm(x, self.final_norm, cfg.layer_norm_epsilon)


class TextEncoderGraph(nn.Module):
    """The encoder as one capturable module returning a tensor (its artifact binds these weights)."""

    def __init__(self, encoder: UMT5Encoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids, attention_mask, tp_rank) -> torch.Tensor:
        return self.encoder.run(input_ids, attention_mask, tp_rank)


def text_encoder_component_graph(
    cfg: UMT5Config, *, batch_size: int, seq_len: int, dtype: torch.dtype, layout: ParallelLayout
) -> ComponentGraph:
    """The encoder's graph for ``[batch_size, seq_len]`` prompts, described without building it."""
    args = (
        torch.zeros(batch_size, seq_len, dtype=torch.int64),
        torch.ones(batch_size, seq_len, dtype=torch.int64),
        torch.zeros((), dtype=torch.int64),
    )

    def build() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
        return TextEncoderGraph(UMT5Encoder(cfg, dtype=dtype)), args

    return ComponentGraph(
        model_name="wan22_text_encoder",
        graph="encode",
        package="trnmodels.wan22",
        model_config=dataclasses.asdict(cfg),
        inputs=signature(args[:2]),
        dtype=str(dtype).removeprefix("torch."),
        build=build,
        layout=layout,
    )

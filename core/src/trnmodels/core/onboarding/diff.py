"""Step 0 of onboarding a model: the architecture diff of two configs (``trnmodels diff A B``).

``A`` and ``B`` are each a checkpoint folder, a ``config.json`` path or the name of a published config
bundled with core (``trnmodels/core/published/``). ``architecture_diff(a, b)`` returns one plain dict:

- ``config``: the fields whose values differ, and those only in A or only in B (a nested ``text_config``
  compared field by field, as ``text_config.<field>``; noise such as ``_name_or_path`` ignored);
- ``checklist``: the eight items of a port (attention, heterogeneous layers, position encoding,
  MLP/activation, normalization, config structure, embedding, special features), each with a ``verdict``
  of ``same``, ``option`` (a core option covers B: the option and its module are named) or ``code``
  (model code is needed: the file to change and the plugin that already shows how), and its fields;
- ``plugins``: whether each installed plugin ``accepts`` B as it is (its own config validation at TP=1,
  no weights, no ranks) and, if not, the ``reason`` it gives;
- ``modules``: the module tree transformers builds for each on the meta device (no weights, no memory),
  truncated, and the module types only one side has.

Everything is offline: configs are read from disk and models are built on the meta device.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, TrnModelsError
from ..hf_config import CONFIG_NAME, read_config_dict, read_json_object
from ..published import PUBLISHED_DIR, published_names

# Fields that say nothing about the architecture.
NOISE_FIELDS = frozenset(
    {"_name_or_path", "transformers_version", "_commit_hash", "_attn_implementation_autoset", "use_cache"}
)

CHECKLIST_ITEMS = (
    "attention",
    "heterogeneous_layers",
    "position_encoding",
    "mlp_activation",
    "normalization",
    "config_structure",
    "embedding",
    "special_features",
)

TREE_LINES = 60  # lines of each module tree kept in the result

SELF_ATTENTION = "trnmodels.core.modules.self_attention"
MOE = "trnmodels.core.modules.moe"
MLP = "trnmodels.core.modules.mlp"
NORM = "trnmodels.core.modules.norm"
ROPE = "trnmodels.core.ops.rope"
NEW_MODEL = "models/<name>/src/trnmodels/<name>/model.py"
NEW_CONFIG = "models/<name>/src/trnmodels/<name>/config.py"

# Checkpoints storing RMSNorm's ``w`` of a ``(1 + w)`` scale.
OFFSET_NORM_MODEL_TYPES = frozenset({"gemma", "gemma2", "gemma3", "gemma3_text"})
# Models that scale the token embedding by sqrt(hidden_size).
SCALED_EMBEDDING_MODEL_TYPES = frozenset(
    {"gemma", "gemma2", "gemma3", "gemma3_text", "gemma4", "gemma4_text"}
)
# How each MoE model's checkpoint stores its experts (``ExpertsCheckpointFormat``).
EXPERT_FORMATS = {
    "gpt_oss": "ExpertsCheckpointFormat() (fused gate_up/down tensors; mxfp4=True for the MXFP4 release)",
    "mixtral": "ExpertsCheckpointFormat(per_expert=True) with per_expert_keys(..., 'w1', 'w3', 'w2')",
    "qwen2_moe": "ExpertsCheckpointFormat(per_expert=True) with per_expert_keys(...)",
    "qwen3_moe": "ExpertsCheckpointFormat(per_expert=True) with per_expert_keys(...)",
}


@dataclass(frozen=True)
class ConfigSource:
    """A config to compare: what the user named, where it was read from, and its ``config.json``."""

    name: str
    origin: str  # "bundled", "folder" or "file"
    path: Path
    config: dict[str, Any]

    def describe(self) -> str:
        return f"{self.name} ({self.origin}: {self.path})"


def load_source(spec: str) -> ConfigSource:
    """A checkpoint folder, a ``config.json`` path, or a bundled published config's name."""
    path = Path(spec)
    if path.is_dir():
        return ConfigSource(spec, "folder", path / CONFIG_NAME, read_config_dict(path))
    if path.is_file():
        return ConfigSource(spec, "file", path, read_json_object(path))
    bundled = PUBLISHED_DIR / spec / CONFIG_NAME
    if spec and bundled.is_file():
        return ConfigSource(spec, "bundled", bundled, read_config_dict(bundled.parent))
    raise ConfigError(
        f"{spec!r} is not a checkpoint folder, a config.json path or a bundled published config; "
        f"bundled: {', '.join(published_names())}"
    )


# ---------------------------------------------------------------------------------------------- config


def _flatten(config: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        if key in NOISE_FIELDS:
            continue
        if key == "text_config" and isinstance(value, Mapping):
            out.update({f"text_config.{k}": v for k, v in value.items() if k not in NOISE_FIELDS})
        else:
            out[key] = value
    return out


def compare_configs(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """``{"different": {field: {"a", "b"}}, "only_in_a": {field: value}, "only_in_b": {...}}``."""
    fa, fb = _flatten(a), _flatten(b)
    return {
        "different": {k: {"a": fa[k], "b": fb[k]} for k in sorted(fa.keys() & fb.keys()) if fa[k] != fb[k]},
        "only_in_a": {k: fa[k] for k in sorted(fa.keys() - fb.keys())},
        "only_in_b": {k: fb[k] for k in sorted(fb.keys() - fa.keys())},
    }


# --------------------------------------------------------------------------------------------- modules


@dataclass
class BuiltModel:
    """What transformers builds for a config on the meta device (``model`` is None if it could not)."""

    hf_config: Any = None
    model: Any = None
    error: str | None = None
    note: str | None = None
    prefix: str = ""  # the architecture's class-name prefix, e.g. ``Qwen2``

    def module_types(self) -> dict[str, str]:
        """``{type without the model's prefix: type}``: ``Qwen2Attention`` → ``Attention``."""
        if self.model is None:
            return {}
        types = {type(m).__name__ for m in self.model.modules()}
        return {_strip(t, self.prefix): t for t in sorted(types)}


def _strip(name: str, prefix: str) -> str:
    """``Qwen2Attention`` → ``Attention``; ``Gemma4TextAttention`` → ``Attention``."""
    if prefix and name.startswith(prefix) and len(name) > len(prefix):
        name = name[len(prefix) :]
        if name.startswith("Text") and len(name) > len("Text"):
            name = name[len("Text") :]
    return name


def _arch_prefix(architecture: str) -> str:
    for suffix in ("ForConditionalGeneration", "ForCausalLM", "LMHeadModel", "Model"):
        if architecture.endswith(suffix):
            return architecture[: -len(suffix)]
    return architecture


@contextlib.contextmanager
def _quiet():
    """transformers warns freely while building configs and models; the diff prints its own output."""
    logger = logging.getLogger("transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def hf_config_of(config: Mapping[str, Any]) -> Any:
    """transformers' reading of ``config`` (as ``AutoConfig`` reads a checkpoint's), offline."""
    from transformers import AutoConfig

    with tempfile.TemporaryDirectory() as folder, _quiet():
        (Path(folder) / CONFIG_NAME).write_text(json.dumps(dict(config)))
        return AutoConfig.from_pretrained(folder, local_files_only=True)


def build_on_meta(config: Mapping[str, Any]) -> BuiltModel:
    """The model transformers builds for ``config`` on the meta device: no weights, no memory. A
    multimodal model that cannot be built falls back to its text model."""
    import torch
    import transformers

    architecture = str((config.get("architectures") or [""])[0])
    built = BuiltModel(prefix=_arch_prefix(architecture))
    try:
        built.hf_config = hf_config_of(config)
    except Exception as e:  # transformers raises many types for a config it cannot read
        built.error = f"transformers cannot read the config: {_one_line(e)}"
        return built
    cls = getattr(transformers, architecture, None) if architecture else None
    try:
        with _quiet(), torch.device("meta"):
            if cls is not None and hasattr(cls, "_from_config"):
                built.model = cls._from_config(built.hf_config)
            else:
                built.model = transformers.AutoModelForCausalLM.from_config(built.hf_config)
        return built
    except Exception as e:
        built.error = f"transformers cannot build {architecture or 'the model'}: {_one_line(e)}"
    text = getattr(built.hf_config, "text_config", None)
    if text is None:
        return built
    try:
        with _quiet(), torch.device("meta"):
            built.model = transformers.AutoModelForCausalLM.from_config(text)
        built.note, built.error = f"text model only ({built.error})", None
    except Exception as e:
        built.error = f"{built.error}; its text model: {_one_line(e)}"
    return built


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}"


def tree_lines(model: Any, limit: int = TREE_LINES) -> list[str]:
    """The module tree as torch prints it (identical repeated layers already collapse to ``(0-N): N x``),
    cut to ``limit`` lines."""
    lines = str(model).splitlines()
    if len(lines) > limit:
        lines = [*lines[:limit], f"... ({len(lines) - limit} more lines)"]
    return lines


def compare_modules(a: BuiltModel, b: BuiltModel) -> dict[str, Any]:
    ta, tb = a.module_types(), b.module_types()

    def side(m: BuiltModel) -> dict[str, Any]:
        return {
            "class": type(m.model).__name__ if m.model is not None else None,
            "tree": tree_lines(m.model) if m.model is not None else [],
            "note": m.note,
            "error": m.error,
        }

    return {
        "a": side(a),
        "b": side(b),
        "only_in_a": [ta[k] for k in sorted(ta.keys() - tb.keys())],
        "only_in_b": [tb[k] for k in sorted(tb.keys() - ta.keys())],
    }


# ------------------------------------------------------------------------------------------- checklist


def _text(config: Mapping[str, Any]) -> dict[str, Any]:
    """The decoder's fields: ``text_config`` of a multimodal config, else the config itself."""
    text = config.get("text_config")
    return dict(text) if isinstance(text, Mapping) else dict(config)


def _first_attention(model: Any) -> Any:
    if model is None:
        return None
    for module in model.modules():
        if type(module).__name__.endswith("Attention") and hasattr(module, "o_proj"):
            return module
    return None


def _bias(module: Any, name: str) -> bool | None:
    proj = getattr(module, name, None)
    return None if proj is None else getattr(proj, "bias", None) is not None


def _layer_norm_names(model: Any) -> list[str] | None:
    """The norms of the first decoder layer, by their attribute names."""
    if model is None:
        return None
    for module in model.modules():
        if hasattr(module, "self_attn"):
            return sorted(n for n, c in module.named_children() if "norm" in type(c).__name__.lower())
    return None


@dataclass
class Features:
    """What the checklist compares, per side (from the config and, where it says more, transformers'
    modules)."""

    values: dict[str, dict[str, Any]] = field(default_factory=dict)
    fields: dict[str, list[str]] = field(default_factory=dict)


def _rope(text: Mapping[str, Any]) -> tuple[Any, Any]:
    """``(rope_type, partial_rotary_factor)``; a per-layer-type ``rope_parameters`` gives a dict."""
    params = text.get("rope_parameters") or text.get("rope_scaling")
    partial = text.get("partial_rotary_factor")
    if isinstance(params, Mapping):
        nested = {k: v for k, v in params.items() if isinstance(v, Mapping)}
        if nested:
            types = {k: v.get("rope_type", v.get("type", "default")) for k, v in sorted(nested.items())}
            partials = {k: v.get("partial_rotary_factor") for k, v in nested.items()}
            partial = partial or next((p for p in partials.values() if p not in (None, 1.0)), None)
            return types, partial
        partial = partial or params.get("partial_rotary_factor")
        return params.get("rope_type", params.get("type", "default")), partial
    return "default", partial


def features(config: Mapping[str, Any], built: BuiltModel) -> dict[str, dict[str, Any]]:
    """Per checklist item, the architecture properties of one side."""
    t = _text(config)
    model_type = str(t.get("model_type", config.get("model_type", "")))
    attention = _first_attention(built.model)
    bias = bool(t.get("attention_bias", False))
    qkv_bias = _bias(attention, "q_proj") if attention is not None else None
    o_bias = _bias(attention, "o_proj") if attention is not None else None
    layer_types = t.get("layer_types")
    kinds = sorted(set(layer_types)) if isinstance(layer_types, list) else None
    sliding = t.get("sliding_window")
    if t.get("use_sliding_window") is False or (kinds is not None and "sliding_attention" not in kinds):
        sliding = None
    experts = next((t[k] for k in ("num_local_experts", "num_experts", "n_routed_experts") if t.get(k)), 0)
    act = t.get("hidden_act") or t.get("hidden_activation") or t.get("activation")
    if t.get("swiglu_limit") is not None:
        act = "swiglu_clamped"
    rope_type, partial = _rope(t)
    tied = getattr(built.hf_config, "tie_word_embeddings", None)
    if tied is None:
        tied = bool(config.get("tie_word_embeddings", t.get("tie_word_embeddings", True)))
    quant = config.get("quantization_config") or t.get("quantization_config")
    from ..plugins import DECODER_CONFIG_FIELDS

    return {
        "attention": {
            "qkv_bias": bias if qkv_bias is None else qkv_bias,
            "o_bias": bias if o_bias is None else o_bias,
            "qk_norm": attention is not None and getattr(attention, "q_norm", None) is not None,
            "sinks": attention is not None and hasattr(attention, "sinks"),
            "sliding_window": sliding,
            "kv_sharing": bool(t.get("num_kv_shared_layers")),
            "query_scale": t.get("query_pre_attn_scalar"),
            "logit_softcapping": t.get("attn_logit_softcapping"),
        },
        "heterogeneous_layers": {
            "layer_types": kinds if kinds is not None and len(kinds) > 1 else None,
            "per_layer_head_dim": bool(t.get("global_head_dim") or t.get("num_global_key_value_heads")),
            "dense_and_moe_layers": bool(
                t.get("mlp_only_layers")
                or (t.get("decoder_sparse_step") or 1) > 1
                or t.get("first_k_dense_replace")
            ),
            "kv_shared_layers": t.get("num_kv_shared_layers") or None,
        },
        "position_encoding": {"rope_type": rope_type, "partial_rotary_factor": partial},
        "mlp_activation": {
            "activation": act,
            "moe": bool(experts),
            "shared_experts": bool(t.get("shared_expert_intermediate_size") or t.get("n_shared_experts")),
            "mlp_bias": bool(t.get("mlp_bias", False)),
            "expert_format": EXPERT_FORMATS.get(model_type) if experts else None,
        },
        "normalization": {
            "kind": "layer_norm" if "layer_norm_eps" in t and "rms_norm_eps" not in t else "rms_norm",
            "weight_offset": 1.0 if model_type in OFFSET_NORM_MODEL_TYPES else 0.0,
            "layer_norms": _layer_norm_names(built.model),
        },
        "config_structure": {
            "architecture": (config.get("architectures") or [None])[0],
            "nested_text_config": "text_config" in config,
            "quantization": quant.get("quant_method") if isinstance(quant, Mapping) else None,
            "standard_fields": all(f in t for f in DECODER_CONFIG_FIELDS),
        },
        "embedding": {
            "tie_word_embeddings": bool(tied),
            "scaled": model_type in SCALED_EMBEDDING_MODEL_TYPES,
            "per_layer_embeddings": bool(t.get("hidden_size_per_layer_input")),
        },
        "special_features": {
            "final_logit_softcapping": t.get("final_logit_softcapping"),
            "multimodal_towers": sorted(k for k in ("vision_config", "audio_config") if config.get(k))
            or None,
            "multi_token_prediction": t.get("num_nextn_predict_layers") or None,
        },
    }


# The config fields each item reads (listed with their values on both sides when either has them).
ITEM_FIELDS = {
    "attention": (
        "num_attention_heads", "num_key_value_heads", "head_dim", "attention_bias", "sliding_window",
        "use_sliding_window", "max_window_layers", "num_kv_shared_layers", "query_pre_attn_scalar",
        "attn_logit_softcapping",
    ),
    "heterogeneous_layers": (
        "layer_types", "global_head_dim", "num_global_key_value_heads", "mlp_only_layers",
        "decoder_sparse_step", "first_k_dense_replace", "num_kv_shared_layers",
    ),
    "position_encoding": (
        "rope_parameters", "rope_scaling", "rope_theta", "partial_rotary_factor", "max_position_embeddings",
    ),
    "mlp_activation": (
        "hidden_act", "hidden_activation", "intermediate_size", "mlp_bias", "num_local_experts",
        "num_experts", "n_routed_experts", "num_experts_per_tok", "experts_per_token", "top_k_experts",
        "moe_intermediate_size", "shared_expert_intermediate_size", "n_shared_experts", "swiglu_limit",
        "norm_topk_prob",
    ),
    "normalization": ("rms_norm_eps", "layer_norm_eps"),
    "config_structure": ("architectures", "model_type", "text_config", "quantization_config"),
    "embedding": ("vocab_size", "tie_word_embeddings", "hidden_size_per_layer_input", "vocab_size_per_layer_input"),
    "special_features": (
        "final_logit_softcapping", "vision_config", "audio_config", "num_nextn_predict_layers",
    ),
}  # fmt: skip


def _fields(item: str, a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    ta, tb = _text(a), _text(b)
    out = {}
    for name in ITEM_FIELDS[item]:
        sa = a if item == "config_structure" else ta
        sb = b if item == "config_structure" else tb
        if name == "text_config":
            va, vb = "text_config" in a, "text_config" in b
            if va or vb:
                out["text_config"] = {"a": "present" if va else None, "b": "present" if vb else None}
            continue
        if name in sa or name in sb:
            out[name] = {"a": sa.get(name), "b": sb.get(name)}
    return out


def _option(what: str, option: str, module: str, example: str | None = None) -> dict[str, Any]:
    finding = {"verdict": "option", "what": what, "option": option, "module": module}
    if example:
        finding["example"] = example
    return finding


def _code(what: str, file: str, example: str | None) -> dict[str, Any]:
    return {"verdict": "code", "what": what, "file": file, "example": example}


def _findings(item: str, fa: Mapping[str, Any], fb: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What B needs for ``item`` where it differs from A."""
    from ..ops.mlp import ACTIVATIONS
    from ..ops.rope import ROPE_TYPES

    changed = [k for k in fb if fa.get(k) != fb.get(k)]
    out: list[dict[str, Any]] = []
    if item == "attention":
        if "qkv_bias" in changed or "o_bias" in changed:
            qkv, o = fb["qkv_bias"], fb["o_bias"]
            what = f"bias on q/k/v: {qkv}, on o_proj: {o}"
            if qkv != o:
                what += " (SelfAttention.for_layer sets both from attention_bias: pass them explicitly)"
            out.append(_option(what, f"SelfAttention(qkv_bias={qkv}, o_bias={o})", SELF_ATTENTION, "gpt_oss"))
        if "qk_norm" in changed:
            option = "SelfAttention(qk_norm=...)" if fb["qk_norm"] else "SelfAttention(qk_norm=None)"
            out.append(
                _option(f"per-head RMSNorm on q and k: {fb['qk_norm']}", option, SELF_ATTENTION, "gemma4")
            )
        if "sinks" in changed:
            out.append(
                _option(
                    f"learned sinks: {fb['sinks']}",
                    f"SelfAttention(sinks={fb['sinks']})",
                    SELF_ATTENTION,
                    "gpt_oss",
                )
            )
        if "sliding_window" in changed:
            window = fb["sliding_window"]
            what = f"sliding window: {window}" if window is not None else "no sliding window (full attention)"
            option = f"SelfAttention(sliding_window={window})"
            out.append(_option(what, option, SELF_ATTENTION, "gpt_oss" if window is not None else None))
        if "kv_sharing" in changed:
            out.append(
                _option(
                    "KV sharing across layers",
                    "SelfAttention(kv_sharing_target_layer_name=...)",
                    SELF_ATTENTION,
                    "gemma4",
                )
            )
        if "query_scale" in changed:
            out.append(
                _option(
                    f"query scale from query_pre_attn_scalar={fb['query_scale']}",
                    "SelfAttention(scale=...)",
                    SELF_ATTENTION,
                )
            )
        if "logit_softcapping" in changed and fb["logit_softcapping"] is not None:
            out.append(
                _code(
                    f"attention logit softcapping {fb['logit_softcapping']} (ops.attention has softcap=; "
                    "PagedAttention does not pass it)",
                    "core/src/trnmodels/core/attention.py",
                    None,
                )
            )
    elif item == "heterogeneous_layers":
        if "layer_types" in changed and fb["layer_types"]:
            out.append(
                _option(
                    f"layer kinds {fb['layer_types']}",
                    "SelfAttention.for_layer(cfg, i, sliding_window=...) per layer_types[i]",
                    SELF_ATTENTION,
                    "gpt_oss",
                )
            )
        if "per_layer_head_dim" in changed and fb["per_layer_head_dim"]:
            out.append(
                _option(
                    "per-layer head size / KV heads",
                    "SelfAttention(head_dim=..., num_kv_heads=...) per layer",
                    SELF_ATTENTION,
                    "gemma4",
                )
            )
        if "dense_and_moe_layers" in changed and fb["dense_and_moe_layers"]:
            out.append(_code("dense and MoE layers mixed", NEW_MODEL, None))
        if "kv_shared_layers" in changed and fb["kv_shared_layers"]:
            out.append(
                _code(
                    f"the last {fb['kv_shared_layers']} layers read another layer's cache",
                    NEW_MODEL,
                    "gemma4",
                )
            )
    elif item == "position_encoding":
        rope = fb["rope_type"]
        if "rope_type" in changed:
            types = set(rope.values()) if isinstance(rope, Mapping) else {rope}
            unknown = sorted(types - set(ROPE_TYPES))
            if unknown:
                out.append(
                    _code(
                        f"RoPE type {unknown} (core has {ROPE_TYPES})",
                        "core/src/trnmodels/core/ops/rope.py",
                        "gpt_oss",
                    )
                )
            elif isinstance(rope, Mapping):
                out.append(
                    _option(
                        f"RoPE per layer type {dict(rope)}",
                        "one RotaryEmbedding(RopeConfig) per layer type",
                        ROPE,
                        "gemma4",
                    )
                )
            else:
                out.append(
                    _option(
                        f"RoPE type {rope!r}",
                        f"RopeConfig(rope_type={rope!r})",
                        ROPE,
                        "llama3" if rope == "llama3" else "gpt_oss",
                    )
                )
        if "partial_rotary_factor" in changed and fb["partial_rotary_factor"] not in (None, 1.0):
            out.append(
                _option(
                    f"partial rotary {fb['partial_rotary_factor']}",
                    "RopeConfig(partial_rotary_factor=...)",
                    ROPE,
                    "gemma4",
                )
            )
    elif item == "mlp_activation":
        if "moe" in changed:
            if fb["moe"]:
                fmt = (
                    fb["expert_format"]
                    or "ExpertsCheckpointFormat(...) matching the checkpoint's expert keys"
                )
                out.append(
                    _option(
                        f"mixture of experts; checkpoint: {fmt}",
                        "MoEExperts(...) and ops.route(logits, top_k, softmax_first=...)",
                        MOE,
                        "gpt_oss",
                    )
                )
            else:
                out.append(_option("dense MLP", "GatedMLP(...)", MLP, "llama3"))
        elif fb["moe"] and "expert_format" in changed:
            out.append(
                _option(
                    f"experts' checkpoint layout: {fb['expert_format']}",
                    "ExpertsCheckpointFormat",
                    MOE,
                    "gpt_oss",
                )
            )
        if "activation" in changed:
            act = fb["activation"]
            if act == "swiglu_clamped":
                out.append(
                    _option("gpt-oss's clamped SwiGLU", "MoEExperts(act='swiglu_clamped')", MOE, "gpt_oss")
                )
            elif act in ACTIVATIONS:
                owner = f"MoEExperts(act={act!r})" if fb["moe"] else f"GatedMLP(act={act!r})"
                out.append(_option(f"activation {act!r}", owner, MOE if fb["moe"] else MLP, "gemma4"))
            else:
                out.append(
                    _code(
                        f"activation {act!r} (core has {sorted(ACTIVATIONS)})",
                        "core/src/trnmodels/core/ops/mlp.py",
                        "gemma4",
                    )
                )
        if "shared_experts" in changed and fb["shared_experts"]:
            out.append(_code("shared experts beside the routed ones", NEW_MODEL, None))
        if "mlp_bias" in changed:
            out.append(_option(f"MLP bias: {fb['mlp_bias']}", f"GatedMLP(bias={fb['mlp_bias']})", MLP))
    elif item == "normalization":
        if "kind" in changed:
            cls = "LayerNorm" if fb["kind"] == "layer_norm" else "RMSNorm"
            out.append(_option(f"norm type {fb['kind']}", cls, NORM))
        if "weight_offset" in changed:
            out.append(
                _option(
                    "RMSNorm scale stored as (1 + w)", f"RMSNorm(weight_offset={fb['weight_offset']})", NORM
                )
            )
        if "layer_norms" in changed and fb["layer_norms"] is not None and fa["layer_norms"] is not None:
            if set(fb["layer_norms"]) == {"input_layernorm", "post_attention_layernorm"}:
                out.append(
                    _option(
                        "pre-norm layer",
                        "PreNormDecoderLayer",
                        "trnmodels.core.modules.decoder_layer",
                        "llama3",
                    )
                )
            else:
                out.append(_code(f"norms in each layer: {fb['layer_norms']}", NEW_MODEL, "gemma4"))
    elif item == "config_structure":
        if "architecture" in changed:
            out.append(
                _option(
                    f"architecture {fb['architecture']!r}",
                    "ModelPlugin.declare(name, {architecture: model_type})",
                    "trnmodels.core.plugins",
                    "llama3",
                )
            )
        if "nested_text_config" in changed and fb["nested_text_config"]:
            out.append(_code("the decoder's fields are nested under text_config", NEW_CONFIG, "gemma4"))
        if "quantization" in changed and fb["quantization"] is not None:
            if fb["quantization"] == "mxfp4":
                out.append(_option("MXFP4 experts", "ExpertsCheckpointFormat(mxfp4=True)", MOE, "gpt_oss"))
            else:
                out.append(
                    _code(f"quantization {fb['quantization']!r}", "core/src/trnmodels/core/quant/", "gpt_oss")
                )
        if "standard_fields" in changed and not fb["standard_fields"]:
            out.append(_code("fields beyond (or instead of) the standard decoder's", NEW_CONFIG, "gpt_oss"))
    elif item == "embedding":
        if "tie_word_embeddings" in changed:
            out.append(
                _option(
                    f"tied LM head: {fb['tie_word_embeddings']}",
                    "DecoderConfig.tie_word_embeddings (PagedCausalLM ties the head)",
                    "trnmodels.core.causal_lm",
                )
            )
        if "scaled" in changed and fb["scaled"]:
            out.append(
                _code(
                    "embedding scaled by sqrt(hidden_size): override PagedCausalLM.embed", NEW_MODEL, "gemma4"
                )
            )
        if "per_layer_embeddings" in changed and fb["per_layer_embeddings"]:
            out.append(_code("per-layer embeddings (PLE)", NEW_MODEL, "gemma4"))
    elif item == "special_features":
        if "final_logit_softcapping" in changed and fb["final_logit_softcapping"] is not None:
            out.append(_code("final logit softcapping: override compute_logits", NEW_MODEL, "gemma4"))
        if "multimodal_towers" in changed and fb["multimodal_towers"]:
            out.append(
                _code(
                    f"towers {fb['multimodal_towers']}: serve the language model, ignore the towers' keys",
                    NEW_MODEL,
                    "gemma4",
                )
            )
        if "multi_token_prediction" in changed and fb["multi_token_prediction"]:
            out.append(_code("multi-token prediction layers", NEW_MODEL, None))
    return out


def checklist(
    a: Mapping[str, Any], b: Mapping[str, Any], built_a: BuiltModel, built_b: BuiltModel
) -> dict[str, dict[str, Any]]:
    """The eight items, each ``{"verdict", "a", "b", "findings", "fields"}``."""
    fa, fb = features(a, built_a), features(b, built_b)
    out = {}
    for item in CHECKLIST_ITEMS:
        findings = _findings(item, fa[item], fb[item])
        verdicts = {f["verdict"] for f in findings}
        verdict = "code" if "code" in verdicts else "option" if findings else "same"
        out[item] = {
            "verdict": verdict,
            "a": fa[item],
            "b": fb[item],
            "findings": findings,
            "fields": _fields(item, a, b),
        }
    return out


# --------------------------------------------------------------------------------------------- plugins


def plugin_verdicts(b: ConfigSource, hf_config: Any) -> list[dict[str, Any]]:
    """For each installed plugin, whether it accepts B as it is: the architecture it is asked for, the
    ``model_type`` it declares, the fields it requires, then its own ``validate`` at TP=1 (no weights,
    no ranks). A plugin serving another architecture is also validated, so the reason says whether only
    the declaration is missing."""
    from ..plugins import discover_plugins
    from ..runtime_config import NeuronConfig

    config = b.config
    architectures = config.get("architectures") or []
    architecture = architectures[0] if isinstance(architectures, list) and architectures else None
    out = []
    for plugin in discover_plugins().values():
        reasons = []
        if architecture not in plugin.architectures:
            reasons.append(
                f"architectures[0] {architecture!r} is not one it serves ({', '.join(plugin.architectures)})"
            )
        else:
            try:
                plugin.check_model_type(architecture, config.get("model_type"))
            except TrnModelsError as e:
                reasons.append(str(e))
        missing = [f for f in plugin.required_config_fields if f not in config]
        if missing:
            reasons.append(f"missing required field(s): {', '.join(missing)}")
        validation = _validate(plugin, hf_config, NeuronConfig())
        if validation is not None:
            reasons.append(f"its validation: {validation}")
        elif reasons:
            reasons.append("its config validation alone passes")
        accepts = not reasons
        out.append(
            {"plugin": plugin.name, "accepts": accepts, "reason": None if accepts else "; ".join(reasons)}
        )
    return out


def _validate(plugin: Any, hf_config: Any, neuron_config: Any) -> str | None:
    if hf_config is None:
        return "transformers cannot read the config"
    try:
        with _quiet():
            plugin.validate(hf_config, neuron_config)
    except Exception as e:  # a plugin's validation may raise anything on a config it was not written for
        return refusal_reason(e)
    return None


def refusal_reason(e: BaseException) -> str:
    """A plugin's refusal of a config as one line: its own message for a user error, the missing field
    when the config class of another model lacks one it reads, else the exception's type and text."""
    if isinstance(e, TrnModelsError):
        return " ".join(str(e).split())
    if isinstance(e, AttributeError) and e.name:
        return f"the config has no field {e.name!r}, which it reads"
    return _one_line(e)


# ------------------------------------------------------------------------------------------------ diff


def architecture_diff(a: str, b: str) -> dict[str, Any]:
    """The diff of ``a`` against ``b`` (each a checkpoint folder, a config.json path or a bundled name):
    ``{"config", "checklist", "plugins", "modules"}``."""
    source_a, source_b = load_source(a), load_source(b)
    built_a, built_b = build_on_meta(source_a.config), build_on_meta(source_b.config)
    return {
        "config": {
            "a": source_a.describe(),
            "b": source_b.describe(),
            **compare_configs(source_a.config, source_b.config),
        },
        "checklist": checklist(source_a.config, source_b.config, built_a, built_b),
        "plugins": plugin_verdicts(source_b, built_b.hf_config),
        "modules": compare_modules(built_a, built_b),
    }

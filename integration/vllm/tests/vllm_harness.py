"""What the vLLM integration tests share: tiny checkpoints of every installed LLM plugin, transformers'
greedy reference for them, and running vLLM offline in a fresh interpreter.

The checkpoints are saved the way published ones are (``save_pretrained`` plus a tokenizer that ships a
chat template). vLLM's CPU attention supports head sizes 32, 64, 80, ...: the configs use 32 and 64.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from importlib.util import find_spec
from pathlib import Path

import torch
import transformers

from trnmodels.core.testing import save_checkpoint, train_tokenizer

HERE = Path(__file__).parent
PROMPTS = ["Hello, my name is", "The quick brown fox", "Paged attention stores keys"]
CHATS = [[{"role": "user", "content": "Count: one, two,"}]]
MAX_TOKENS = 16
MAX_MODEL_LEN = 256
VOCAB = 320


def _perturb_norms(model: transformers.PreTrainedModel) -> None:
    # Random init leaves norms at 1; perturb them so a norm mapped to the wrong key would show.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))


def build_llama3(out: Path) -> Path:
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=MAX_MODEL_LEN,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    _perturb_norms(model)
    return save_checkpoint(model, out, train_tokenizer(vocab_size=VOCAB))


def build_gpt_oss(out: Path) -> Path:
    # Published gpt-oss shapes scaled down: alternating sliding-window (8) and full layers, sinks, YaRN,
    # biases, top-2 of 4 experts.
    config = transformers.GptOssConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=MAX_MODEL_LEN,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 16,
        },
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
    )
    torch.manual_seed(0)
    model = transformers.GptOssForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias") or name.endswith("sinks"):
                p.add_(0.1 * torch.randn_like(p))
            # Well-separated router logits: FP32 rounding differences never flip a top-k choice.
            if "router" in name:
                p.mul_(20.0)
    return save_checkpoint(model, out, train_tokenizer(vocab_size=VOCAB))


def gemma4_config(architecture: str, moe: bool = False) -> transformers.PretrainedConfig:
    # What makes Gemma 4 special in vLLM's path, scaled down: sliding (head size 32, 2 KV heads, window 8)
    # and full layers (head size 64, 1 KV head, V from the K projection, partial proportional rope), KV
    # sharing (layer 3 reads layer 2's cache, layer 4 layer 1's) with double-wide MLPs there, per-layer
    # embeddings, final logit softcapping and tied embeddings; with `moe`, the 26B-A4B block (top-2 of 4
    # experts beside the dense MLP) in every layer.
    sliding, full = "sliding_attention", "full_attention"
    text = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=5,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        global_head_dim=64,
        num_global_key_value_heads=1,
        attention_k_eq_v=True,
        layer_types=[sliding, full, sliding, sliding, full],
        sliding_window=8,
        num_kv_shared_layers=2,
        use_double_wide_mlp=True,
        hidden_size_per_layer_input=16,
        vocab_size_per_layer_input=VOCAB,
        final_logit_softcapping=30.0,
        max_position_embeddings=MAX_MODEL_LEN,
        rms_norm_eps=1e-6,
        rope_parameters={
            sliding: {"rope_type": "default", "rope_theta": 10000.0},
            full: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
        },
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
    )
    if moe:
        text |= dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32)
    if architecture == "Gemma4ForCausalLM":
        return transformers.Gemma4TextConfig(**text)
    # The published multimodal layout: the language model under model.language_model.*, beside towers.
    vision = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        patch_size=4,
        pooling_kernel_size=2,
        position_embedding_size=64,
    )
    audio = dict(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        subsampling_conv_channels=[8, 8],
        conv_kernel_size=3,
        output_proj_dims=32,
    )
    return transformers.Gemma4Config(
        text_config=text, vision_config=vision, audio_config=audio, tie_word_embeddings=True
    )


def build_gemma4(out: Path, architecture: str = "Gemma4ForConditionalGeneration", moe: bool = False) -> Path:
    config = gemma4_config(architecture, moe)
    torch.manual_seed(0)
    model = getattr(transformers, architecture)(config).eval()
    with torch.no_grad():
        # Norms, layer scalars (a checkpointed buffer) and router scales are 1 at init: perturbed so a
        # wrong mapping would show.
        for name, p in [*model.named_parameters(), *model.named_buffers()]:
            if "norm.weight" in name or name.endswith(("layer_scalar", "router.scale", "per_expert_scale")):
                p.add_(0.1 * torch.randn_like(p))
            # Well-separated router logits: FP32 rounding differences never flip a top-k choice.
            if "router.proj" in name:
                p.mul_(20.0)
    return save_checkpoint(model, out, train_tokenizer(vocab_size=VOCAB))


@dataclass(frozen=True)
class PluginCase:
    build: Callable[[Path], Path]
    plugin_model: str  # the plugin's model class, inside our bridge
    vllm_class: str  # vLLM's own class for the architecture (the plugin disabled)
    hf_kwargs: dict = field(default_factory=dict)  # transformers' plain reference implementation
    # vLLM's OpenAI server renders gpt-oss chats in OpenAI's harmony format (token ids above 200k, from
    # the o200k_harmony vocabulary) whatever chat template the checkpoint ships, so a tiny-vocabulary
    # gpt-oss checkpoint cannot take a /v1/chat/completions request.
    server_chat: bool = True
    # A checkpoint of another architecture the plugin registers, for a plugin whose `build` architecture
    # vLLM's own class cannot load here: the plugin must serve it too, and the disabled test uses it
    # (`vllm_class` is then vLLM's class for this one). Gemma 4: vLLM's multimodal class imports
    # transformers' Gemma4Processor, whose image processor needs torchvision; its text-only
    # Gemma4ForCausalLM does not.
    fallback_build: Callable[[Path], Path] | None = None


PLUGINS: dict[str, PluginCase] = {
    "llama3": PluginCase(
        build_llama3,
        "trnmodels.llama3.model.LlamaForCausalLM",
        "vllm.model_executor.models.llama.LlamaForCausalLM",
    ),
}
if find_spec("trnmodels.gpt_oss") is not None:
    PLUGINS["gpt_oss"] = PluginCase(
        build_gpt_oss,
        "trnmodels.gpt_oss.model.GptOssForCausalLM",
        "vllm.model_executor.models.gpt_oss.GptOssForCausalLM",
        {"attn_implementation": "eager", "experts_implementation": "eager"},
        server_chat=False,
    )

if find_spec("trnmodels.gemma4") is not None:
    PLUGINS["gemma4"] = PluginCase(
        build_gemma4,
        "trnmodels.gemma4.model.Gemma4ForCausalLM",
        "vllm.model_executor.models.gemma4.Gemma4ForCausalLM",
        {"attn_implementation": "eager"},
        # The text-only export, with the MoE block: vLLM serves the 26B-A4B layout through both classes.
        fallback_build=partial(build_gemma4, architecture="Gemma4ForCausalLM", moe=True),
    )


@dataclass(frozen=True)
class TinyCheckpoint:
    plugin: str
    path: Path
    case: PluginCase

    def hf_greedy(self, prompt_ids: list[int]) -> list[int]:
        """transformers' ``generate``, greedy, never stopping early (like vLLM's ``ignore_eos``)."""
        model = transformers.AutoModelForCausalLM.from_pretrained(
            self.path, dtype=torch.float32, **self.case.hf_kwargs
        ).eval()
        ids = torch.tensor([prompt_ids])
        # The checkpoint's generation_config.json names EOS; without one, generate runs to max_new_tokens.
        model.generation_config.eos_token_id = None
        config = transformers.GenerationConfig(
            do_sample=False, max_new_tokens=MAX_TOKENS, eos_token_id=None, pad_token_id=2
        )
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
        assert out.shape[1] == len(prompt_ids) + MAX_TOKENS, "reference stopped early"
        return out[0, len(prompt_ids) :].tolist()


def vllm_env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRNMODELS_VLLM_DISABLE"}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return env | overrides


def run_offline(
    checkpoint: Path,
    tmp_path: Path,
    prompts: list[str] = PROMPTS,
    chats: list[list[dict[str, str]]] = CHATS,
    **env: str,
) -> dict:
    """Generate ``prompts`` and ``chats`` greedily with ``vllm.LLM`` in a fresh interpreter."""
    request = tmp_path / "request.json"
    request.write_text(
        json.dumps(
            {"prompts": prompts, "chats": chats, "max_tokens": MAX_TOKENS, "max_model_len": MAX_MODEL_LEN}
        )
    )
    proc = subprocess.run(
        [sys.executable, str(HERE / "vllm_offline.py"), str(checkpoint), str(request)],
        capture_output=True,
        text=True,
        timeout=600,
        env=vllm_env(**env),
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(
            f"vLLM offline run failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        )
    result = json.loads(lines[-1].removeprefix("RESULT "))
    result["log"] = proc.stdout + proc.stderr
    return result

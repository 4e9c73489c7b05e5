"""What the vLLM integration tests share: tiny checkpoints of every installed LLM plugin, transformers'
greedy reference for them, and running vLLM offline in a fresh interpreter.

The checkpoints are saved the way published ones are (``save_pretrained`` plus a tokenizer that ships a
chat template). vLLM's CPU attention supports head sizes 32, 64, 80, ...: the configs use 32.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
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


def run_offline(checkpoint: Path, tmp_path: Path, **env: str) -> dict:
    """Generate ``PROMPTS`` and ``CHATS`` greedily with ``vllm.LLM`` in a fresh interpreter."""
    request = tmp_path / "request.json"
    request.write_text(
        json.dumps(
            {"prompts": PROMPTS, "chats": CHATS, "max_tokens": MAX_TOKENS, "max_model_len": MAX_MODEL_LEN}
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

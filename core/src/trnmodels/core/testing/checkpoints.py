"""Build tiny random checkpoints the way a published one looks: ``save_pretrained`` plus a tokenizer.

The tokenizer is a byte-level BPE trained here on a few strings, so any text encodes, and it ships a
chat template so serving tests can use the chat endpoint.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Collection, Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedModel, PreTrainedTokenizerFast

SAMPLE_TEXTS = [
    "Hello, my name is Trainium and I serve models.",
    "The quick brown fox jumps over the lazy dog.",
    "vLLM schedules requests; the model computes logits for each token.",
    "Paged attention stores keys and values in fixed-size blocks.",
    "Tensor parallelism splits attention heads across NeuronCores.",
    "Once upon a time, a small model learned to count: one, two, three.",
]

BOS, EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"

# Llama-3-style turns, trimmed to what a tiny model needs.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}{{ eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def train_tokenizer(texts: list[str] | None = None, vocab_size: int = 320) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (BOS prepended on encode) with BOS/EOS/PAD and a chat template;
    ids < ``vocab_size``; BOS, EOS and PAD are ids 0, 1 and 2."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS, PAD, "<|user|>", "<|assistant|>", "<|system|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts or SAMPLE_TEXTS, trainer)
    # Like Llama 3's tokenizer: encoding prepends BOS.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", special_tokens=[(BOS, tok.token_to_id(BOS))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, chat_template=CHAT_TEMPLATE
    )


def save_checkpoint(
    model: PreTrainedModel,
    out_dir: str | Path,
    tokenizer: PreTrainedTokenizerFast | None = None,
    max_shard_size: str | int | None = None,
) -> Path:
    """``save_pretrained`` the model (sharded when ``max_shard_size`` is given) and the tokenizer."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size is not None else {}
    model.save_pretrained(out, **kwargs)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out


def save_random_checkpoint(
    config_dir: str | Path, out_dir: str | Path, *, seed: int = 0, with_tokenizer: bool = True
) -> Path:
    """Random weights for a bundled ``config.json`` (a plugin's ``tiny``/``bench`` config), saved by
    transformers, plus a tokenizer trained here whose BOS/EOS/PAD ids (0/1/2) the config must use."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(config_dir)
    text = config.get_text_config()  # a multimodal config keeps its vocabulary and special ids here
    tokenizer = None
    if with_tokenizer:
        tokenizer = train_tokenizer(vocab_size=text.vocab_size)
        specials = (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
        declared = (text.bos_token_id, text.eos_token_id, text.pad_token_id)
        if specials != declared:
            raise ValueError(
                f"{config_dir}/config.json: bos/eos/pad_token_id {declared} must be {specials} to match "
                "the test tokenizer"
            )
    torch.manual_seed(seed)
    return save_checkpoint(AutoModelForCausalLM.from_config(config, dtype=torch.float32), out_dir, tokenizer)


def quantize_checkpoint_mxfp4(
    src: str | Path,
    dst: str | Path,
    *,
    weights: Collection[str],
    modules_to_not_convert: Sequence[str],
) -> Path:
    """A copy of a saved checkpoint whose ``weights`` (the last component of a key) are stored as MXFP4
    ``*_blocks``/``*_scales`` pairs in one file, with the ``quantization_config`` that says so (the model's
    publisher lists ``modules_to_not_convert``): the layout gpt-oss is published in. Tokenizer and other
    files are copied as they are."""
    from safetensors.torch import load_file, save_file

    from ..quant import quantize_mxfp4

    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True)
    tensors = {}
    for file in sorted(src.glob("*.safetensors")):
        for key, value in load_file(file).items():
            if key.rsplit(".", 1)[-1] in weights:
                tensors[f"{key}_blocks"], tensors[f"{key}_scales"] = quantize_mxfp4(value.float())
            else:
                tensors[key] = value
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": list(modules_to_not_convert),
    }
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    for extra in src.iterdir():
        if extra.suffix != ".safetensors" and extra.name not in (
            "config.json",
            "model.safetensors.index.json",
        ):
            shutil.copy2(extra, dst / extra.name)
    return dst

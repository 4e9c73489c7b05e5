"""Run one offline vLLM generation in this fresh interpreter and print the result as JSON on the last line.

    python vllm_offline.py CHECKPOINT_DIR REQUEST.json

A fresh interpreter per run because vLLM loads its plugins (and so reads ``TRNMODELS_VLLM_DISABLE``) once
per process. The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so the test can ask
the engine which model class it built.
"""

import json
import os
import sys

import torch

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from vllm import LLM, SamplingParams


def describe(model) -> dict:
    """The class vLLM built, and the plugin model inside it when it is our bridge."""
    inner = getattr(model, "model", None)
    return {
        "class": f"{type(model).__module__}.{type(model).__qualname__}",
        "inner": f"{type(inner).__module__}.{type(inner).__qualname__}",
        # Set by vLLM's support_torch_compile once its compiled forward has run.
        "compiled": bool(getattr(model, "compiled", False)),
    }


def main() -> None:
    checkpoint, request_file = sys.argv[1], sys.argv[2]
    with open(request_file) as f:
        request = json.load(f)
    llm = LLM(
        model=checkpoint,
        dtype=request.get("dtype", "float32"),
        enforce_eager=request.get("enforce_eager", True),
        max_model_len=request["max_model_len"],
        max_num_seqs=8,
        seed=0,
        enable_prompt_embeds=request.get("enable_prompt_embeds", False),
    )
    params = SamplingParams(temperature=0.0, max_tokens=request["max_tokens"], ignore_eos=True)
    completions = llm.generate(request["prompts"], params, use_tqdm=False)
    chats = llm.chat(request["chats"], params, use_tqdm=False) if request["chats"] else []
    embedded = [{"prompt_embeds": torch.load(path)} for path in request.get("prompt_embeds", [])]
    from_embeds = llm.generate(embedded, params, use_tqdm=False) if embedded else []
    result = {
        "model": llm.apply_model(describe)[0],
        "completions": [
            {"prompt_token_ids": list(o.prompt_token_ids), "token_ids": list(o.outputs[0].token_ids)}
            for o in completions
        ],
        "chats": [
            {"prompt_token_ids": list(o.prompt_token_ids), "token_ids": list(o.outputs[0].token_ids)}
            for o in chats
        ],
        "from_embeds": [list(o.outputs[0].token_ids) for o in from_embeds],
    }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()

"""``trnmodels`` as an lm-evaluation-harness model: any checkpoint an installed plugin serves.

``--model trnmodels --model_args pretrained=CKPT,tp=N,ep=N,dtype=float32|bfloat16,eager=false,...``

- ``loglikelihood`` / ``loglikelihood_rolling``: teacher-forced log-probs from packed prefills over the
  paged KV cache (``RankWorker.score``). Tokenization, the empty-context rule, left truncation and the
  rolling windows (``get_rolling_token_windows`` + ``make_disjoint_window``, context 1) are lm_eval's own,
  as its ``hf`` model applies them, so the same windows are scored.
- ``generate_until``: the runner (compiled graphs when cached, unless ``eager=true``) with the task's stop
  strings plus EOS; contexts are left-truncated to ``max_model_len - max_gen_toks``.

The ranks (``tp * ep`` local gloo processes, or this process for one rank) are started and the weights
loaded once, when the model is created, and serve every request of the run.

Model args (beside ``pretrained``): ``tp``, ``ep`` (1), ``dtype`` (float32), ``eager`` (false: use
compiled graphs for generation when the artifact cache has them), ``max_model_len`` (the model's, capped
at 512; also lm_eval's ``max_length``), ``max_num_seqs`` (8), ``block_size`` (32),
``num_batched_tokens_buckets`` / ``num_seqs_buckets`` / ``context_len_buckets`` (``128:256:512`` style,
as ``trnmodels compile`` takes them with commas), ``cache_dir``, ``batch_size`` (sequences per scoring
step; default: as many as fit), ``max_batched_tokens`` (tokens per scoring step; default
``max_model_len``), ``max_gen_toks`` (256), ``add_bos_token``, ``prefix_token_id``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import (
    Collator,
    _add_special_kwargs,
    handle_stop_sequences,
    has_bos_prefix,
    normalize_gen_kwargs,
    postprocess_generated_text,
)
from tqdm import tqdm

from ..errors import ConfigError
from ..runner.config import SamplingParams
from ..runner.generate import runner_config_for
from .ranks import ModelSpec, RankPool, ScoreRequest

logger = logging.getLogger(__name__)

DTYPES = ("float32", "bfloat16", "float16")
# Requests handed to the ranks per call (the ranks pack them into steps); a progress-bar granularity.
REQUESTS_PER_CALL = 64
# lm_eval's CLI passes these to every model; they mean nothing on this path.
IGNORED_ARGS = ("device", "trust_remote_code", "max_batch_size")


def _bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.lower() in ("true", "1", "yes")
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ConfigError(f"{name}: expected true or false, got {value!r}")


def _int(name: str, value: Any, minimum: int = 1) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: expected an integer, got {value!r}") from None
    if number < minimum or (isinstance(value, float) and value != number):
        raise ConfigError(f"{name}: expected an integer ≥ {minimum}, got {value!r}")
    return number


def _buckets(name: str, value: Any) -> tuple[int, ...] | None:
    """``None``, an int, a list/tuple, or ``"128:256:512"`` (lm_eval splits model args on commas)."""
    if value is None:
        return None
    if isinstance(value, int):
        return (value,)
    items = value.replace(",", ":").split(":") if isinstance(value, str) else list(value)
    return tuple(_int(name, v) for v in items if str(v).strip())


@register_model("trnmodels")
class TrnModelsLM(TemplateLM):
    """lm_eval's ``LM`` on the trnmodels runner (see the module docstring for the model args)."""

    backend = "causal"

    def __init__(
        self,
        pretrained: str,
        tp: int = 1,
        ep: int = 1,
        dtype: str = "float32",
        eager: bool = False,
        max_model_len: int | None = None,
        max_num_seqs: int = 8,
        block_size: int = 32,
        num_batched_tokens_buckets: Any = None,
        num_seqs_buckets: Any = None,
        context_len_buckets: Any = None,
        cache_dir: str | None = None,
        batch_size: Any = None,
        max_batched_tokens: int | None = None,
        max_gen_toks: int = 256,
        add_bos_token: bool | None = None,
        prefix_token_id: int | None = None,
        **kwargs: Any,
    ):
        super().__init__()
        unknown = sorted(set(kwargs) - set(IGNORED_ARGS))
        if unknown:
            raise ConfigError(f"trnmodels model args: unknown {unknown}")
        if dtype not in DTYPES:
            raise ConfigError(f"dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
        from transformers import AutoTokenizer

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(pretrained), local_files_only=True)
        except (OSError, ValueError) as e:
            raise ConfigError(f"{pretrained}: no usable tokenizer: {e}") from None
        runner = runner_config_for(
            pretrained,
            max_num_seqs=_int("max_num_seqs", max_num_seqs),
            max_model_len=None if max_model_len is None else _int("max_model_len", max_model_len),
            block_size=_int("block_size", block_size),
            num_batched_tokens_buckets=_buckets("num_batched_tokens_buckets", num_batched_tokens_buckets),
            num_seqs_buckets=_buckets("num_seqs_buckets", num_seqs_buckets),
            context_len_buckets=_buckets("context_len_buckets", context_len_buckets),
        )
        seqs = None if batch_size in (None, "auto") or str(batch_size).startswith("auto") else batch_size
        self.spec = ModelSpec(
            checkpoint_dir=str(pretrained),
            runner=runner,
            dtype=dtype,
            tp=_int("tp", tp),
            ep=_int("ep", ep),
            eager=_bool("eager", eager),
            cache_dir=cache_dir,
            max_batched_tokens=None
            if max_batched_tokens is None
            else _int("max_batched_tokens", max_batched_tokens),
            max_batch_seqs=None if seqs is None else _int("batch_size", seqs),
        )
        self._max_gen_toks = _int("max_gen_toks", max_gen_toks)
        self.add_bos_token = None if add_bos_token is None else _bool("add_bos_token", add_bos_token)
        self.custom_prefix_token_id = (
            None if prefix_token_id is None else _int("prefix_token_id", prefix_token_id, 0)
        )
        self.pretrained = str(pretrained)
        self.pool = RankPool(self.spec)

    # -- what lm_eval asks of a model ---------------------------------------------------------------

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        if self.custom_prefix_token_id is not None:
            return self.custom_prefix_token_id
        if self.tokenizer.bos_token_id is not None:
            return self.tokenizer.bos_token_id
        return self.tokenizer.eos_token_id

    @property
    def max_length(self) -> int:
        return self.spec.runner.max_model_len

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer.name_or_path.replace("/", "__")

    def get_model_info(self) -> dict[str, Any]:
        return {
            "model": "trnmodels",
            "pretrained": self.pretrained,
            "tp": self.spec.tp,
            "ep": self.spec.ep,
            "dtype": self.spec.dtype,
            "eager": self.spec.eager,
            "max_model_len": self.max_length,
            **self.runner_info(),
        }

    def runner_info(self) -> dict[str, Any]:
        """Compiled graphs loaded, and how many runner steps ran through one so far."""
        return self.pool.call("info")

    def close(self) -> None:
        """Stop the ranks (they also stop when the process exits)."""
        self.pool.close()

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        special = _add_special_kwargs(add_special_tokens, self.add_bos_token)
        # A string that already starts with the prefix (BOS) token gets no second one.
        if add_special_tokens is None and has_bos_prefix(string, self.tokenizer.decode(self.prefix_token_id)):
            special["add_special_tokens"] = False
        return self.tokenizer.encode(string, **special)

    def tok_decode(self, tokens: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        return self.tokenizer.apply_chat_template(
            chat_history, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    # -- scoring ----------------------------------------------------------------------------------

    def _score(self, requests: list[ScoreRequest], desc: str, disable_tqdm: bool) -> list:
        """Scores in request order; the ranks see them longest first (fewer, fuller steps)."""
        order = sorted(range(len(requests)), key=lambda i: -len(requests[i].input_ids))
        results: list = [None] * len(requests)
        with tqdm(total=len(requests), desc=desc, disable=disable_tqdm) as bar:
            for start in range(0, len(order), REQUESTS_PER_CALL):
                chunk = order[start : start + REQUESTS_PER_CALL]
                for i, score in zip(
                    chunk, self.pool.call("score", [requests[i] for i in chunk]), strict=True
                ):
                    results[i] = score
                bar.update(len(chunk))
        return results

    def _to_score_request(self, context_enc: list[int], continuation_enc: list[int]) -> ScoreRequest:
        if not context_enc or not continuation_enc:
            raise ConfigError("loglikelihood: context and continuation must both be at least one token")
        if len(continuation_enc) > self.max_length:
            raise ConfigError(
                f"loglikelihood: a continuation of {len(continuation_enc)} tokens is longer than "
                f"max_length={self.max_length}"
            )
        # As lm_eval's hf model: keep the last max_length + 1 tokens, feed all but the last.
        whole = (context_enc + continuation_enc)[-(self.max_length + 1) :]
        return ScoreRequest(tuple(whole[:-1]), tuple(continuation_enc))

    def _loglikelihood_tokens(
        self,
        requests: list[tuple[tuple[str, str], list[int], list[int]]],
        disable_tqdm: bool = False,
        **kwargs: Any,
    ) -> list[tuple[float, bool]]:
        scores = self._score(
            [self._to_score_request(ctx, cont) for _, ctx, cont in requests],
            "Running loglikelihood requests",
            disable_tqdm,
        )
        out = []
        for (request_str, _, _), score in zip(requests, scores, strict=True):
            answer = (score.total, score.greedy)
            if request_str is not None:
                self.cache_hook.add_partial("loglikelihood", request_str, answer)
            out.append(answer)
        return out

    def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
        windows: list[ScoreRequest] = []
        owner: list[int] = []
        for index, (string,) in enumerate(req.args for req in requests):
            for context, continuation in map(
                lm_utils.make_disjoint_window,
                lm_utils.get_rolling_token_windows(
                    token_list=self.tok_encode(string),
                    prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length,
                    context_len=1,
                ),
            ):
                windows.append(self._to_score_request(context, continuation))
                owner.append(index)
        scores = self._score(windows, "Running loglikelihood_rolling windows", disable_tqdm)
        totals = [0.0] * len(requests)
        per_request: list[list[float]] = [[] for _ in requests]
        for index, score in zip(owner, scores, strict=True):
            per_request[index].append(score.total)
        for index, req in enumerate(requests):
            totals[index] = sum(per_request[index])
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, totals[index])
        return totals

    # -- generation -------------------------------------------------------------------------------

    def _sampling_params(self, kwargs: dict[str, Any], max_gen_toks: int) -> SamplingParams:
        do_sample = bool(kwargs.pop("do_sample", False))
        temperature = float(kwargs.pop("temperature", 0.0) or 0.0)  # normalize_gen_kwargs: 0 unless sampling
        temperature = temperature if do_sample else 0.0
        params = SamplingParams(
            max_new_tokens=max_gen_toks,
            temperature=temperature,
            top_k=int(kwargs.pop("top_k", 0) or 0),
            top_p=float(kwargs.pop("top_p", 1.0) or 1.0),
            seed=kwargs.pop("seed", None),
        )
        if kwargs:
            logger.warning("trnmodels: generation kwargs ignored: %s", sorted(kwargs))
        return params

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        eos = self.tok_decode([self.eot_token_id], skip_special_tokens=False)
        collator = Collator(
            [req.args for req in requests],
            sort_fn=lambda args: (-len(self.tok_encode(args[0])), args[0]),
            group_by="gen_kwargs",
            group_fn=lambda args: args[1],
        )
        results: list[str] = []
        bar = tqdm(total=len(requests), desc="Running generate_until requests", disable=disable_tqdm)
        # Groups of equal generation kwargs, longest first; the runner batches and schedules inside a call.
        for chunk in collator.get_batched(n=REQUESTS_PER_CALL):
            contexts, all_kwargs = zip(*chunk, strict=True)
            kwargs = dict(normalize_gen_kwargs(all_kwargs[0], self.max_gen_toks))
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
            max_gen_toks = kwargs.pop("max_gen_toks")
            max_ctx_len = self.max_length - max_gen_toks
            if max_ctx_len < 1:
                raise ConfigError(
                    f"generate_until: max_gen_toks={max_gen_toks} leaves no room for a prompt in "
                    f"max_length={self.max_length}"
                )
            params = self._sampling_params(kwargs, max_gen_toks)
            prompts = [self.tok_encode(c)[-max_ctx_len:] for c in contexts]
            outputs = self.pool.call("generate", prompts, params, until)
            for context, gen_kwargs, token_ids in zip(contexts, all_kwargs, outputs, strict=True):
                text = postprocess_generated_text(
                    self.tok_decode(token_ids), stop=until, think_end_token=None
                )
                self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
                results.append(text)
                bar.update(1)
        bar.close()
        return collator.get_original(results)

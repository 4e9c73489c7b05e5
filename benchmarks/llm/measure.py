"""The benchmark's measurements. Each returns JSON-ready numbers (seconds, bytes, tokens/s).

Peak RSS is read from ``/proc/self/status`` (Linux): ``VmHWM`` is reset through ``/proc/self/clear_refs``
just before the measured block, so it is the exact peak of that block; a sampling thread adds the split
into anonymous and file-backed (memory-mapped) pages. A freed block's pages often stay with the process
(the allocator keeps them for reuse), so a later block in the same process can peak lower than it would
alone: measurements that must not see each other run in a fresh process each (``run_in_fresh_process``;
weight loads through ``run_load_child``, any build-then-run case through ``case_memory``).
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from safetensors.torch import load_file

from trnmodels.core.errors import ConfigError
from trnmodels.core.runner.config import RunnerConfig

from ..machine import busy_cpu_seconds, compiler_side_by_side_slowdown, proc_bytes, side_by_side_slowdown

# Sized so every bucket is used and nothing else is compiled: prefill of up to 256 flat tokens, decode
# at batch 1 and 8 with contexts up to 256.
BENCH_RUNNER = RunnerConfig(
    max_num_seqs=8,
    max_model_len=256,
    block_size=32,
    num_batched_tokens_buckets=(256,),
    num_seqs_buckets=(1, 8),
    context_len_buckets=(256,),
)

Generate = Callable[[list[list[int]], int], object]


# -- machine time -------------------------------------------------------------------------------------


def cpu_seconds() -> tuple[float, float]:
    """Busy CPU seconds of the whole machine (/proc/stat), and of this process plus its waited-for
    descendants: their difference over a run is what other processes used."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return busy_cpu_seconds(), me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def memory_bandwidth(nbytes: int = 1 << 30, repeats: int = 5) -> float:
    """Best ``dst.copy_(src)`` bandwidth in bytes/s over ``nbytes`` of float32, counting read + write."""
    src = torch.ones(max(nbytes // 4, 1))
    dst = torch.empty_like(src)
    dst.copy_(src)  # fault every page in before timing
    best = min(timed(functools.partial(dst.copy_, src)) for _ in range(repeats))
    return 2 * src.numel() * src.element_size() / best


def read_bandwidth(nbytes: int = 1 << 30, repeats: int = 5) -> float:
    """Best ``src.sum()`` bandwidth in bytes/s over ``nbytes`` of float32, counting bytes read: a stream
    that only reads, as a decode step reads its weights (a copy also writes, and runs slower)."""
    src = torch.ones(max(nbytes // 4, 1))
    src.sum()  # fault every page in before timing
    best = min(timed(src.sum) for _ in range(repeats))
    return src.numel() * src.element_size() / best


# -- checkpoint -------------------------------------------------------------------------------------


def shard_files(checkpoint_dir: str | Path) -> list[Path]:
    return sorted(Path(checkpoint_dir).glob("*.safetensors"))


def make_checkpoint(plugin_name: str, out_dir: str | Path, seed: int = 0) -> dict[str, Any]:
    """Random weights for the plugin's bundled ``bench`` config, saved by transformers in ≥2 shards with a
    tokenizer trained here; ``checkpoint_info`` of it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from trnmodels.core.plugins import discover_plugins
    from trnmodels.core.testing import save_checkpoint, train_tokenizer

    plugins = discover_plugins()
    if plugin_name not in plugins:
        raise ConfigError(
            f"no installed plugin named {plugin_name!r}; installed: {', '.join(plugins) or 'none'}"
        )
    config = AutoConfig.from_pretrained(plugins[plugin_name].bundled_config_dir("bench"))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    # A tokenizer only so `trnmodels generate` can run on it (its start-up is measured).
    tokenizer = train_tokenizer(vocab_size=config.vocab_size)
    save_checkpoint(model, out_dir, tokenizer, max_shard_size=param_bytes // 3 + 1)
    files = shard_files(out_dir)
    if len(files) < 2:
        raise RuntimeError(f"expected a sharded checkpoint, got {[f.name for f in files]}")
    return checkpoint_info(out_dir)


def checkpoint_info(checkpoint_dir: str | Path) -> dict[str, Any]:
    """What the page says of a checkpoint, and the bytes a decode step reads: the sizes come from the model
    transformers builds from its config.json (on the meta device: shapes only, nothing allocated), in
    float32 as the benchmark runs it, and the file sizes from its safetensors shards."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(checkpoint_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    params = list(model.parameters())  # tied weights appear once
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    head = model.get_output_embeddings()
    # Every table a step only indexes, one row per token: the input embedding and any other (Gemma 4's
    # per-layer-input table), unless it is also the LM head, which reads all of it.
    looked_up = [
        m.weight
        for m in model.modules()
        if isinstance(m, torch.nn.Embedding) and (head is None or m.weight is not head.weight)
    ]
    files = shard_files(checkpoint_dir)
    expert_params = [p for name, p in model.named_parameters() if ".experts." in name]
    experts = (
        {
            "num_experts": config.num_local_experts,
            "experts_per_token": config.num_experts_per_tok,
            "expert_bytes": sum(p.numel() * p.element_size() for p in expert_params),
        }
        if getattr(config, "num_local_experts", None)
        else None
    )
    return {
        "dir": str(checkpoint_dir),
        "architecture": config.architectures[0],
        "experts": experts,
        "num_parameters": sum(p.numel() for p in params),
        "parameter_bytes": param_bytes,
        "bytes": sum(f.stat().st_size for f in files),
        "largest_tensor_bytes": max(p.numel() * p.element_size() for p in params),
        "shards": len(files),
        # A decode step reads every weight once, except the tables it only looks rows up in.
        "weight_bytes_per_token": param_bytes - sum(w.numel() * w.element_size() for w in looked_up),
        "vocab_size": config.vocab_size,
        "pad_token_id": next(
            (t for t in (config.pad_token_id, config.eos_token_id, 0) if isinstance(t, int)), 0
        ),
    }


def read_into_page_cache(checkpoint_dir: str | Path, chunk: int = 64 << 20) -> int:
    """Read every shard once, so the loading rounds of a checkpoint that was not just written read it from
    memory as they do one that was; the bytes read."""
    total = 0
    for path in shard_files(checkpoint_dir):
        with open(path, "rb", buffering=0) as f:
            while block := f.read(chunk):
                total += len(block)
    return total


# -- memory -----------------------------------------------------------------------------------------


class PeakMemory:
    """Peak RSS over a ``with`` block, in bytes: ``peak_rss`` (exact, VmHWM reset at entry) and the
    sampled peaks of anonymous (``RssAnon``) and file-backed (``RssFile``) pages."""

    FIELDS = ("RssAnon", "RssFile")

    def __init__(self, interval: float = 0.002):
        self.interval = interval
        self.result: dict[str, Any] = {}
        self._stop = threading.Event()
        self._peaks: dict[str, int] = {}

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            status = proc_bytes("/proc/self/status")
            for k in self.FIELDS:
                self._peaks[k] = max(self._peaks[k], status.get(k, 0))

    def __enter__(self) -> PeakMemory:
        try:
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
            reset = True
        except OSError:
            reset = False
        self._base = proc_bytes("/proc/self/status")
        self._peaks = {k: self._base.get(k, 0) for k in self.FIELDS}
        self.result["hwm_reset"] = reset
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
        end = proc_bytes("/proc/self/status")
        peaks = {k: max(v, end.get(k, 0)) for k, v in self._peaks.items()}
        self.result |= {
            "baseline_rss": self._base["VmRSS"],
            "peak_rss": end["VmHWM"],
            "peak_added": end["VmHWM"] - self._base["VmRSS"],
            "anon_added": peaks["RssAnon"] - self._base.get("RssAnon", 0),
            "file_added": peaks["RssFile"] - self._base.get("RssFile", 0),
        }


_MADV_POPULATE_READ = 22  # Linux 5.14+


def fault_in_library_code() -> int:
    """Make every loaded shared library's read-only pages (its code and constants) resident, and return
    the bytes that added to the RSS.

    An op's first call maps the library code that runs it: torch's first ``sum()`` here adds 2.3 MB of
    file-backed RSS and 0.03 MB of memory. A pass peak measured after this counts the memory the pass
    allocates, not which of torch's kernels it happens to call first. The pages are the page cache's,
    shared with every process that loads the library.
    """
    before = proc_bytes("/proc/self/status").get("RssFile", 0)
    libc = ctypes.CDLL(None, use_errno=True)
    page = os.sysconf("SC_PAGE_SIZE")
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) < 6 or not fields[1].startswith("r") or "w" in fields[1]:
            continue
        if ".so" not in os.path.basename(fields[5]):
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        if libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), _MADV_POPULATE_READ):
            for address in range(start, end, page):  # an older kernel: touch each page
                ctypes.string_at(address, 1)
    return proc_bytes("/proc/self/status").get("RssFile", 0) - before


def case_memory(build: Callable[[], Callable[[], object]]) -> dict[str, Any]:
    """The memory of one case, in bytes: ``build()`` (load a model, make its inputs) returns the pass,
    which runs once. Call it in a fresh process (``run_in_fresh_process``) right after the imports, so
    the figures are the case's own and not what earlier work left in the allocator. Between the build
    and the pass, the loaded libraries' code is made resident (``fault_in_library_code``).

    ``baseline_rss``: the RSS on entry (after the imports); ``build_added``: the RSS the built case holds
    above it; ``library_code``: the RSS the libraries' code then added; ``pass_added``: the pass's peak
    above the RSS it starts from (its activations, first-call caches included, library code not);
    ``peak_added``: the highest RSS of build and pass above the baseline, library code not counted;
    ``process_peak``: the process's RSS high-water mark, imports included, library code counted only as
    far as the imports and the build mapped it.
    """
    import_peak = proc_bytes("/proc/self/status").get("VmHWM", 0)
    with PeakMemory() as built:
        run = build()
    build_added = proc_bytes("/proc/self/status")["VmRSS"] - built.result["baseline_rss"]
    library_code = fault_in_library_code()
    with PeakMemory() as ran, torch.no_grad():
        run()
    baseline = built.result["baseline_rss"]
    peak_added = max(built.result["peak_added"], build_added + ran.result["peak_added"])
    return {
        "baseline_rss": baseline,
        "build_added": build_added,
        "library_code": library_code,
        "pass_added": ran.result["peak_added"],
        "peak_added": peak_added,
        "process_peak": max(import_peak, baseline + peak_added),
        "hwm_reset": built.result["hwm_reset"] and ran.result["hwm_reset"],
    }


# -- fresh processes --------------------------------------------------------------------------------


# glibc's allocator raises its mmap threshold as large blocks are freed, after which freed tensors stay
# in the process's heap and reused pages hide new peaks: the peaks of one case then vary by tens of
# percent between processes. Fixed at 64 KiB, every tensor of that size or more is its own mapping,
# unmapped on free, so RSS follows the live tensors and a peak repeats from run to run.
EXACT_RSS_ENV = {"MALLOC_MMAP_THRESHOLD_": str(64 << 10)}
REPO_ROOT = Path(__file__).resolve().parents[2]


def run_in_fresh_process(target: str, *args: Any, env: Mapping[str, str] | None = None) -> Any:
    """``target(*args)`` (``"package.module:function"``, importable) in a new Python process, with
    ``env`` added to its environment (e.g. ``EXACT_RSS_ENV``); its JSON-ready return value. ``args`` must
    be JSON-ready too. The child's error is raised here as a RuntimeError with the end of its stderr."""
    # The child imports only the target's module (not this package), so its imports are the target's own.
    code = (
        "import importlib, json, sys; module, _, function = sys.argv[1].partition(':'); "
        "print(json.dumps(getattr(importlib.import_module(module), function)(*json.loads(sys.argv[2]))))"
    )
    # The benchmarks folder is not installed: the child finds it from the repository root, wherever it runs.
    pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-c", code, target, json.dumps(args)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": pythonpath, **(env or {})},
    )
    if proc.returncode:
        call = f"{target}({', '.join(map(repr, args))})"
        raise RuntimeError(f"{call} in a fresh process failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- weight loading (run in child processes) -------------------------------------------------------


def load_rank(rank: int, world_size: int, checkpoint_dir: str) -> list[dict[str, Any]]:
    """Build this rank's model, time ``load_weights``; every rank's figures, gathered on each rank."""
    import torch.distributed as dist

    from trnmodels.core.causal_lm import build_model
    from trnmodels.core.hf_config import load_hf_config
    from trnmodels.core.plugins import plugin_for_architecture
    from trnmodels.core.runtime_config import NeuronConfig

    config = NeuronConfig(
        tp_degree=world_size, block_size=BENCH_RUNNER.block_size, max_model_len=BENCH_RUNNER.max_model_len
    )
    # Do the lazy imports first (the plugin, transformers' config classes: ~150 MB of RSS), so they land
    # in the baseline rather than in the measurement. No throwaway model: freeing one would change how
    # the allocator places the parameters (heap instead of fresh, huge-page-backed mappings).
    plugin_for_architecture(load_hf_config(checkpoint_dir).architectures[0]).load_factory()
    with PeakMemory() as memory:
        model = build_model(checkpoint_dir, config, load=False)
        seconds = timed(functools.partial(model.load_weights, checkpoint_dir, progress=False))
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    stats = {"rank": rank, "seconds": seconds, "bytes": nbytes, **memory.result}
    if world_size == 1:
        return [stats]
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, stats)
    return gathered


def _read_shard(path: Path) -> dict[str, torch.Tensor]:
    try:
        # safetensors ≥ 0.8 maps files lazily by default (nothing is read); pread reads every byte.
        return load_file(path, backend="pread")
    except TypeError:  # older safetensors: no backend argument, and load_file reads eagerly
        return load_file(path)


def plain_read(checkpoint_dir: str) -> list[dict[str, Any]]:
    """The reference: ``safetensors.torch.load_file`` of every shard, into process memory."""
    with PeakMemory() as memory:
        start = time.perf_counter()
        shards = [_read_shard(f) for f in shard_files(checkpoint_dir)]
        seconds = time.perf_counter() - start
    nbytes = sum(t.numel() * t.element_size() for shard in shards for t in shard.values())
    return [{"rank": 0, "seconds": seconds, "bytes": nbytes, **memory.result}]


def load_child(kind: str, checkpoint_dir: str, tp: int) -> list[dict[str, Any]]:
    """One load's per-rank figures (``kind``: ours, plain), in the fresh process of ``run_load_child``."""
    from trnmodels.core.parallel.launch import run_on_ranks

    return plain_read(checkpoint_dir) if kind == "plain" else run_on_ranks(load_rank, tp, checkpoint_dir)


def run_load_child(kind: str, checkpoint_dir: str, tp: int = 1) -> list[dict[str, Any]]:
    return run_in_fresh_process("benchmarks.llm.measure:load_child", kind, checkpoint_dir, tp)


def median_fields(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The per-field median over repeated runs (numbers only; other fields from the first run)."""
    out = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = statistics.median(r[key] for r in runs)
    return out


def measure_loading(checkpoint_dir: str, repeats: int, tp: int = 2) -> dict[str, Any]:
    """The plain read, ours at TP=1 and ours per rank at TP=``tp``, each repeat in a fresh process. The three
    take turns within every repeat, so a change in machine load hits all of them alike."""
    kinds = {"plain": ("plain", 1), "ours_tp1": ("ours", 1), "ours_tp": ("ours", tp)}
    runs: dict[str, list[list[dict[str, Any]]]] = {name: [] for name in kinds}
    for _ in range(repeats):
        for name, (kind, degree) in kinds.items():
            runs[name].append(run_load_child(kind, checkpoint_dir, degree))
    per_rank = {
        name: [median_fields([run[r] for run in rs]) for r in range(len(rs[0]))] for name, rs in runs.items()
    }
    return {
        "repeats": repeats,
        "tp": tp,
        "plain": per_rank["plain"][0],
        "ours_tp1": per_rank["ours_tp1"][0],
        "ours_tp": per_rank["ours_tp"],
    }


# -- throughput -------------------------------------------------------------------------------------


def random_prompts(lengths: Sequence[int], vocab_size: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (n,), generator=gen).tolist() for n in lengths]


def throughput(
    systems: Mapping[str, Generate],
    prefill_prompt: list[int],
    batches: Mapping[str, list[list[int]]],
    new_tokens: int,
    repeats: int,
    between_rounds: Callable[[], object] | None = None,
) -> dict[str, dict[str, float]]:
    """Per system: prefill tok/s of one prompt, and decode tok/s per batch, i.e. ``batch * (N - 1)``
    tokens over the time to generate N tokens minus the time to generate 1 (the prefill's token).

    One warm-up each, then medians over ``repeats``; the systems take turns within every repeat, so a
    change in machine load hits all of them alike. ``between_rounds`` runs after every repeat (a
    measurement that must see the same machine as the rounds, such as the bandwidth a roofline uses).
    """
    for generate in systems.values():
        generate([prefill_prompt], 1)
        for prompts in batches.values():
            generate(prompts, 2)  # the prefill and the decode graph of this batch
    times: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for _ in range(repeats):
        for name, generate in systems.items():
            times[name, "prefill", 1].append(timed(functools.partial(generate, [prefill_prompt], 1)))
            for batch, prompts in batches.items():
                for n in (1, new_tokens):
                    times[name, batch, n].append(timed(functools.partial(generate, prompts, n)))
        if between_rounds:
            between_rounds()
    med = {key: statistics.median(values) for key, values in times.items()}
    return {
        name: {"prefill": len(prefill_prompt) / med[name, "prefill", 1]}
        | {
            batch: len(prompts) * (new_tokens - 1) / (med[name, batch, new_tokens] - med[name, batch, 1])
            for batch, prompts in batches.items()
        }
        for name in systems
    }


class RecordingGraph:
    """A compiled graph that keeps the inputs of its latest call, so that step can be timed again alone."""

    def __init__(self, graph: Callable[..., Any]):
        self.graph = graph
        self.inputs: tuple[Any, ...] | None = None

    def __call__(self, *inputs: Any) -> Any:
        self.inputs = inputs
        return self.graph(*inputs)


def weight_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The layers whose weights a decode step multiplies a row by: every linear layer and the LM head, each
    weight once."""
    from trnmodels.core.parallel.layers import LINEAR_LAYERS, ParallelLMHead

    kinds = (*LINEAR_LAYERS, ParallelLMHead)
    found = {id(m.weight): m for m in model.modules() if isinstance(m, kinds) and m.weight.dim() == 2}
    return list(found.values())


def weight_matrices(model: torch.nn.Module) -> list[torch.Tensor]:
    """The weights a decode step multiplies a row by (``weight_layers``'), each once."""
    return [layer.weight for layer in weight_layers(model)]


def _per_call(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


class MatrixProducts(torch.nn.Module):
    """Every layer's weight against one row, through core's ``linear`` op: a decode step's matrix-vector
    products alone. The layers are the model's own, so a graph reads what the decode graphs read: their
    packed copies where the model is bound to graphs that call core's GEMM (``pack_for_graphs``, which
    gives the plain weights back), else the weights. One input row per width."""

    def __init__(self, layers: Sequence[torch.nn.Module]):
        super().__init__()
        self.widths = sorted({layer.weight.shape[1] for layer in layers})
        self.layers = torch.nn.ModuleList(layers)

    def forward(self, *rows: torch.Tensor) -> list[torch.Tensor]:
        from trnmodels.core.ops.linear import linear

        by_width = dict(zip(self.widths, rows, strict=True))
        return [linear(by_width[layer.weight.shape[1]], layer.weight) for layer in self.layers]

    def example_rows(self, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        gen = torch.Generator().manual_seed(0)
        return tuple(torch.randn(1, k, generator=gen, dtype=dtype) for k in self.widths)


def decode_split(
    graph: RecordingGraph, model: torch.nn.Module, rounds: int, calls: int = 16, nbytes: int = 1 << 30
) -> dict[str, Any]:
    """Where a compiled batch-1 decode step's time goes, in ``rounds`` rounds taking turns:

    - ``graph_seconds``: the compiled graph alone, called again on its latest step's inputs (the runner's
      own caches; it rewrites the same cache slot with the same values), nothing of the runner around it;
    - ``products_seconds``: the step's matrix-vector products alone (``MatrixProducts``), captured and
      compiled as the decode graphs are (``compile_module``: one row in FP32 takes the form ``cpu.linear``
      gives it in a graph), the model's layers bound to it (their packed weights, as the decode graphs');
    - ``read_bandwidth_bytes_per_s``: a stream that only reads (``read_bandwidth``), between them.

    Medians over the rounds; each of the first two is the mean of ``calls`` calls."""
    from trnmodels.core.compile.driver import compile_module
    from trnmodels.core.compile.load import load_compiled_module

    if graph.inputs is None:
        raise RuntimeError("the decode graph has not run: no step to time")
    inputs = graph.inputs
    weights = weight_matrices(model)
    products = MatrixProducts(weight_layers(model))
    rows = products.example_rows(weights[0].dtype)
    with tempfile.TemporaryDirectory(prefix="trnmodels-products-") as tmp, torch.no_grad():
        path = Path(tmp) / "products.pt2"
        compile_module(products, rows, path, "matrix products")
        compiled = load_compiled_module(path, products)
    times: dict[str, list[float]] = defaultdict(list)
    with torch.inference_mode():
        compiled(*rows)
        graph.graph(*inputs)
        for _ in range(rounds):
            times["graph_seconds"].append(_per_call(lambda: graph.graph(*inputs), calls))
            times["products_seconds"].append(_per_call(lambda: compiled(*rows), calls))
            times["read_bandwidth_bytes_per_s"].append(read_bandwidth(nbytes))
    return {key: statistics.median(values) for key, values in times.items()} | {
        "rounds": rounds,
        "matrices": len(weights),
        "matrix_bytes": sum(w.numel() * w.element_size() for w in weights),
    }


def runner_generate(runner: Any) -> Generate:
    from trnmodels.core.runner.config import SamplingParams

    def generate(prompts: list[list[int]], n: int) -> object:
        return runner.generate(prompts, SamplingParams(max_new_tokens=n, ignore_eos=True))

    return generate


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.int64)
        mask[i, width - len(p) :] = 1
    return ids, mask


def hf_generate(model: Any, pad_id: int) -> Generate:
    """Greedy HF ``generate`` of exactly n tokens (EOS suppressed), batches left-padded."""

    @torch.inference_mode()
    def generate(prompts: list[list[int]], n: int) -> object:
        ids, mask = left_pad(prompts, pad_id)
        return model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=pad_id,
        )

    return generate


# -- compile ----------------------------------------------------------------------------------------


def cold_compile(checkpoint_dir: str, cache_dir: str, jobs: int) -> dict[str, Any]:
    """``compile_all`` of the bench runner's graphs into an empty cache (run in a fresh process, with its own
    empty Inductor cache, so nothing is warm)."""
    from trnmodels.core.compile import CompileTarget, compile_all

    busy_before = cpu_seconds()[1]
    start = time.perf_counter()
    graphs = compile_all(CompileTarget(checkpoint_dir, BENCH_RUNNER), cache_dir, jobs=jobs)
    return {
        "jobs": jobs,
        "seconds": time.perf_counter() - start,
        # Of this process, its workers and the compilers they ran: more than ``seconds`` when even one job
        # keeps more than one core busy at times.
        "cpu_seconds": cpu_seconds()[1] - busy_before,
        "graphs": [{"name": g.name, "seconds": g.seconds, "cache": g.cache} for g in graphs],
    }


def runner_flags(runner: RunnerConfig) -> list[str]:
    """The CLI flags that give ``runner``."""
    return [
        "--max-num-seqs", str(runner.max_num_seqs), "--max-model-len", str(runner.max_model_len),
        "--block-size", str(runner.block_size),
        "--num-batched-tokens-buckets", ",".join(map(str, runner.num_batched_tokens_buckets)),
        "--num-seqs-buckets", ",".join(map(str, runner.num_seqs_buckets)),
        "--context-len-buckets", ",".join(map(str, runner.context_len_buckets)),
    ]  # fmt: skip


def cli_seconds(args: Sequence[str], env: Mapping[str, str]) -> dict[str, Any]:
    """Wall and CPU (user + system) seconds of one ``trnmodels`` command in a new process, and its output."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "trnmodels.core.cli", *args], capture_output=True, text=True, env=dict(env)
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise RuntimeError(f"trnmodels {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_seconds": wall, "cpu_seconds": cpu, "output": proc.stdout}


def cli_start_up(checkpoint_dir: str, cache_dir: str, work_dir: Path, repeats: int) -> dict[str, Any]:
    """A warm ``trnmodels compile`` (all hits) against ``trnmodels info`` (the CLI's imports alone), and
    ``trnmodels generate`` of one token with the cached graphs against ``--eager``: medians of ``repeats``
    after one warm-up each, the commands taking turns. The children may write bytecode (to their own
    prefix folder), as an installed package has it: without it every run recompiles the imports' source."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(work_dir / "pycache")
    flags = [*runner_flags(BENCH_RUNNER), "--cache-dir", cache_dir]
    one_token = ["--prompt", "hello world", "--max-new-tokens", "1", "--ignore-eos", "--json", *flags]
    commands = {
        "info": ["info"],
        "compile_warm": ["compile", checkpoint_dir, *flags],
        "generate_cached": ["generate", checkpoint_dir, *one_token],
        "generate_eager": ["generate", checkpoint_dir, *one_token, "--eager"],
    }
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for round_ in range(repeats + 1):
        for name, args in commands.items():
            figures = cli_seconds(args, env)
            if round_:
                runs[name].append(figures)
    out: dict[str, Any] = {"repeats": repeats}
    for name, figures in runs.items():
        out[name] = {k: v for k, v in median_fields(figures).items() if k != "output"}
    cached = json.loads(runs["generate_cached"][0]["output"].strip().splitlines()[-1])["compiled_graphs"]
    if not cached:
        raise RuntimeError("`trnmodels generate` found none of the graphs just compiled: the flags differ")
    out["generate_cached"]["compiled_graphs"] = cached
    return out


def compile_cache_dir(work_dir: Path, jobs: int) -> str:
    return str(work_dir / f"compile-cache-jobs{jobs}")


def compile_times(checkpoint_dir: str, work_dir: Path, jobs: Sequence[int], repeats: int) -> dict[str, Any]:
    """A cold compile at each of ``jobs`` (each into its own empty caches, in a fresh process), a warm
    ``compile_all`` into the cache of the last (``compile_cache_dir``), and the CLI's start-up figures on
    that cache; before the compiles, ``side_by_side_slowdown`` and ``compiler_side_by_side_slowdown`` at
    the most jobs."""
    from trnmodels.core.compile import CompileTarget, compile_all

    cold = {}
    # What this machine gives that many processes at once, measured just before they compile.
    caps = (
        {
            "side_by_side": side_by_side_slowdown(max(jobs)),
            "compiler_side_by_side": compiler_side_by_side_slowdown(max(jobs)),
        }
        if max(jobs) > 1
        else {}
    )
    for n in jobs:
        cache_dir = compile_cache_dir(work_dir, n)
        env = {"TORCHINDUCTOR_CACHE_DIR": str(work_dir / f"inductor-jobs{n}")}
        cold[n] = run_in_fresh_process(
            "benchmarks.llm.measure:cold_compile", checkpoint_dir, cache_dir, n, env=env
        )
    start = time.perf_counter()
    warm = compile_all(CompileTarget(checkpoint_dir, BENCH_RUNNER), cache_dir)
    warm_seconds = time.perf_counter() - start
    last = cold[jobs[-1]]
    return {
        "jobs": jobs[-1],
        "cold_seconds": last["seconds"],
        "cold_by_jobs": {str(n): c for n, c in cold.items()},
        **caps,
        "warm_seconds": warm_seconds,
        "graphs": [
            {"name": c["name"], "cold_seconds": c["seconds"], "cold": c["cache"], "warm": w.cache}
            for c, w in zip(last["graphs"], warm, strict=True)
        ],
        "cli": cli_start_up(checkpoint_dir, cache_dir, work_dir, repeats),
    }

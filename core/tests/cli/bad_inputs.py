"""Bad input to ``trnmodels logits``, ``generate``, ``compile`` and ``validate``: data only (see ``test_cli_bad_inputs.py``),
plus the numeric flags' edge values ``numeric_flag_cases`` generates from each command's argument types.

``input`` is what the user adds to a run that is otherwise valid; later flags override earlier ones, so
``--out EXISTING_DIR`` replaces the run's own ``--out``. Uppercase words are placeholders the test fills:
``EXISTING_DIR`` a directory, ``FILE`` a regular file, ``MISSING_DIR`` a path that does not exist,
``LONG_IDS`` 129 token ids, ``LONG_TEXT`` a prompt of about 200 tokens, and ``*_CKPT`` a copy of the tiny
Llama 3 checkpoint (4 heads, dense, max_position_embeddings=128, vocab 320) with the named defect.
"""

from trnmodels.core.testing.bad_inputs import BadInput, numeric_flag_cases

_MESH = [
    (
        "--tp 3",
        "num_attention_heads=4 is not divisible by tp_degree=3",
    ),
    (
        "--ep 2",
        "ep_degree=2: expert parallelism needs a mixture-of-experts model",
    ),
    (
        "MODEL_TYPE_GEMMA4_CKPT",
        "model_type 'gemma4' contradicts architectures[0] 'LlamaForCausalLM'",
    ),
]

COMMANDS = ("logits", "generate", "compile", "validate")

BAD_INPUTS = [
    *(BadInput(command, text, message) for command in COMMANDS for text, message in _MESH),
    # every numeric flag: the values just outside what its type accepts (--tp 0, --top-p 1.5, --seed -1, ...)
    *(case for command in COMMANDS for case in numeric_flag_cases(command)),
    # logits: the output file
    BadInput("logits", "--out EXISTING_DIR", "is a directory; expected a file path"),
    BadInput("logits", "--out FILE/x.safetensors", "is not a directory"),
    BadInput("logits", "--out MISSING_DIR/x.safetensors", "does not exist"),
    # logits: the sequence
    BadInput("logits", "--token-ids 1,2,500", "id 500 at position 2 is out of range for vocab size 320"),
    BadInput("logits", "--token-ids 1,x", "argument --token-ids: expected comma-separated integers"),
    BadInput(
        "logits", "--token-ids LONG_IDS", "129 token ids exceed the model's max_position_embeddings=128"
    ),
    BadInput("logits", "--prefill-len 4", "prefill length: expected 1..3 (the number of token ids), got 4"),
    BadInput("logits", "--dtype float64", "argument --dtype: invalid choice: 'float64'"),
    # logits: the checkpoint
    BadInput("logits", "NAN_WEIGHT_CKPT", "logits at position 0 are not finite (NaN or inf)"),
    BadInput("logits", "INT8_WEIGHT_CKPT", "the checkpoint stores torch.int8"),
    # generate: lengths and the checkpoint
    BadInput(
        "generate", "--max-model-len 256", "max_model_len=256 exceeds the model's max_position_embeddings=128"
    ),
    BadInput("generate", "--prompt LONG_TEXT", "more than max_model_len=128"),
    BadInput("generate", "NAN_WEIGHT_CKPT", "prompt 0, generation step 0: logits at position"),
    BadInput("generate", "NO_TOKENIZER_CKPT", "no usable tokenizer for text prompts: none of tokenizer.json"),
    # compile
    BadInput("compile", "--cache-dir FILE/cache", "is not writable"),
    BadInput(
        "compile", "--max-num-seqs 4 --num-seqs-buckets 1,2", "largest bucket 2 cannot hold max_num_seqs = 4"
    ),
    # validate: the prompt
    BadInput("validate", "NO_TOKENIZER_CKPT", "no usable tokenizer for text prompts"),
    BadInput("validate", "--token-ids 1,2,500", "id 500 at position 2 is out of range for vocab size 320"),
    BadInput(
        "validate",
        "--token-ids LONG_IDS",
        "the prompt's 129 tokens and --new-tokens 2: 131 token ids exceed the model's max_position_embeddings=128",
    ),
    BadInput("validate", "--token-ids 1,2 --prefill-len 3", "--prefill-len: expected at most 2"),
    BadInput(
        "validate", "--tasks --ep 2", "ep_degree=2: expert parallelism needs a mixture-of-experts model"
    ),
]

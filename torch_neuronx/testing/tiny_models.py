"""Tiny, fully local Hugging Face models and tokenizers for tests and examples.

Nothing here touches the network: the tokenizer is a byte-level BPE trained in-process
on a short built-in English text, and models are randomly initialised from a config
(the demo model is then briefly fitted to the same text).
Only torch, transformers and tokenizers are imported (never torch_neuronx), so these
helpers can build CPU reference models in the same process as the neuron backend.

Notes on transformers 5.x:
  * ``tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")``
    returns a ``BatchEncoding`` (``input_ids`` and ``attention_mask``), because
    ``return_dict`` now defaults to True. Use ``model.generate(**enc)``, or pass
    ``return_dict=False`` to get just the ``input_ids`` tensor.
  * The chat template already emits ``<s>`` and ``apply_chat_template`` tokenizes
    with ``add_special_tokens=False``, so there is no doubled BOS. A plain ``tok(text)``
    prepends ``<s>`` like Llama tokenizers do.
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

__all__ = [
    "CHAT_TEMPLATE",
    "SPECIAL_TOKENS",
    "make_tokenizer",
    "make_tiny_llama",
    "make_demo_model",
]

UNK, BOS, EOS, PAD = "<unk>", "<s>", "</s>", "<pad>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [UNK, BOS, EOS, PAD, IM_START, IM_END]  # ids 0..5, in this order

VOCAB_SIZE = 768

# ChatML-style turns, prefixed with the BOS token as Llama templates do.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_CORPUS = """\
The future of AI is not a single machine that knows everything. It is a large number of
small tools that people use every day: a model that reads a page and writes a summary, a
model that turns speech into text, a model that helps a programmer find the bug in a
function. Each of these tools is trained on data, and each of them runs on hardware that
has to be fast, cheap and reliable.

A language model reads text as a sequence of tokens. A token can be a whole word, a part
of a word, or a single byte. The model looks at the tokens it has seen so far and predicts
the next one. When it generates text, it repeats this step again and again: it picks a
token, appends it to the sequence, and runs the network once more. Greedy decoding always
picks the most likely token, so the same prompt always gives the same answer.

Training a model means showing it many examples and changing its weights a little after
each one, so that the next prediction is better than the last. The weights are stored in
tensors, and the work is done by matrix multiplications, additions and a few other simple
operations. A compiler can fuse these operations together and place them on the cores of
an accelerator, where they run much faster than they would on a general purpose processor.

Good software makes the hardware easy to use. A researcher should be able to write the
same Python code they already know, move the model to a new device with one line, and get
the same results as before, only faster. Tests compare the output of the new device with
the output of the CPU, token by token, and report any difference as an error to fix.

The weather was mild in the spring, and the river ran high after the rain. Children walked
to school along the water, and in the evening the town was quiet. Some people read books,
some cooked dinner for their families, and some sat outside and talked about the day. The
stars came out one by one over the hills, and the night was long and calm.

Questions are often more useful than answers. What is the model doing? Why did it choose
this word and not another one? How much memory does it need, and how long does it take to
produce one hundred tokens? When we can measure these things, we can improve them, and the
future of AI becomes something that we build together, step by step.
"""

_tokenizer_json: Optional[str] = None  # trained once per process


def _train_tokenizer_json() -> str:
    global _tokenizer_json
    if _tokenizer_json is None:
        tk = Tokenizer(models.BPE(unk_token=UNK))
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tk.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=VOCAB_SIZE,
            min_frequency=1,
            special_tokens=SPECIAL_TOKENS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tk.train_from_iterator(_CORPUS.split("\n\n"), trainer=trainer)
        # Prepend BOS on plain encodes, like Llama tokenizers.
        bos_id = tk.token_to_id(BOS)
        tk.post_processor = processors.Sequence(
            [
                processors.ByteLevel(trim_offsets=False),
                processors.TemplateProcessing(
                    single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
                ),
            ]
        )
        _tokenizer_json = tk.to_str()
    return _tokenizer_json


def make_tokenizer(save_dir=None, *, padding_side: str = "left") -> transformers.PreTrainedTokenizerFast:
    """Return a small deterministic byte-level BPE tokenizer (~768 tokens) with a chat template.

    Special tokens: bos ``<s>``, eos ``</s>``, pad ``<pad>``, unk ``<unk>``, plus the chat
    markers ``<|im_start|>`` / ``<|im_end|>``. ``padding_side`` defaults to "left", which is
    what batched generation with decoder-only models needs. If ``save_dir`` is given the
    tokenizer is saved there (``AutoTokenizer.from_pretrained(save_dir)`` then works offline).
    """
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_train_tokenizer_json()),
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        extra_special_tokens=[IM_START, IM_END],
        padding_side=padding_side,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHAT_TEMPLATE
    if save_dir is not None:
        tok.save_pretrained(os.fspath(save_dir))
    return tok


def make_tiny_llama(
    save_dir=None,
    *,
    vocab_size: Optional[int] = None,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    max_pos: int = 2048,
    seed: int = 0,
    model_type: str = "llama",
    dtype: torch.dtype = torch.float32,
    train_steps: int = 0,
) -> Tuple[transformers.PreTrainedModel, transformers.PreTrainedTokenizerFast]:
    """Build a randomly initialised causal LM (``model_type`` "llama" or "qwen3") and its tokenizer.

    The model is deterministic for a given ``seed``, in eval mode, on CPU. With ``train_steps`` it is
    then fitted to the built-in text for that many steps (in float32, before the cast to ``dtype``),
    which gives large margins between the top logits, so greedy tokens are stable across devices
    and dtypes. ``vocab_size``
    defaults to ``len(tokenizer)``; bos/eos/pad ids agree between tokenizer, config and
    generation_config. If ``save_dir`` is given, model and tokenizer are saved there with
    ``save_pretrained`` so the ``Auto*.from_pretrained(save_dir)`` classes load them offline.
    """
    tok = make_tokenizer()
    if vocab_size is None:
        vocab_size = len(tok)
    if vocab_size < len(tok):
        raise ValueError(f"vocab_size={vocab_size} is smaller than the tokenizer ({len(tok)} tokens)")
    if hidden_size % heads or heads % kv_heads:
        raise ValueError("hidden_size must be divisible by heads, and heads by kv_heads")

    kwargs = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden_size // heads,
        max_position_embeddings=max_pos,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    if model_type == "qwen3":
        kwargs.update(use_sliding_window=False, max_window_layers=layers)
    elif model_type != "llama":
        raise ValueError(f"unsupported model_type {model_type!r} (expected 'llama' or 'qwen3')")
    config = transformers.AutoConfig.for_model(model_type, **kwargs)

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32 if train_steps else dtype)
    if train_steps:
        _fit_to_corpus(model, tok, train_steps)
        model.to(dtype)
    model.eval()

    gen = model.generation_config
    gen.bos_token_id, gen.eos_token_id, gen.pad_token_id = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id
    gen.do_sample = False

    if save_dir is not None:
        save_dir = os.fspath(save_dir)
        model.save_pretrained(save_dir)
        tok.save_pretrained(save_dir)
    return model, tok


def _fit_to_corpus(model, tok, steps: int, lr: float = 3e-3) -> None:
    """Briefly train ``model`` on the built-in text, as chat turns, until it has (mostly) memorised it.

    Each paragraph becomes one exchange: the user says its first five words, the assistant
    continues with the rest. A fitted model produces readable, stable greedy output with large
    margins between the top logits, so small numerical differences between devices or dtypes
    do not flip the generated tokens.
    """
    chats = []
    for paragraph in _CORPUS.split("\n\n"):
        words = paragraph.split()
        chats.append([
            {"role": "user", "content": " ".join(words[:5])},
            {"role": "assistant", "content": " ".join(words[5:])},
        ])
    texts = [tok.apply_chat_template(chat, tokenize=False) for chat in chats]
    batch = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        model(**batch, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()


def make_demo_model(save_dir, *, train_steps: int = 80) -> Tuple[transformers.PreTrainedModel, transformers.PreTrainedTokenizerFast]:
    """Save a small Llama-style model and its tokenizer to ``save_dir``; return (model, tokenizer).

    3.3M parameters: hidden 256, 4 layers, 8 query / 4 key-value heads, MLP 688, vocab 768.
    Unless ``train_steps=0``, the model is first fitted to the built-in text for ``train_steps``
    steps (about 10 s on a CPU), so greedy generation from "The future of AI is" prints
    readable English instead of random tokens.
    """
    model, tok = make_tiny_llama(hidden_size=256, layers=4, heads=8, kv_heads=4, intermediate=688, seed=0)
    if train_steps:
        _fit_to_corpus(model, tok, train_steps)
    model.save_pretrained(os.fspath(save_dir))
    tok.save_pretrained(os.fspath(save_dir))
    return model, tok

"""Does every causal-LM architecture of the installed transformers generate the same tokens on neuron as on CPU?

    python -m torch_neuronx.tools.arch_sweep                      # all architectures, one at a time
    python -m torch_neuronx.tools.arch_sweep --only llama,qwen3   # a few
    python -m torch_neuronx.tools.arch_sweep --jobs 2 --report docs/arch_sweep.md --json sweep.json

For every ``model_type`` of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``: a tiny config (2 layers, small widths; the
architecture-specific fields are shrunk generically, with the exceptions in ``OVERRIDES``), random weights built
once on CPU with a fixed seed and copied to neuron, then greedy ``generate`` of 16 new tokens with the dynamic and
with the static cache on both devices. The generated tokens must be identical and the logits of every step must
agree to fp32 tolerance. A token may differ only where the CPU's two best logits are closer than the measured
neuron/CPU logit difference (a tie that rounding may break either way); that is reported in the note.

Each architecture runs in its own process (forked from a server that has imported torch and transformers but has
not started the neuron runtime), with a time limit, so a crash or a hang ends only that architecture.

Result classes: PASS, MISMATCH (tokens or logits differ), NEURON-ERROR (an exception, crash or timeout on neuron
only), SKIP (fails on CPU too, needs a package that is not installed, or is not a text-only model).
Coverage = PASS / (PASS + MISMATCH + NEURON-ERROR).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import multiprocessing as mp
import os
import platform
import sys
import time
import traceback
from typing import Any, Callable, Dict, List, Optional

NEW_TOKENS = 16
PROMPT_LEN = 12
PAD_LEFT = 3  # the second prompt of the batch is left-padded by this many tokens
SEED = 0
VOCAB = 512
DEFAULT_TIMEOUT = 300.0

# ---- tiny configs ---------------------------------------------------------------------------------------------
# Generic rules: every config (and sub-config) field named here is shrunk wherever it appears.
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers", "encoder_layers",
              "num_decoder_layers", "num_encoder_layers")
HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model", "emb_dim", "embedding_size", "embedding_dim", "word_embed_proj_dim",
               "input_embedding_size", "output_embedding_size", "lru_width", "attention_hidden_size",
               "hidden_size_global")
HEAD_KEYS = ("num_attention_heads", "n_head", "n_heads", "num_heads", "decoder_attention_heads",
             "encoder_attention_heads", "attention_heads", "num_encoder_attention_heads",
             "num_decoder_attention_heads", "swa_num_attention_heads", "index_n_heads")
KV_HEAD_KEYS = ("num_key_value_heads", "num_kv_heads", "swa_num_key_value_heads", "num_query_groups",
                "multi_query_group_num")
HEAD_DIM_KEYS = ("head_dim", "attention_head_dim", "kv_channels", "d_kv", "d_head", "dim_head", "attention_head_size",
                 "swa_head_dim", "linear_key_head_dim", "linear_value_head_dim", "linear_head_dim", "index_head_dim",
                 "mamba_d_head", "mamba_head_dim", "mamba_headdim")
FFN_KEYS = ("intermediate_size", "ffn_dim", "decoder_ffn_dim", "encoder_ffn_dim", "d_ff", "dff", "dim_ff",
            "ffn_hidden_size", "d_inner", "feed_forward_size", "intermediate_size_mlp", "dense_intermediate_size",
            "n_inner", "mlp_dim")
MOE_FFN_KEYS = ("moe_intermediate_size", "shared_expert_intermediate_size", "shared_experts_intermediate_size",
                "shared_intermediate_size", "moe_shared_expert_intermediate_size", "expert_ffn_hidden_size",
                "expert_intermediate_size")
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
TOPK_KEYS = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "moe_k")
POSITION_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "max_target_positions",
                 "context_length", "original_max_position_embeddings")
WINDOW_KEYS = ("sliding_window", "sliding_window_size", "attention_window_size", "window_size",
               "local_attention_window_len", "attention_chunk_size")

FIXED = {  # field: tiny value (applied when the field holds an int larger than it)
    **{k: 64 for k in HIDDEN_KEYS},
    **{k: 4 for k in HEAD_KEYS},
    **{k: 16 for k in HEAD_DIM_KEYS},
    **{k: 128 for k in FFN_KEYS},
    **{k: 32 for k in MOE_FFN_KEYS},
    **{k: 4 for k in EXPERT_KEYS},
    **{k: 2 for k in TOPK_KEYS},
    **{k: 256 for k in POSITION_KEYS},
    **{k: 16 for k in WINDOW_KEYS},
    "n_group": 1, "num_expert_group": 1, "topk_group": 1, "first_k_dense_replace": 1, "n_shared_experts": 1,
    # multi-head latent attention
    "q_lora_rank": 32, "kv_lora_rank": 16, "o_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
    "qk_head_dim": 24, "v_head_dim": 16, "index_topk": 8,
    # state-space and linear-attention layers: heads * head_dim = expand (2) * hidden (64)
    "state_size": 16, "ssm_state_size": 16, "mamba_d_state": 16, "mamba_n_heads": 8, "mamba_num_heads": 8,
    "n_mamba_heads": 8, "mamba_dt_rank": 8, "time_step_rank": 8, "mamba_d_ssm": 128,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_num_heads": 4,
    # per-layer inputs, low-rank side paths
    "num_kv_shared_layers": 0,  # cross-layer KV sharing needs more layers of each type than we keep
    "hidden_size_per_layer_input": 16, "laurel_rank": 16, "rotary_dim": 8, "adapter_rank": 16,
    "vocab_size_per_layer_input": VOCAB, "decoder_vocab_size": VOCAB, "pronunciation_vocab_size": 64,
    "shape_vocab_size": 64, "pronunciation_embed_dim": 16, "shape_embed_dim": 16, "router_hidden_size": 64,
}

# Fields some default configs leave unset although the model needs them (real checkpoints set them).
FILL_NONE = {"head_dim": 16, "moe_intermediate_size": 32, "n_shared_experts": 1, **{k: 4 for k in EXPERT_KEYS}, **{k: 2 for k in TOPK_KEYS}}

# The one table of architecture-specific exceptions, applied after the generic rules. Keys may name a
# sub-config field as "text_config.field".
OVERRIDES: Dict[str, Dict[str, Any]] = {
    # state-space heads: num_heads * head_dim = expand * hidden
    "mamba2": {"num_heads": 8, "head_dim": 16},
    # hybrids whose default config has no attention layer (or one beyond the first two layers)
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1},
    "bamba": {"attn_layer_indices": [1]},
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention"]},
    "recurrent_gemma": {"block_types": ["recurrent", "attention"]},
    # the shared attention block sees [hidden, embeddings]: twice the hidden size
    "zamba": {"attention_hidden_size": 128, "attention_head_dim": 32},
    "zamba2": {"attention_hidden_size": 128, "attention_head_dim": 32},
    "falcon_h1": {"mamba_d_head": 16},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"]},
    # axial position embeddings: the two parts sum to the hidden size
    "reformer": {"axial_pos_embds_dim": [32, 32]},
}

# Models whose generate() needs more than token ids; consulted only to explain a failure on CPU.
NOT_TEXT_ONLY = {
    "musicgen": "audio codebooks (not text-only)",
    "musicgen_melody": "audio codebooks (not text-only)",
    "moshi": "audio streams (not text-only)",
}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _shrink_value(key: str, v, heads: Optional[int]):
    if key in LAYER_KEYS:
        return v
    if key in KV_HEAD_KEYS and _is_int(v):
        if v <= 1:
            return v
        return 4 if heads is not None and v == heads else 2
    if key in FIXED:
        new = FIXED[key]
        if _is_int(v):
            return min(v, new)
        if isinstance(v, list) and v and all(_is_int(x) for x in v):
            return [min(x, new) for x in v]
    if key == "vocab_size" and _is_int(v):
        return min(v, VOCAB)
    return v


def _layer_indices(key, v, n: int):
    """The layer indices a field names (a list of indices, or a dict keyed by index), else None."""
    if not isinstance(key, str) or not any(s in key for s in ("layer", "idx", "index", "ids")):
        return None
    if isinstance(v, dict) and v:
        keys = [int(x) if isinstance(x, str) and x.isdigit() else x for x in v]
        return keys if all(_is_int(x) and 0 <= x < n for x in keys) else None
    if isinstance(v, list) and 0 < len(v) < n and all(_is_int(x) and 0 <= x < n for x in v):
        return list(v)
    return None


def _layer_selection(d: dict, n: int) -> List[int]:
    """Layer indices to keep: the first layer of every distinct combination of per-layer settings (at most 4),
    at least 2 layers."""
    per_layer = {k: v for k, v in d.items() if isinstance(v, list) and len(v) == n}
    index_lists = {k: set(_layer_indices(k, v, n)) for k, v in d.items() if _layer_indices(k, v, n) is not None}
    picked, seen = [], set()
    for i in range(n):
        sig = tuple(repr(v[i]) for v in per_layer.values()) + tuple(i in s for s in index_lists.values())
        if sig not in seen and len(picked) < 4:
            seen.add(sig)
            picked.append(i)
    for i in range(n):
        if len(picked) >= 2:
            break
        if i not in picked:
            picked.append(i)
    return sorted(picked)


def _shrink_config_dict(cfg) -> dict:
    from transformers import PretrainedConfig

    d = cfg.to_dict()
    for k, v in vars(cfg).items():
        if isinstance(v, PretrainedConfig):
            d[k] = _shrink_config_dict(v)
    heads = next((d[k] for k in HEAD_KEYS if _is_int(d.get(k))), None)
    layer_key = next((k for k in LAYER_KEYS if _is_int(d.get(k))), None)
    if layer_key is not None and d[layer_key] > 2:
        n = d[layer_key]
        keep = _layer_selection(d, n)
        for k, v in list(d.items()):
            if isinstance(v, list) and len(v) == n:
                d[k] = [v[i] for i in keep]
            elif _layer_indices(k, v, n) is not None:
                if isinstance(v, dict):
                    d[k] = {j: v[i] if i in v else v[str(i)] for j, i in enumerate(keep) if i in v or str(i) in v}
                else:
                    d[k] = [j for j, i in enumerate(keep) if i in set(v)]
        for k in LAYER_KEYS:
            if _is_int(d.get(k)):
                d[k] = len(keep) if d[k] == n else min(d[k], 2)
    orig = dict(d)
    for k, v in list(d.items()):
        if v is None and k in FILL_NONE:
            d[k] = FILL_NONE[k]
        elif v is None and k in KV_HEAD_KEYS and heads is not None:
            d[k] = FIXED.get(next((h for h in HEAD_KEYS if h in d), ""), 4)
        elif not isinstance(v, dict):
            d[k] = _shrink_value(k, v, heads)
    # Fields that must stay equal when they were equal (the rotary part of latent attention is "head_dim").
    for a, b in (("head_dim", "qk_rope_head_dim"),):
        if _is_int(orig.get(a)) and orig.get(a) == orig.get(b):
            d[a] = d[b]
    nope, rope = orig.get("qk_nope_head_dim"), orig.get("qk_rope_head_dim")
    for a in ("head_dim", "swa_head_dim"):
        if _is_int(orig.get(a)) and _is_int(nope) and _is_int(rope) and orig[a] == nope + rope:
            d[a] = d["qk_nope_head_dim"] + d["qk_rope_head_dim"]
    return d


def _token_keys(d: dict, path=()):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _token_keys(v, path + (k,))
        elif isinstance(k, str) and k.endswith(("token_id", "token_index", "token_ids", "_token")) and (
                _is_int(v) or (isinstance(v, list) and v and all(_is_int(x) for x in v))):
            yield path + (k,), v


def _set_path(d: dict, path, value):
    for p in path[:-1]:
        d = d[p]
    d[path[-1]] = value


def _remap_token_ids(d: dict, vocab: int) -> None:
    """Token ids beyond the tiny vocabulary move to distinct ids at its top end."""
    found = list(_token_keys(d))
    big = sorted({x for _, v in found for x in (v if isinstance(v, list) else [v]) if x >= vocab})
    new = {x: vocab - 1 - i for i, x in enumerate(big)}
    for path, v in found:
        _set_path(d, path, [new.get(x, x) for x in v] if isinstance(v, list) else new.get(v, v))


def special_token_ids(cfg) -> set:
    return {x for _, v in _token_keys(cfg.to_dict()) for x in (v if isinstance(v, list) else [v]) if x is not None}


def tiny_config(model_type: str):
    """The tiny config of ``model_type``: defaults of ``AutoConfig.for_model``, shrunk (see the rules above)."""
    from transformers import AutoConfig

    cfg0 = AutoConfig.for_model(model_type)
    d = _shrink_config_dict(cfg0)
    for key, value in OVERRIDES.get(model_type, {}).items():
        _set_path(d, tuple(key.split(".")), value)
    vocab = cfg0.get_text_config().vocab_size
    _remap_token_ids(d, min(vocab, VOCAB) if _is_int(vocab) else VOCAB)
    d["is_decoder"] = True  # encoder models (BERT-style) generate only as decoders
    d.pop("transformers_version", None)
    return type(cfg0).from_dict(d)


# ---- one architecture -----------------------------------------------------------------------------------------


def neuron_compile_available() -> bool:
    """Whether a dynamo backend named "neuron" is registered (transformers compiles static-cache generation on
    neuron with it)."""
    import torch

    try:
        return "neuron" in torch._dynamo.list_backends(exclude_tags=())
    except Exception:
        return False


def _first_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"[:300]


def _skip_reason(model_type: str, e: BaseException, where: str) -> str:
    text = str(e)
    if isinstance(e, ImportError) or "requires the" in text and "library" in text or "pip install" in text:
        return f"needs a package that is not installed ({_first_line(e)})"
    if model_type in NOT_TEXT_ONLY:
        return f"{NOT_TEXT_ONLY[model_type]}; fails on CPU too ({_first_line(e)})"
    return f"fails on CPU too, {where} ({_first_line(e)})"


def _inputs(cfg, generator):
    import torch

    text = cfg.get_text_config()
    vocab = text.vocab_size if _is_int(getattr(text, "vocab_size", None)) else VOCAB
    hi = max(8, min(vocab, VOCAB) - 32)
    specials = special_token_ids(cfg)
    allowed = torch.tensor([i for i in range(4, hi) if i not in specials])
    ids = allowed[torch.randint(0, len(allowed), (2, PROMPT_LEN), generator=generator)]
    pad = next((x for x in (text.pad_token_id if hasattr(text, "pad_token_id") else None,
                            getattr(cfg, "pad_token_id", None)) if _is_int(x)), 0)
    mask = torch.ones_like(ids)
    ids[1, :PAD_LEFT] = pad
    mask[1, :PAD_LEFT] = 0
    return ids, mask, pad


def _generate(model, ids, mask, pad, cache: str, compile_ok: bool):
    import torch

    kwargs = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, num_beams=1,
                  return_dict_in_generate=True, output_logits=True, pad_token_id=pad)
    if cache == "static":
        kwargs["cache_implementation"] = "static"
        if not compile_ok:
            kwargs["disable_compile"] = True
    dev = next(model.parameters()).device
    with torch.no_grad():
        out = model.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev), **kwargs)
    logits = torch.stack([x.float().cpu() for x in out.logits]) if out.logits else None
    return out.sequences.cpu(), logits


def compare(cpu, neuron, prompt_len: int, rtol: float = 1e-4, atol: float = 1e-4) -> Dict[str, Any]:
    """Tokens equal, and the logits of every step up to the first differing token close; a differing token is
    accepted only when the CPU's top-2 logits at that step are within the measured logit difference."""
    import torch

    seq_c, log_c = cpu
    seq_n, log_n = neuron
    res: Dict[str, Any] = {"ok": True, "note": ""}
    if seq_c.shape != seq_n.shape:
        return {"ok": False, "note": f"sequence shapes differ: cpu {tuple(seq_c.shape)}, neuron {tuple(seq_n.shape)}"}
    gen_c, gen_n = seq_c[:, prompt_len:], seq_n[:, prompt_len:]
    diff_steps = (gen_c != gen_n).any(0).nonzero()
    first = int(diff_steps[0]) if len(diff_steps) else gen_c.shape[1]
    if log_c is None or log_n is None:
        res["ok"] = first == gen_c.shape[1]
        res["note"] = "" if res["ok"] else f"tokens differ from step {first} (no logits)"
        return res
    upto = min(first + 1, log_c.shape[0])
    a, b = log_c[:upto], log_n[:upto]
    finite = torch.isfinite(a) & torch.isfinite(b)
    if not torch.equal(torch.isfinite(a), torch.isfinite(b)):
        return {"ok": False, "note": "non-finite logits differ between cpu and neuron"}
    scale = max(1.0, float(a[finite].abs().max()) if finite.any() else 1.0)
    err = float((a - b)[finite].abs().max()) if finite.any() else 0.0
    res["max_logit_err"] = err
    res["logit_scale"] = scale
    if err > atol * scale + rtol * scale:
        return {**res, "ok": False, "note": f"logits differ: max |cpu - neuron| = {err:.3g} (logit scale {scale:.3g})"}
    if first < gen_c.shape[1]:
        rows = (gen_c[:, first] != gen_n[:, first]).nonzero().flatten().tolist()
        for r in rows:
            top2 = log_c[first, r].topk(2).values
            margin = float(top2[0] - top2[1])
            if margin > 2 * err + 1e-7 * scale:
                return {**res, "ok": False, "note": f"token differs at step {first} (row {r}) with cpu top-2 margin "
                                                    f"{margin:.3g} > logit error {err:.3g}"}
        res["note"] = f"tie at step {first}: cpu top-2 margin within logit error {err:.2g}"
    return res


def run_arch(model_type: str, report: Callable[[str], None] = lambda phase: None, device: str = "neuron",
             caches=("dynamic", "static"), static_compile: Optional[bool] = None) -> Dict[str, Any]:
    """Runs one architecture in this process; returns {"status", "reason", "modes", ...}."""
    import warnings

    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    import torch_neuronx  # noqa: F401

    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    result: Dict[str, Any] = {"model_type": model_type, "class": MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type),
                              "modes": {}}
    if static_compile is None:  # the sweep's --static flag reaches its child processes through the environment
        static_compile = os.environ.get("TORCH_NEURONX_SWEEP_STATIC", "compile") != "eager"
    compile_ok = static_compile and neuron_compile_available()
    result["static_mode"] = "torch.compile (backend neuron)" if compile_ok else "eager (disable_compile=True)"

    report("config")
    try:
        cfg = tiny_config(model_type)
        torch.manual_seed(SEED)
        cpu_model = AutoModelForCausalLM.from_config(cfg).eval()
    except Exception as e:  # noqa: BLE001
        return {**result, "status": "SKIP", "reason": _skip_reason(model_type, e, "building the model"),
                "traceback": traceback.format_exc()}
    result["params"] = sum(p.numel() for p in cpu_model.parameters())
    gen = torch.Generator().manual_seed(SEED)
    ids, mask, pad = _inputs(cfg, gen)

    cpu_out = {}
    for cache in caches:
        report(f"cpu {cache}")
        for batch in ("padded", "single"):
            try:
                if batch == "single":
                    ids_b, mask_b = ids[:1], mask[:1]
                else:
                    ids_b, mask_b = ids, mask
                cpu_out[cache] = (batch, ids_b, mask_b, _generate(cpu_model, ids_b, mask_b, pad, cache, compile_ok))
                break
            except Exception as e:  # noqa: BLE001
                result["modes"][cache] = {"status": "SKIP", "reason": _skip_reason(model_type, e, f"{cache} cache"),
                                          "traceback": traceback.format_exc()}
        if cache in cpu_out:
            result["modes"][cache] = {"batch": cpu_out[cache][0]}
    if not cpu_out:
        first = next(iter(result["modes"].values()))
        return {**result, "status": "SKIP", "reason": first["reason"]}

    report("to neuron")
    try:
        neuron_model = copy.deepcopy(cpu_model).to(device)
    except Exception as e:  # noqa: BLE001
        return {**result, "status": "NEURON-ERROR", "reason": f"model.to({device!r}): {_first_line(e)}",
                "traceback": traceback.format_exc()}
    for cache, (batch, ids_b, mask_b, ref) in cpu_out.items():
        report(f"neuron {cache}")
        mode = result["modes"][cache]
        try:
            out = _generate(neuron_model, ids_b, mask_b, pad, cache, compile_ok)
        except Exception as e:  # noqa: BLE001
            mode.update(status="NEURON-ERROR", reason=_first_line(e), traceback=traceback.format_exc())
            continue
        cmp = compare(ref, out, ids_b.shape[1])
        mode.update(status="PASS" if cmp["ok"] else "MISMATCH", reason=cmp["note"],
                    max_logit_err=cmp.get("max_logit_err"))
    statuses = [m["status"] for m in result["modes"].values() if m.get("status") != "SKIP"]
    for status in ("NEURON-ERROR", "MISMATCH", "PASS"):
        if status in statuses:
            notes = [f"{c}: {m['reason']}" for c, m in result["modes"].items()
                     if m.get("reason") and m.get("status") in (status, "SKIP")]
            return {**result, "status": status, "reason": "; ".join(notes)}
    raise AssertionError("unreachable")


# ---- isolation: one process per architecture ------------------------------------------------------------------


def _child(model_type: str, conn) -> None:
    # Results travel through the pipe; some models print to stdout on every step.
    sys.stdout = open(os.devnull, "w")
    try:
        res = run_arch(model_type, report=lambda phase: conn.send(("phase", phase)))
    except BaseException as e:  # noqa: BLE001
        res = {"model_type": model_type, "status": "NEURON-ERROR", "reason": f"sweep error: {_first_line(e)}",
               "traceback": traceback.format_exc()}
    for m in res.get("modes", {}).values():
        if m.get("status") == "PASS":
            m.pop("traceback", None)
    conn.send(("result", res))
    conn.close()


def _classify_death(model_type: str, phase: str, why: str) -> Dict[str, Any]:
    on_cpu = phase in ("start", "config") or phase.startswith("cpu")
    return {"model_type": model_type, "status": "SKIP" if on_cpu else "NEURON-ERROR",
            "reason": f"{'fails on CPU too: ' if on_cpu else ''}{why} during '{phase}'"}


class _Job:
    def __init__(self, ctx, fn, model_type: str):
        self.model_type = model_type
        self.recv, send = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=fn, args=(model_type, send), daemon=True)
        self.proc.start()
        send.close()
        self.start = time.monotonic()
        self.phase = "start"
        self.result: Optional[Dict[str, Any]] = None

    def poll(self, timeout: float) -> bool:
        """True when finished (result set)."""
        try:
            while self.recv.poll():
                kind, payload = self.recv.recv()
                if kind == "phase":
                    self.phase = payload
                else:
                    self.result = payload
        except (EOFError, OSError):
            pass
        if self.result is not None:
            self.proc.join(10)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join()
            return True
        if not self.proc.is_alive():
            self.proc.join()
            code = self.proc.exitcode
            why = f"process died (signal {-code})" if code is not None and code < 0 else f"process exited ({code})"
            self.result = _classify_death(self.model_type, self.phase, why)
            return True
        if time.monotonic() - self.start > timeout:
            self.proc.kill()
            self.proc.join()
            self.result = _classify_death(self.model_type, self.phase, f"timeout after {timeout:.0f} s")
            return True
        return False


def sweep(model_types: List[str], jobs: int = 1, timeout: float = DEFAULT_TIMEOUT,
          on_result: Callable[[Dict[str, Any]], None] = lambda r: None) -> List[Dict[str, Any]]:
    # The fork server imports torch and transformers once, without the neuron runtime (a forked child of an
    # initialised runtime may not allocate device memory); every child starts its own runtime.
    saved = os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD")
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "transformers", "transformers.modeling_utils",
                                "transformers.generation.utils", "transformers.models.auto.modeling_auto"])
    from torch_neuronx.tools import arch_sweep as this  # the importable name, not __main__

    results, pending, running = [], list(model_types), []
    try:
        while pending or running:
            while pending and len(running) < jobs:
                running.append(_Job(ctx, this._child, pending.pop(0)))
            for job in list(running):
                if job.poll(timeout):
                    running.remove(job)
                    job.result["seconds"] = round(time.monotonic() - job.start, 1)
                    results.append(job.result)
                    on_result(job.result)
            time.sleep(0.05)
    finally:
        for job in running:
            job.proc.kill()
        if saved is None:
            os.environ.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
        else:
            os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = saved
    order = {m: i for i, m in enumerate(model_types)}
    return sorted(results, key=lambda r: order[r["model_type"]])


# ---- reporting ------------------------------------------------------------------------------------------------


def coverage(results) -> tuple:
    counts = {s: sum(r["status"] == s for r in results) for s in ("PASS", "MISMATCH", "NEURON-ERROR", "SKIP")}
    denom = counts["PASS"] + counts["MISMATCH"] + counts["NEURON-ERROR"]
    return counts, (counts["PASS"] / denom if denom else 0.0)


def versions() -> Dict[str, str]:
    import torch
    import transformers

    import torch_neuronx

    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "torch_neuronx": torch_neuronx.__version__, "python": platform.python_version()}


def _cell(text: str) -> str:
    return (text or "").replace("|", "\\|").replace("\n", " ")[:240]


def markdown(results, static_mode: str) -> str:
    counts, cov = coverage(results)
    v = versions()
    lines = [
        "# Causal-LM architecture sweep",
        "",
        f"Generated by `python -m torch_neuronx.tools.arch_sweep` on {datetime.date.today().isoformat()}: torch "
        f"{v['torch']}, transformers {v['transformers']}, torch_neuronx {v['torch_neuronx']}, Python {v['python']}.",
        "",
        f"Every `model_type` of `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES` ({len(results)}): a tiny random model (2-4 "
        f"layers, hidden 64), greedy generation of {NEW_TOKENS} new tokens for a batch of 2 prompts (one left-padded) "
        "with the dynamic and the static cache, on CPU and on neuron from the same weights. PASS: identical tokens "
        "and per-step logits within fp32 tolerance. Static-cache generation on neuron ran "
        f"{static_mode}.",
        "",
        f"**Coverage: {cov:.1%}** = PASS {counts['PASS']} / (PASS {counts['PASS']} + MISMATCH {counts['MISMATCH']} "
        f"+ NEURON-ERROR {counts['NEURON-ERROR']}); SKIP {counts['SKIP']}.",
        "",
    ]
    bad = [r for r in results if r["status"] in ("MISMATCH", "NEURON-ERROR")]
    if bad:
        lines += ["Not passing:", ""]
        lines += [f"- `{r['model_type']}` {r['status']}: {_cell(r.get('reason', ''))}" for r in bad]
        lines.append("")
    lines += ["| model_type | class | result | dynamic cache | static cache | note |", "|---|---|---|---|---|---|"]
    for r in results:
        modes = r.get("modes", {})

        def mode_cell(c):
            m = modes.get(c)
            if not m:
                return ""
            s = m.get("status", "")
            if m.get("batch") == "single":
                s += " (batch 1)"
            return s

        lines.append(f"| {r['model_type']} | {r.get('class') or ''} | {r['status']} | {mode_cell('dynamic')} | "
                     f"{mode_cell('static')} | {_cell(r.get('reason', ''))} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated model types (default: all)")
    parser.add_argument("--jobs", type=int, default=1, help="architectures run in parallel (default 1)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per architecture")
    parser.add_argument("--report", help="write the markdown report here (e.g. docs/arch_sweep.md)")
    parser.add_argument("--json", help="write all results, with tracebacks, here")
    parser.add_argument("--rerun", metavar="JSON", help="start from the results of an earlier --json run and run "
                        "again only its architectures that did not pass (or those of --only)")
    parser.add_argument("--static", choices=["compile", "eager"], default="compile",
                        help="static-cache generation on neuron: compiled as Transformers does by default "
                        "(backend neuron), or eager (disable_compile=True; much faster)")
    args = parser.parse_args(argv)
    os.environ["TORCH_NEURONX_SWEEP_STATIC"] = args.static

    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    all_types = list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    if args.only:
        types = [t.strip() for t in args.only.split(",") if t.strip()]
        unknown = [t for t in types if t not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES]
        if unknown:
            parser.error(f"not causal-LM model types: {', '.join(unknown)}")
    else:
        types = all_types
    previous = {}
    if args.rerun:
        with open(args.rerun) as f:
            previous = {r["model_type"]: r for r in json.load(f)["results"]}
        if not args.only:
            types = [t for t in all_types if previous.get(t, {}).get("status") != "PASS"]
    static_mode = "with torch.compile (backend neuron)" if args.static == "compile" and neuron_compile_available() else \
        "eagerly (--static eager: disable_compile=True)" if args.static == "eager" else \
        "eagerly (disable_compile=True: no \"neuron\" dynamo backend is registered)"
    print(f"{len(types)} architectures, {args.jobs} job(s), static cache {static_mode}", flush=True)

    done = []

    def show(r):
        print(f"{r['model_type']:28s} {r['status']:13s} {r.get('seconds', 0):6.1f}s  {r.get('reason', '')[:150]}",
              flush=True)
        done.append(r)
        if args.json:  # written as results arrive, so an interrupted sweep can be continued with --rerun
            merged = dict(previous)
            merged.update({x["model_type"]: x for x in done})
            with open(args.json, "w") as f:
                json.dump({"versions": versions(), "static_mode": static_mode,
                           "results": [merged[t] for t in all_types if t in merged]}, f, indent=1)

    results = sweep(types, jobs=args.jobs, timeout=args.timeout, on_result=show)
    if previous:
        fresh = {r["model_type"]: r for r in results}
        results = [fresh.get(t) or previous[t] for t in all_types if t in fresh or t in previous]
    counts, cov = coverage(results)
    print(f"\nCoverage {cov:.1%}: PASS {counts['PASS']}, MISMATCH {counts['MISMATCH']}, "
          f"NEURON-ERROR {counts['NEURON-ERROR']}, SKIP {counts['SKIP']}")
    for r in results:
        if r["status"] in ("MISMATCH", "NEURON-ERROR"):
            print(f"  {r['model_type']}: {r['status']}: {r.get('reason', '')[:200]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"versions": versions(), "static_mode": static_mode, "results": results}, f, indent=1)
    if args.report:
        with open(args.report, "w") as f:
            f.write(markdown(results, static_mode))
    return 0


if __name__ == "__main__":
    sys.exit(main())

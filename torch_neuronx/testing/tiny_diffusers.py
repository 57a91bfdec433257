"""Tiny, fully local Diffusers pipelines for tests, examples and benchmarks.

Every component is built from a small config with a fixed seed (no hub access): transformer or UNet, VAE,
scheduler, and for Qwen-Image 2.1 a tiny Qwen3-VL text encoder with a byte-level BPE tokenizer trained in
process, so `pipe.encode_prompt(prompt=...)` works as in the launch post. The other pipelines carry no text
encoders; callers pass `prompt_embeds` (see `prompt_inputs`). Only torch, transformers, tokenizers and diffusers
are imported (never torch_neuronx), so CPU references can be built in the same process as neuron runs.

`make(kind, save_dir)` saves the pipeline with `save_pretrained`; load it with `load(kind, save_dir)`.
"""

from __future__ import annotations

import os

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from .tiny_models import _CORPUS

KINDS = ("qwenimage21", "qwenimage", "flux", "flux2", "sd", "sdxl", "wan")

# Default image size and steps per pipeline: the smallest the pipeline's latent grid accepts.
SIZES = {"qwenimage21": 64, "qwenimage": 32, "flux": 32, "flux2": 32, "sd": 32, "sdxl": 32, "wan": 16}

_QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                  "<|image_pad|>", "<|video_pad|>"]
# Qwen's chat template, reduced to text and image parts.
_QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for c in message['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}"
    "{% elif c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% endif %}{% endfor %}"
    "{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_qwen_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """A ~512-token byte-level BPE with Qwen's special tokens and no BOS (as Qwen's tokenizer)."""
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=512, min_frequency=1, special_tokens=_QWEN_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator(_CORPUS.split("\n\n"), trainer=trainer)
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        extra_special_tokens=_QWEN_SPECIALS[1:], model_max_length=1024, clean_up_tokenization_spaces=False)
    tok.chat_template = _QWEN_CHAT_TEMPLATE
    return tok


def _qwen3vl_processor_and_encoder(hidden: int):
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    tok = make_qwen_tokenizer()
    # QwenImage21Pipeline reads apply_chat_template, tokenizer and __call__(text=...) of its processor.
    # Qwen3VLProcessor cannot be built without torchvision (its video processor), which has no CPU wheel for
    # this torch on PyPI, so the tiny pipeline carries a processor of transformers that needs only PIL for
    # images (the tiny pipeline encodes text only).
    processor = transformers.LlavaProcessor(image_processor=transformers.CLIPImageProcessor(), tokenizer=tok,
                                            chat_template=_QWEN_CHAT_TEMPLATE, image_token="<|image_pad|>",
                                            patch_size=14)
    ids = {t: tok.convert_tokens_to_ids(t) for t in _QWEN_SPECIALS}
    config = Qwen3VLConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                         max_position_embeddings=1024, pad_token_id=ids["<|endoftext|>"],
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                          "mrope_section": [2, 3, 3], "mrope_interleaved": True}),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=hidden,
                           num_position_embeddings=64, deepstack_visual_indexes=[0]),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
    )
    torch.manual_seed(0)
    encoder = Qwen3VLForConditionalGeneration(config).eval()
    return processor, encoder


def _build(kind: str, layers: int):
    import diffusers as d

    if kind == "qwenimage21":
        hidden = 32
        torch.manual_seed(0)
        transformer = d.QwenImage21Transformer2DModel(
            patch_size=1, in_channels=8, out_channels=8, num_layers=layers, attention_head_dim=16,
            num_attention_heads=4, context_in_dim=hidden, mlp_ratio=3, axes_dims_rope=(4, 6, 6))
        torch.manual_seed(0)
        vae = d.AutoencoderKLQwenImage21(
            base_dim=8, decoder_base_dim=8, z_dim=8, dim_mult=[1, 1, 1, 1, 1], num_res_blocks=1,
            temperal_downsample=[False, True, True, True], latents_mean=[0.0] * 8, latents_std=[1.0] * 8,
            in_channels=3, out_channels=3)
        processor, encoder = _qwen3vl_processor_and_encoder(hidden)
        return d.QwenImage21Pipeline(scheduler=d.FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=encoder,
                                     processor=processor, transformer=transformer)
    if kind == "qwenimage":
        torch.manual_seed(0)
        transformer = d.QwenImageTransformer2DModel(
            patch_size=2, in_channels=16, out_channels=4, num_layers=layers, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=32, guidance_embeds=False, axes_dims_rope=(4, 6, 6))
        torch.manual_seed(0)
        vae = d.AutoencoderKLQwenImage(base_dim=24, z_dim=4, dim_mult=[1, 2, 4], num_res_blocks=1,
                                       temperal_downsample=[False, True], latents_mean=[0.0] * 4,
                                       latents_std=[1.0] * 4)
        return d.QwenImagePipeline(scheduler=d.FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=None,
                                   tokenizer=None, transformer=transformer)
    if kind == "flux":
        torch.manual_seed(0)
        transformer = d.FluxTransformer2DModel(
            patch_size=1, in_channels=16, num_layers=layers, num_single_layers=layers, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=[4, 4, 8])
        torch.manual_seed(0)
        vae = d.AutoencoderKL(sample_size=32, in_channels=3, out_channels=3, block_out_channels=(8, 8),
                              down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                              layers_per_block=1, latent_channels=4, norm_num_groups=4, use_quant_conv=False,
                              use_post_quant_conv=False, shift_factor=0.0609, scaling_factor=1.5035)
        return d.FluxPipeline(scheduler=d.FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=None,
                              tokenizer=None, text_encoder_2=None, tokenizer_2=None, transformer=transformer)
    if kind == "flux2":
        torch.manual_seed(0)
        transformer = d.Flux2Transformer2DModel(
            patch_size=1, in_channels=16, num_layers=layers, num_single_layers=layers, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=32, timestep_guidance_channels=256,
            axes_dims_rope=[4, 4, 4, 4])
        torch.manual_seed(0)
        vae = d.AutoencoderKLFlux2(sample_size=32, in_channels=3, out_channels=3,
                                   down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                                   block_out_channels=(8, 8), layers_per_block=1, latent_channels=4,
                                   norm_num_groups=4, use_quant_conv=False, use_post_quant_conv=False)
        return d.Flux2Pipeline(scheduler=d.FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=None,
                               tokenizer=None, transformer=transformer)
    if kind in ("sd", "sdxl"):
        xl = kind == "sdxl"
        torch.manual_seed(0)
        unet_kw = dict(block_out_channels=(16, 32), layers_per_block=1, sample_size=16, in_channels=4, out_channels=4,
                       down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                       up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32,
                       attention_head_dim=(2, 4) if xl else 8, norm_num_groups=8)
        if xl:
            unet_kw.update(use_linear_projection=True, addition_embed_type="text_time", addition_time_embed_dim=8,
                           transformer_layers_per_block=(1, layers), projection_class_embeddings_input_dim=6 * 8 + 32)
        unet = d.UNet2DConditionModel(**unet_kw)
        torch.manual_seed(0)
        vae = d.AutoencoderKL(block_out_channels=[8, 16], in_channels=3, out_channels=3,
                              down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2,
                              latent_channels=4, norm_num_groups=4, sample_size=32)
        if xl:
            scheduler = d.EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, steps_offset=1,
                                                 beta_schedule="scaled_linear", timestep_spacing="leading")
            return d.StableDiffusionXLPipeline(vae=vae, text_encoder=None, text_encoder_2=None, tokenizer=None,
                                               tokenizer_2=None, unet=unet, scheduler=scheduler)
        scheduler = d.DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                    clip_sample=False, set_alpha_to_one=False)
        return d.StableDiffusionPipeline(vae=vae, text_encoder=None, tokenizer=None, unet=unet, scheduler=scheduler,
                                         safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    if kind == "wan":
        torch.manual_seed(0)
        vae = d.AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                                 temperal_downsample=[False, True, True])
        torch.manual_seed(0)
        transformer = d.WanTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16, out_channels=16,
            text_dim=32, freq_dim=256, ffn_dim=32, num_layers=layers, cross_attn_norm=True,
            qk_norm="rms_norm_across_heads", rope_max_seq_len=32)
        return d.WanPipeline(tokenizer=None, text_encoder=None, vae=vae, transformer=transformer,
                             scheduler=d.FlowMatchEulerDiscreteScheduler(shift=7.0))
    raise ValueError(f"unknown pipeline kind {kind!r}; expected one of {KINDS}")


def make(kind: str, save_dir=None, *, layers: int = 2):
    """Build the tiny `kind` pipeline on CPU in float32 (deterministic), save it to `save_dir` if given."""
    pipe = _build(kind, layers)
    pipe.set_progress_bar_config(disable=True)
    if save_dir is not None:
        pipe.save_pretrained(os.fspath(save_dir))
    return pipe


def load(kind: str, path, dtype=torch.float32, **kwargs):
    """`<Pipeline>.from_pretrained(path)` for a pipeline saved by `make` (components saved as None stay None)."""
    import diffusers as d

    cls = {"qwenimage21": d.QwenImage21Pipeline, "qwenimage": d.QwenImagePipeline, "flux": d.FluxPipeline,
           "flux2": d.Flux2Pipeline, "sd": d.StableDiffusionPipeline, "sdxl": d.StableDiffusionXLPipeline,
           "wan": d.WanPipeline}[kind]
    expected, _ = cls._get_signature_keys(cls)
    for name in expected:  # components the tiny pipeline does not have (text encoders): None, as saved
        if not os.path.isdir(os.path.join(os.fspath(path), name)):
            kwargs.setdefault(name, None)
    pipe = cls.from_pretrained(os.fspath(path), dtype=dtype, **kwargs)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def prompt_inputs(kind: str, pipe=None, dtype=torch.float32, seed: int = 1) -> dict:
    """Text conditioning for `pipe(...)` on CPU: `encode_prompt` for Qwen-Image 2.1 (it has a text encoder),
    fixed random embeddings of the right shapes for the others. Move them with `to_device`."""
    if kind == "qwenimage21":
        emb, mask, _ = pipe.encode_prompt(prompt="A capybara wearing a wizard hat, oil painting", device="cpu")
        return {"prompt_embeds": emb.to(dtype), "prompt_embeds_mask": mask}
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    if kind == "qwenimage":
        return {"prompt_embeds": r(1, 7, 32), "prompt_embeds_mask": torch.ones(1, 7, dtype=torch.long)}
    if kind == "flux":
        return {"prompt_embeds": r(1, 8, 32), "pooled_prompt_embeds": r(1, 32)}
    if kind == "flux2":
        return {"prompt_embeds": r(1, 8, 32)}
    if kind in ("sd", "wan"):
        return {"prompt_embeds": r(1, 7, 32), "negative_prompt_embeds": r(1, 7, 32)}
    if kind == "sdxl":
        return {"prompt_embeds": r(1, 7, 32), "negative_prompt_embeds": r(1, 7, 32),
                "pooled_prompt_embeds": r(1, 32), "negative_pooled_prompt_embeds": r(1, 32)}
    raise ValueError(kind)


def to_device(inputs: dict, device) -> dict:
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}


def call_kwargs(kind: str, steps: int = 2, size: int = None, seed: int = 0) -> dict:
    """Arguments of `pipe(...)` besides the text conditioning: size, steps, a CPU generator, numpy output."""
    size = size or SIZES[kind]
    kw = dict(height=size, width=size, num_inference_steps=steps, generator=torch.Generator("cpu").manual_seed(seed),
              output_type="np")
    if kind in ("sd", "sdxl"):
        kw["guidance_scale"] = 5.0
    if kind in ("flux", "flux2"):
        kw["guidance_scale"] = 3.5
    if kind == "wan":
        kw.update(guidance_scale=5.0, num_frames=5)
    return kw


def images(output):
    """The pipeline output's images (or a video pipeline's frames) as one float32 numpy array."""
    import numpy as np

    out = output.frames if hasattr(output, "frames") else output.images
    return np.asarray(out, dtype=np.float32)

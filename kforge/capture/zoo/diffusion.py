"""Stable Diffusion 3.5 Medium: its MMDiT transformer and VAE decoder, built with diffusers.

One profiled forward is one denoising step with classifier-free guidance (the transformer runs on
the doubled batch) followed by the VAE decode of the stepped latents. The text encoders are not
part of the model: the prompt arrives as random embeddings of the encoders' published widths.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from kforge.capture.builders import Built, Resolved, building_on
from kforge.capture.zoo import ZooModel

# stabilityai/stable-diffusion-3.5-medium transformer/config.json: MMDiT-X with dual attention in
# the first 13 blocks and RMS-normalised queries and keys.
SD35_MEDIUM_TRANSFORMER: dict[str, Any] = {
    "sample_size": 128, "patch_size": 2, "in_channels": 16, "num_layers": 24,
    "attention_head_dim": 64, "num_attention_heads": 24, "joint_attention_dim": 4096,
    "caption_projection_dim": 1536, "pooled_projection_dim": 2048, "out_channels": 16,
    "pos_embed_max_size": 384, "dual_attention_layers": tuple(range(13)), "qk_norm": "rms_norm",
}
# stabilityai/stable-diffusion-3.5-medium vae/config.json (16 latent channels, 8x upsampling).
SD35_MEDIUM_VAE: dict[str, Any] = {
    "in_channels": 3, "out_channels": 3, "down_block_types": ("DownEncoderBlock2D",) * 4,
    "up_block_types": ("UpDecoderBlock2D",) * 4, "block_out_channels": (128, 256, 512, 512),
    "layers_per_block": 2, "latent_channels": 16, "norm_num_groups": 32, "act_fn": "silu",
    "scaling_factor": 1.5305, "shift_factor": 0.0609, "sample_size": 1024, "force_upcast": True,
    "use_quant_conv": False, "use_post_quant_conv": False,
}
SD35_TINY_TRANSFORMER: dict[str, Any] = {
    **SD35_MEDIUM_TRANSFORMER,
    "sample_size": 16, "num_layers": 2, "attention_head_dim": 16, "num_attention_heads": 2,
    "joint_attention_dim": 64, "caption_projection_dim": 32, "pooled_projection_dim": 32,
    "pos_embed_max_size": 16, "dual_attention_layers": (0,),
}
SD35_TINY_VAE: dict[str, Any] = {
    **SD35_MEDIUM_VAE,
    "down_block_types": ("DownEncoderBlock2D",) * 2, "up_block_types": ("UpDecoderBlock2D",) * 2,
    "block_out_channels": (32, 64), "layers_per_block": 1, "norm_num_groups": 8,
    "sample_size": 32,
}
GUIDANCE_SCALE = 4.5  # the model card's recommendation for 3.5 Medium
EULER_DT = -0.025  # one flow-matching Euler step of the scheduler, sigma 1 -> 0.975


class SD35Step(torch.nn.Module):
    """One guided denoising step of the MMDiT, then the VAE decode of the result."""

    def __init__(self, transformer: torch.nn.Module, vae: torch.nn.Module) -> None:
        super().__init__()
        self.transformer = transformer
        self.vae = vae

    def forward(self, latents: torch.Tensor, timestep: torch.Tensor, prompt: torch.Tensor,
                pooled: torch.Tensor) -> torch.Tensor:
        noise = self.transformer(hidden_states=torch.cat([latents, latents]),
                                 timestep=torch.cat([timestep, timestep]),
                                 encoder_hidden_states=prompt, pooled_projections=pooled,
                                 return_dict=False)[0]
        unconditional, conditional = noise.chunk(2)
        guided = unconditional + GUIDANCE_SCALE * (conditional - unconditional)
        latents = latents + EULER_DT * guided
        latents = latents / self.vae.config.scaling_factor + self.vae.config.shift_factor
        return self.vae.decode(latents, return_dict=False)[0]


def transformer_fields(tiny: bool, layers: int | None) -> dict[str, Any]:
    fields = copy.deepcopy(SD35_TINY_TRANSFORMER if tiny else SD35_MEDIUM_TRANSFORMER)
    if layers is not None and layers < fields["num_layers"]:
        fields["num_layers"] = layers
        fields["dual_attention_layers"] = tuple(i for i in fields["dual_attention_layers"]
                                                if i < layers)
    return fields


def build_sd35(entry: ZooModel, resolved: Resolved) -> Built:
    from diffusers import AutoencoderKL, SD3Transformer2DModel

    fields = transformer_fields(entry.tiny, resolved.layers)
    vae_fields = SD35_TINY_VAE if entry.tiny else SD35_MEDIUM_VAE
    with building_on(resolved.device, resolved.dtype):
        model = SD35Step(SD3Transformer2DModel(**fields), AutoencoderKL(**vae_fields))
    # As loading with torch_dtype does: every floating parameter and buffer in the model dtype.
    model.to(device=resolved.device, dtype=resolved.dtype).eval()
    batch, side = resolved.batch, fields["sample_size"]
    make = {"device": resolved.device, "dtype": resolved.dtype}
    latents = torch.randn(batch, fields["in_channels"], side, side, **make)
    timestep = torch.full((batch,), 1000.0, device=resolved.device)  # the scheduler's float32
    prompt = torch.randn(2 * batch, resolved.seq_len, fields["joint_attention_dim"], **make)
    pooled = torch.randn(2 * batch, fields["pooled_projection_dim"], **make)
    return Built(model, (latents, timestep, prompt, pooled), {})

"""vit-mlp-nki: transformers' ViT MLP block (fc1 -> GELU -> fc2) fused into one NKI kernel.

Hub layout, noarch ``build/torch-neuron`` variant. ``layers.ViTMLP`` replaces the forward of
``transformers.models.vit.modeling_vit.ViTMLP``; ViT's modules carry no ``use_kernel_forward_from_hub`` tag
(transformers 5.23), so tag the class first::

    from kernels import replace_kernel_forward_from_hub, use_kernel_mapping, kernelize, Mode, LocalLayerRepository
    from transformers.models.vit.modeling_vit import ViTMLP
    replace_kernel_forward_from_hub(ViTMLP, "ViTMLP")
    with use_kernel_mapping({"ViTMLP": {"neuron": LocalLayerRepository(repo_path=..., layer_name="ViTMLP")}}):
        model = kernelize(model, device="neuron", mode=Mode.INFERENCE)

The kernel works transposed, with features on the partitions, so neither the hidden activation nor the biases
ever need a transpose: for a block of up to 512 tokens, ``hT = gelu(W1 @ xT + b1)`` is computed 128 features at
a time into PSUM (contraction over the hidden size in 128-row chunks), GELU and the fc1 bias (a per-partition
scalar) are applied on the way out of PSUM, and ``outT = W2 @ hT + b2`` contracts over the intermediate size
straight from SBUF. Weights are read through transposed views of the Linear weights (no copies).
"""

import nki
import nki.isa as nisa
import nki.language as nl

__all__ = ["vit_mlp", "vit_mlp_kernel", "vit_ln_mlp", "vit_ln_mlp_kernel", "vit_attention",
           "vit_attention_kernel", "layers"]


@nki.jit(platform_target="trn2")
def vit_mlp_kernel(xT, w1T, b1, w2T, b2):
    """out[N, D] = gelu(x @ W1.T + b1) @ W2.T + b2, given xT [D, N], w1T [D, I] (= fc1.weight.T), b1 [I, 1],
    w2T [I, D] (= fc2.weight.T), b2 [D, 1]. D and I need not be multiples of 128."""
    D, N = xT.shape
    _, I = w1T.shape
    P = nl.tile_size.pmax                      # 128: contraction and stationary-free tile
    NT = nl.tile_size.gemm_moving_fmax         # 512 tokens per moving tile
    out = nl.ndarray((N, D), dtype=xT.dtype, buffer=nl.shared_hbm)
    outT = out.permute((1, 0))                 # [D, N] view of the result
    nD = (D + P - 1) // P
    nI = (I + P - 1) // P
    for n in nl.affine_range((N + NT - 1) // NT):
        nt = min(NT, N - n * NT)
        # the token block, features on partitions: nD tiles of [128, nt]
        xs = nl.ndarray((nD, nl.par_dim(P), NT), dtype=xT.dtype, buffer=nl.sbuf)
        for d in nl.affine_range(nD):
            dp = min(P, D - d * P)
            nisa.dma_copy(dst=xs[d, :dp, :nt], src=xT[d * P:d * P + dp, n * NT:n * NT + nt])
        # fc1 + bias + GELU: hT [I, nt] kept in SBUF as nI tiles
        hs = nl.ndarray((nI, nl.par_dim(P), NT), dtype=xT.dtype, buffer=nl.sbuf)
        for i in nl.affine_range(nI):
            ip = min(P, I - i * P)
            acc = nl.ndarray((P, NT), dtype=nl.float32, buffer=nl.psum)
            for d in nl.sequential_range(nD):
                dp = min(P, D - d * P)
                w = nl.ndarray((P, P), dtype=w1T.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=w[:dp, :ip], src=w1T[d * P:d * P + dp, i * P:i * P + ip])
                nisa.nc_matmul(dst=acc[:ip, :nt], stationary=w[:dp, :ip], moving=xs[d, :dp, :nt])
            bias = nl.ndarray((P, 1), dtype=b1.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=bias[:ip], src=b1[i * P:i * P + ip, :])
            nisa.activation(dst=hs[i, :ip, :nt], op=nl.gelu, data=acc[:ip, :nt], bias=bias[:ip])
        # fc2 + bias: outT [D, nt]
        for d in nl.affine_range(nD):
            dp = min(P, D - d * P)
            acc = nl.ndarray((P, NT), dtype=nl.float32, buffer=nl.psum)
            for i in nl.sequential_range(nI):
                ip = min(P, I - i * P)
                w = nl.ndarray((P, P), dtype=w2T.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=w[:ip, :dp], src=w2T[i * P:i * P + ip, d * P:d * P + dp])
                nisa.nc_matmul(dst=acc[:dp, :nt], stationary=w[:ip, :dp], moving=hs[i, :ip, :nt])
            bias = nl.ndarray((P, 1), dtype=b2.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=bias[:dp], src=b2[d * P:d * P + dp, :])
            o = nl.ndarray((P, NT), dtype=out.dtype, buffer=nl.sbuf)
            nisa.activation(dst=o[:dp, :nt], op=nl.copy, data=acc[:dp, :nt], bias=bias[:dp])
            nisa.dma_copy(dst=outT[d * P:d * P + dp, n * NT:n * NT + nt], src=o[:dp, :nt])
    return out


def vit_mlp(hidden_states, fc1, fc2):
    """ViTMLP's math on ``hidden_states`` [..., D] with the block's two ``nn.Linear`` layers."""
    shape = hidden_states.shape
    x = hidden_states.reshape(-1, shape[-1])
    out = vit_mlp_kernel(x.t(), fc1.weight.t(), fc1.bias.reshape(-1, 1), fc2.weight.t(), fc2.bias.reshape(-1, 1))
    return out.reshape(shape)


@nki.jit(platform_target="trn2")
def vit_ln_mlp_kernel(x, xT, ln_w, ln_b, w1T, b1, w2T, b2, eps):
    """out[N, D] = x + fc2(gelu(fc1(layernorm(x)))): the second half of a ViT layer in one kernel.

    x [N, D] and xT [D, N] are the same tensor (a transposed view: the residual is read feature-major);
    ln_w, ln_b [1, D]; w1T [D, I], b1 [I, 1], w2T [I, D], b2 [D, 1] as in vit_mlp_kernel. Tokens go 128 at a
    time: LayerNorm token-major (tokens on partitions, two-pass mean and variance over the free axis, as
    torch computes it), then 128 x 128 Tensor Engine transposes into the feature-major layout the matmuls use.
    """
    N, D = x.shape
    _, I = w1T.shape
    P = nl.tile_size.pmax
    out = nl.ndarray((N, D), dtype=x.dtype, buffer=nl.shared_hbm)
    outT = out.permute((1, 0))
    nD = (D + P - 1) // P
    nI = (I + P - 1) // P
    gw = nl.ndarray((1, D), dtype=ln_w.dtype, buffer=nl.sbuf)
    gb = nl.ndarray((1, D), dtype=ln_b.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=gw, src=ln_w)
    nisa.dma_copy(dst=gb, src=ln_b)
    for n in nl.affine_range((N + P - 1) // P):
        nt = min(P, N - n * P)
        # LayerNorm, token-major, in fp32
        xt = nl.ndarray((P, D), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt[:nt], src=x[n * P:n * P + nt, :])
        mean = nl.mean(xt[:nt], axis=1, keepdims=True)
        xc = nl.subtract(xt[:nt], mean)
        var = nl.mean(nl.multiply(xc, xc), axis=1, keepdims=True)
        rstd = nl.rsqrt(nl.add(var, eps))
        y = nl.add(nl.multiply(nl.multiply(xc, rstd), gw.broadcast_to((nt, D))), gb.broadcast_to((nt, D)))
        # to feature-major: nD tiles of [128 features, nt tokens]
        ys = nl.ndarray((nD, nl.par_dim(P), P), dtype=w1T.dtype, buffer=nl.sbuf)
        for d in nl.affine_range(nD):
            dp = min(P, D - d * P)
            tp = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_transpose(dst=tp[:dp, :nt], data=y[:, d * P:d * P + dp])
            nisa.tensor_copy(dst=ys[d, :dp, :nt], src=tp[:dp, :nt])
        # fc1 + bias + GELU
        hs = nl.ndarray((nI, nl.par_dim(P), P), dtype=w1T.dtype, buffer=nl.sbuf)
        for i in nl.affine_range(nI):
            ip = min(P, I - i * P)
            acc = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.psum)
            for d in nl.sequential_range(nD):
                dp = min(P, D - d * P)
                w = nl.ndarray((P, P), dtype=w1T.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=w[:dp, :ip], src=w1T[d * P:d * P + dp, i * P:i * P + ip])
                nisa.nc_matmul(dst=acc[:ip, :nt], stationary=w[:dp, :ip], moving=ys[d, :dp, :nt])
            bias = nl.ndarray((P, 1), dtype=b1.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=bias[:ip], src=b1[i * P:i * P + ip, :])
            nisa.activation(dst=hs[i, :ip, :nt], op=nl.gelu, data=acc[:ip, :nt], bias=bias[:ip])
        # fc2 + bias + residual, feature-major
        for d in nl.affine_range(nD):
            dp = min(P, D - d * P)
            acc = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.psum)
            for i in nl.sequential_range(nI):
                ip = min(P, I - i * P)
                w = nl.ndarray((P, P), dtype=w2T.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=w[:ip, :dp], src=w2T[i * P:i * P + ip, d * P:d * P + dp])
                nisa.nc_matmul(dst=acc[:dp, :nt], stationary=w[:ip, :dp], moving=hs[i, :ip, :nt])
            bias = nl.ndarray((P, 1), dtype=b2.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=bias[:dp], src=b2[d * P:d * P + dp, :])
            o = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=o[:dp, :nt], op=nl.copy, data=acc[:dp, :nt], bias=bias[:dp])
            res = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=res[:dp, :nt], src=xT[d * P:d * P + dp, n * P:n * P + nt])
            r = nl.ndarray((P, P), dtype=out.dtype, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=r[:dp, :nt], data1=o[:dp, :nt], data2=res[:dp, :nt], op=nl.add)
            nisa.dma_copy(dst=outT[d * P:d * P + dp, n * P:n * P + nt], src=r[:dp, :nt])
    return out


def vit_ln_mlp(hidden_states, layernorm, fc1, fc2):
    """hidden_states + ViTMLP(layernorm(hidden_states)) with the layer's LayerNorm and two Linear layers."""
    shape = hidden_states.shape
    x = hidden_states.reshape(-1, shape[-1])
    out = vit_ln_mlp_kernel(x, x.t(), layernorm.weight.reshape(1, -1), layernorm.bias.reshape(1, -1),
                            fc1.weight.t(), fc1.bias.reshape(-1, 1), fc2.weight.t(), fc2.bias.reshape(-1, 1),
                            float(layernorm.eps))
    return out.reshape(shape)


@nki.jit(platform_target="trn2")
def vit_attention_kernel(qT, kT, v, scale):
    """Non-causal softmax attention per (batch, head): out[b, s, h, :] = softmax(q k^T * scale) v.

    qT, kT [B, H, d, S] and v [B, H, S, d] (strided views of the projections: nothing is copied); S <= 512 keys
    (one moving tile), d <= 128. Scores for 128 queries at a time land in PSUM, the softmax runs along the free
    axis in fp32, and P @ V contracts over the keys in 128-key chunks: each chunk of P is transposed on the
    Tensor Engine to be the stationary operand, and the chunks accumulate in one PSUM tile.
    """
    B, H, d, S = qT.shape
    P = nl.tile_size.pmax
    out = nl.ndarray((B, S, H, d), dtype=v.dtype, buffer=nl.shared_hbm)
    nk = (S + P - 1) // P
    for b in nl.affine_range(B):
        for h in nl.affine_range(H):
            kt = nl.ndarray((P, S), dtype=kT.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=kt[:d], src=kT[b, h])
            vs = nl.ndarray((nk, nl.par_dim(P), d), dtype=v.dtype, buffer=nl.sbuf)
            for c in nl.affine_range(nk):
                cs = min(P, S - c * P)
                nisa.dma_copy(dst=vs[c, :cs], src=v[b, h, c * P:c * P + cs, :])
            for q in nl.affine_range(nk):
                qs = min(P, S - q * P)
                qt = nl.ndarray((P, P), dtype=qT.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=qt[:d, :qs], src=qT[b, h, :, q * P:q * P + qs])
                sc = nl.ndarray((P, S), dtype=nl.float32, buffer=nl.psum)
                nisa.nc_matmul(dst=sc[:qs], stationary=qt[:d, :qs], moving=kt[:d])
                s_ = nl.multiply(sc[:qs], scale)
                mx = nl.max(s_, axis=1, keepdims=True)
                e = nl.exp(nl.subtract(s_, mx))
                p = nl.multiply(e, nl.reciprocal(nl.sum(e, axis=1, keepdims=True)))
                acc = nl.ndarray((P, d), dtype=nl.float32, buffer=nl.psum)
                for c in nl.sequential_range(nk):
                    cs = min(P, S - c * P)
                    tp = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.psum)
                    nisa.nc_transpose(dst=tp[:cs, :qs], data=p[:, c * P:c * P + cs])
                    pt = nl.ndarray((P, P), dtype=v.dtype, buffer=nl.sbuf)
                    nisa.tensor_copy(dst=pt[:cs, :qs], src=tp[:cs, :qs])
                    nisa.nc_matmul(dst=acc[:qs], stationary=pt[:cs, :qs], moving=vs[c, :cs])
                o = nl.ndarray((P, d), dtype=out.dtype, buffer=nl.sbuf)
                nisa.tensor_copy(dst=o[:qs], src=acc[:qs])
                nisa.dma_copy(dst=out[b, q * P:q * P + qs, h, :], src=o[:qs])
    return out


def vit_attention(q, k, v, num_heads, scale):
    """softmax(q k^T * scale) v for projections q, k, v [B, S, H * d]; returns [B, S, H * d]."""
    B, S, HD = q.shape
    d = HD // num_heads
    qT = q.view(B, S, num_heads, d).permute(0, 2, 3, 1)
    kT = k.view(B, S, num_heads, d).permute(0, 2, 3, 1)
    vv = v.view(B, S, num_heads, d).permute(0, 2, 1, 3)
    return vit_attention_kernel(qT, kT, vv, float(scale)).reshape(B, S, HD)


from . import layers  # noqa: E402

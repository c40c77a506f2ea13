#!/usr/bin/env python3
"""Reference fixtures from Hugging Face transformers (DESIGN.md section 6, oracle 2).

For each tiny random-weight model below this script writes, into OUT/<name>/:
  config.json         the transformers config, as save_pretrained writes it
  model.safetensors   all weights, float32, ONE file (save_pretrained)
  reference.json      prompt, greedy ids, file names, versions (see below)
  prefill.f32         logits of every prompt position, [24][n_vocab], little-endian float32,
                      from ONE forward pass over the prompt
  decode.f32          [8][n_vocab]: row i holds the logits after feeding greedy[i] at position
                      24 + i (prompt + greedy[0..i] in context), so argmax(row i) == greedy[i + 1]
                      for i < 7, and argmax(prefill row 23) == greedy[0]. This is the convention of
                      llama.cpp's fixtures in ../shared/testdata/llamacpp/archs/ (checked there).

How the reference is kept exact: float32 weights and activations, eager attention, CPU by
default (no TF32 anywhere; on CUDA, TF32 is switched off). Each decode row comes from a full
forward pass over prompt + greedy[0..i] with no cache, so the reference never depends on
transformers' cache classes; the cached incremental path is run too and its largest
difference from the full pass is printed as a cross-check.

Weights: transformers' own init (std 0.02) gives near-uniform logits, so every parameter is
re-drawn from one seeded torch.Generator: matrices N(0, 0.15^2) (logit std about 1; Gemma's
embedding N(0, (0.15/8)^2), see EMBED_STD),
biases N(0, 0.1^2), norm weights 1 + N(0, 0.1^2), or N(0, 0.1^2) for the norms that
compute x * (1 + w) (Gemma, Qwen3-Next, Qwen3.5; recognised because transformers initialises
them to zero), attention sinks N(0, 1), and Gated DeltaNet A_log = log U(1, 16),
dt_bias = 1 + N(0, 0.1^2). A wrong norm offset or a swapped rope pair therefore shows.
After saving, the model is reloaded from the fixture and must reproduce the prefill logits.

Usage (on the GPU machine, which has torch 2.11 and transformers 5.17):
  python3 tools/make_hf_fixtures.py --out tests/fixtures/hf [--only llama,gemma2] [--device cpu]
A model whose class cannot be built is reported as FAILED and the others still run.
"""

import argparse
import json
import os
import shutil
import sys
import time
import traceback

kSeed = 42
kPromptLen = 24
kDecodeSteps = 8
kVocab = 256
kStdWeight = 0.15
kStdBias = 0.1
kStdNorm = 0.1
kMinLogitStd = 0.6  # below this the final norm's gain is raised (see fix_logit_scale)

# Shared by every model unless its entry overrides a key.
COMMON = dict(
    vocab_size=kVocab,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    pad_token_id=None,
    bos_token_id=1,
    eos_token_id=2,
)


def rope(theta, **extra):
    return dict(rope_type="default", rope_theta=theta, **extra)


HYBRID_LAYERS = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
LINEAR_ATTN = dict(
    linear_conv_kernel_dim=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
)

# Gemma multiplies the embedding by sqrt(n_embd) = 8 and ties it to the output head, so at the
# common std the residual stream is dominated by the current token and greedy decoding just
# repeats the prompt's last token (seen: [87] * 8 for both). A std of 0.15 / 8 gives the input
# the same scale as the other models; fix_logit_scale then raises the final norm's gain.
EMBED_STD = {"gemma2": kStdWeight / 8, "gemma3": kStdWeight / 8}

# (name, group, config class, model class, overrides of COMMON, what it exercises)
SPECS = [
    ("llama", "A", "LlamaConfig", "LlamaForCausalLM",
     dict(rope_parameters=rope(10000.0)),
     "plain Llama: RMSNorm, GQA 4/2, rope in HF rotate_half layout, SwiGLU"),
    ("llama3-rope", "A", "LlamaConfig", "LlamaForCausalLM",
     dict(rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                               low_freq_factor=1.0, high_freq_factor=4.0,
                               original_max_position_embeddings=64)),
     "Llama 3 rope scaling; with head_dim 16 the frequencies fall in all three bands"),
    ("qwen2", "A", "Qwen2Config", "Qwen2ForCausalLM",
     dict(rope_parameters=rope(1000000.0), use_sliding_window=False, sliding_window=None),
     "Qwen2: q/k/v biases"),
    ("qwen3", "A", "Qwen3Config", "Qwen3ForCausalLM",
     dict(rope_parameters=rope(1000000.0), use_sliding_window=False, sliding_window=None,
          tie_word_embeddings=True),
     "Qwen3: per-head q/k RMSNorm, tied embeddings"),
    ("phi3", "A", "Phi3Config", "Phi3ForCausalLM",
     dict(rope_parameters=rope(10000.0), sliding_window=None,
          original_max_position_embeddings=256),
     "Phi-3: fused qkv_proj and gate_up_proj"),
    ("gemma2", "A", "Gemma2Config", "Gemma2ForCausalLM",
     dict(num_hidden_layers=4, tie_word_embeddings=True, rope_parameters=rope(10000.0),
          query_pre_attn_scalar=16, sliding_window=8,
          layer_types=["sliding_attention", "full_attention"] * 2,
          attn_logit_softcapping=8.0, final_logit_softcapping=4.0),
     "Gemma 2: (1+w) norms, pre/post norms, embed * sqrt(n_embd), GeGLU, sliding window 8 "
     "on even layers, attention softcap 8, final softcap 4 (small so that both bite)"),
    ("gemma3", "A", "Gemma3TextConfig", "Gemma3ForCausalLM",
     dict(num_hidden_layers=4, tie_word_embeddings=True, query_pre_attn_scalar=16,
          sliding_window=8,
          layer_types=["sliding_attention"] * 3 + ["full_attention"],
          rope_parameters=dict(sliding_attention=rope(10000.0),
                               full_attention=rope(1000000.0))),
     "Gemma 3 text: q/k norms, 3 sliding (window 8, theta 1e4) : 1 full (theta 1e6)"),
    ("mistral", "A", "MistralConfig", "MistralForCausalLM",
     dict(rope_parameters=rope(1000000.0), sliding_window=None),
     "Mistral: no sliding window"),
    ("qwen3_moe", "B", "Qwen3MoeConfig", "Qwen3MoeForCausalLM",
     dict(rope_parameters=rope(1000000.0), use_sliding_window=False, sliding_window=None,
          num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
          norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[]),
     "Qwen3-MoE: 4 experts, top-2, renormalised top-k weights"),
    ("qwen3_next", "B", "Qwen3NextConfig", "Qwen3NextForCausalLM",
     dict(num_hidden_layers=4, intermediate_size=64, layer_types=HYBRID_LAYERS,
          rope_parameters=rope(1000000.0, partial_rotary_factor=0.5),
          partial_rotary_factor=0.5,
          num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
          shared_expert_intermediate_size=32, norm_topk_prob=True,
          decoder_sparse_step=1, mlp_only_layers=[], **LINEAR_ATTN),
     "Qwen3-Next: 3 Gated DeltaNet layers + 1 gated full-attention layer, partial rope, "
     "MoE with shared expert"),
    ("qwen3_5", "B", "Qwen3_5TextConfig", "Qwen3_5ForCausalLM",
     dict(num_hidden_layers=4, intermediate_size=64, layer_types=HYBRID_LAYERS,
          rope_parameters=rope(1000000.0, partial_rotary_factor=0.5,
                               mrope_section=[2, 1, 1], mrope_interleaved=True),
          partial_rotary_factor=0.5, **LINEAR_ATTN),
     "Qwen3.5 text: like Qwen3-Next with a dense MLP; text-only M-RoPE reduces to rope"),
    ("gpt_oss", "B", "GptOssConfig", "GptOssForCausalLM",
     dict(intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
          sliding_window=8, layer_types=["sliding_attention", "full_attention"],
          attention_bias=True,
          rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=4.0,
                               beta_fast=32.0, beta_slow=1.0, truncate=False,
                               original_max_position_embeddings=64)),
     "gpt-oss: attention sinks, biases, YaRN, clamped SwiGLU experts, window 8 on layer 0"),
    ("mixtral", "B", "MixtralConfig", "MixtralForCausalLM",
     dict(rope_parameters=rope(1000000.0), sliding_window=None, intermediate_size=32,
          num_local_experts=4, num_experts_per_tok=2),
     "Mixtral: 4 experts, top-2"),
]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="folder that receives one subfolder per model")
    p.add_argument("--only", default="", help="comma-separated model names (default: all)")
    p.add_argument("--device", default="cpu", help="cpu (default, exact) or cuda")
    return p.parse_args()


def build_model(transformers, torch, spec):
    name, _, config_cls_name, model_cls_name, overrides, _ = spec
    config_cls = getattr(transformers, config_cls_name)
    model_cls = getattr(transformers, model_cls_name)
    kwargs = dict(COMMON)
    kwargs.update(overrides)
    config = config_cls(**kwargs)
    try:
        config._attn_implementation = "eager"
    except Exception as e:  # set_attn_implementation below is the v5 way
        print("  config._attn_implementation: %s" % e)
    torch.manual_seed(kSeed)
    model = model_cls(config)
    prefer_eager(model)
    force_torch_paths(model)
    model = model.float().eval()
    return config, model


def prefer_eager(model):
    """Eager attention (softcaps and sinks are exact there) and the plain per-expert loop."""
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("eager")
    if hasattr(model, "set_experts_implementation"):
        try:
            model.set_experts_implementation("eager")
        except Exception as e:  # models without experts may refuse; say so and go on
            print("  set_experts_implementation: %s" % e)


def force_torch_paths(model):
    """Gated DeltaNet layers bind fla / causal_conv1d kernels at __init__ when those packages
    are installed; Triton dots may run in TF32, so rebind the plain torch fallbacks."""
    for mod in model.modules():
        if not hasattr(mod, "chunk_gated_delta_rule"):
            continue
        lib = sys.modules[type(mod).__module__]
        for attr, fallback in (("chunk_gated_delta_rule", "torch_chunk_gated_delta_rule"),
                               ("recurrent_gated_delta_rule", "torch_recurrent_gated_delta_rule"),
                               ("causal_conv1d_update", "torch_causal_conv1d_update")):
            if hasattr(mod, attr) and hasattr(lib, fallback):
                setattr(mod, attr, getattr(lib, fallback))
        if hasattr(mod, "causal_conv1d_fn"):
            mod.causal_conv1d_fn = None
        norm = getattr(mod, "norm", None)
        if norm is not None and type(norm).__name__.startswith("Fused"):
            print("  WARNING: %s uses %s (fla), not the torch norm" % (type(mod).__name__,
                                                                       type(norm).__name__))


def reinit_weights(torch, model, embed_std):
    """Re-draws every parameter from one seeded generator (rules in the file header); the
    token embedding gets `embed_std`. Returns the names of the norms that compute x * (1 + w)."""
    gen = torch.Generator(device="cpu").manual_seed(kSeed)
    offset_norms = set()

    def randn(shape):
        return torch.randn(tuple(shape), generator=gen, dtype=torch.float32)

    with torch.no_grad():
        for pname, p in model.named_parameters():
            leaf = pname.rsplit(".", 1)[-1]
            if leaf == "A_log":
                u = torch.rand(tuple(p.shape), generator=gen) * 15.0 + 1.0
                new = torch.log(u)
            elif leaf == "dt_bias":
                new = 1.0 + kStdNorm * randn(p.shape)
            elif leaf == "sinks":
                new = randn(p.shape)
            elif p.dim() == 1 and "norm" in pname.lower() and leaf == "weight":
                if abs(float(p.float().mean())) < 0.5:  # zero-initialised: x * (1 + w)
                    offset_norms.add(pname)
                    new = kStdNorm * randn(p.shape)
                else:
                    new = 1.0 + kStdNorm * randn(p.shape)
            elif p.dim() == 1:
                new = kStdBias * randn(p.shape)
            elif pname.endswith("embed_tokens.weight"):
                new = embed_std * randn(p.shape)
            else:
                new = kStdWeight * randn(p.shape)
            p.copy_(new.to(p.device, p.dtype))
    return offset_norms


def forward_logits(torch, model, ids, device):
    with torch.no_grad():
        x = torch.tensor([ids], dtype=torch.long, device=device)
        out = model(input_ids=x, use_cache=False)
        return out.logits[0].float().cpu()


def logit_std(logits):
    return float(logits.std(dim=-1).mean())


def fix_logit_scale(torch, model, offset_norms, prompt, device):
    """Raises the final norm's gain when the logits are too flat to tell tokens apart."""
    std = logit_std(forward_logits(torch, model, prompt, device))
    norm = getattr(getattr(model, "model", None), "norm", None)
    if std >= kMinLogitStd or norm is None or not hasattr(norm, "weight"):
        return std, None
    scale = 1.5 / max(std, 1e-3)
    pname = "model.norm.weight"
    with torch.no_grad():
        if pname in offset_norms:
            norm.weight.copy_((1.0 + norm.weight) * scale - 1.0)
        else:
            norm.weight.mul_(scale)
    return logit_std(forward_logits(torch, model, prompt, device)), scale


def greedy_reference(torch, model, prompt, device):
    """prefill [24][V]; greedy ids; decode [8][V] with row i = logits after feeding greedy[i]."""
    prefill = forward_logits(torch, model, prompt, device)
    greedy = [int(torch.argmax(prefill[-1]))]
    rows = []
    for i in range(kDecodeSteps):
        row = forward_logits(torch, model, prompt + greedy[: i + 1], device)[-1]
        rows.append(row)
        if i + 1 < kDecodeSteps:
            greedy.append(int(torch.argmax(row)))
    return prefill, greedy, torch.stack(rows)


def cached_decode_diff(torch, model, prompt, greedy, decode, device):
    """Largest |difference| between the incremental (KV/recurrent cache) path and decode."""
    with torch.no_grad():
        x = torch.tensor([prompt], dtype=torch.long, device=device)
        out = model(input_ids=x, use_cache=True)
        cache = out.past_key_values
        worst = 0.0
        for i, tok in enumerate(greedy):
            x = torch.tensor([[tok]], dtype=torch.long, device=device)
            out = model(input_ids=x, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            row = out.logits[0, -1].float().cpu()
            worst = max(worst, float((row - decode[i]).abs().max()))
        return worst


def save_model(model, folder):
    import inspect
    kwargs = {"max_shard_size": "1GB"}
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        kwargs["safe_serialization"] = True
    model.save_pretrained(folder, **kwargs)
    for extra in ("generation_config.json",):
        path = os.path.join(folder, extra)
        if os.path.exists(path):
            os.remove(path)
    if not os.path.exists(os.path.join(folder, "model.safetensors")):
        raise RuntimeError("save_pretrained did not write a single model.safetensors: %s"
                           % sorted(os.listdir(folder)))


def tensor_shapes(path):
    from safetensors import safe_open
    shapes = {}
    with safe_open(path, framework="pt") as f:
        for key in sorted(f.keys()):
            shapes[key] = list(f.get_slice(key).get_shape())
    return shapes


def reload_diff(torch, transformers, spec, folder, prompt, prefill, device):
    model_cls = getattr(transformers, spec[3])
    try:
        model = model_cls.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32)
    except TypeError:
        model = model_cls.from_pretrained(folder, attn_implementation="eager",
                                          torch_dtype=torch.float32)
    prefer_eager(model)
    force_torch_paths(model)
    model = model.float().eval().to(device)
    return float((forward_logits(torch, model, prompt, device) - prefill).abs().max())


def write_f32(path, tensor):
    import numpy as np
    arr = tensor.detach().cpu().numpy().astype("<f4")
    with open(path, "wb") as f:
        f.write(arr.tobytes(order="C"))


def make_fixture(torch, transformers, spec, out_root, prompt, device):
    name = spec[0]
    folder = os.path.join(out_root, name)
    if os.path.exists(folder):
        shutil.rmtree(folder)
    os.makedirs(folder)

    config, model = build_model(transformers, torch, spec)
    offset_norms = reinit_weights(torch, model, EMBED_STD.get(name, kStdWeight))
    model = model.to(device)
    std, scale = fix_logit_scale(torch, model, offset_norms, prompt, device)
    n_params = sum(p.numel() for p in model.parameters())
    print("  class %s, attn %s, experts %s, %d parameters, logits std %.3f%s"
          % (type(model).__name__, getattr(model.config, "_attn_implementation", "?"),
             getattr(model.config, "_experts_implementation", "-"), n_params, std,
             "" if scale is None else " (final norm gain x%.3f)" % scale))
    print("  offset (1+w) norms: %d; layer_types %s; rope %s"
          % (len(offset_norms), getattr(config, "layer_types", None),
             json.dumps(getattr(config, "rope_parameters", None))))

    prefill, greedy, decode = greedy_reference(torch, model, prompt, device)
    assert int(torch.argmax(prefill[-1])) == greedy[0]
    for i in range(kDecodeSteps - 1):
        assert int(torch.argmax(decode[i])) == greedy[i + 1]
    print("  greedy %s" % greedy)
    try:
        print("  cached decode vs full pass: max |diff| %.3g"
              % cached_decode_diff(torch, model, prompt, greedy, decode, device))
    except Exception as e:  # informational only; the reference does not use the cache
        print("  cached decode check failed: %s: %s" % (type(e).__name__, e))

    save_model(model, folder)
    write_f32(os.path.join(folder, "prefill.f32"), prefill)
    write_f32(os.path.join(folder, "decode.f32"), decode)
    shapes = tensor_shapes(os.path.join(folder, "model.safetensors"))
    reference = {
        "script": "tools/make_hf_fixtures.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "model": name,
        "class": type(model).__name__,
        "what": spec[5],
        "seed": kSeed,
        "device": device,
        "n_params": n_params,
        "prompt": prompt,
        "greedy": greedy,
        "prefill_logits": "prefill.f32",
        "decode_logits": "decode.f32",
        "decode_rows": "row i = logits after feeding greedy[i] at position %d + i" % kPromptLen,
        "n_vocab": int(prefill.shape[-1]),
        "tensors": shapes,
    }
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump(reference, f, indent=1)
        f.write("\n")

    diff = reload_diff(torch, transformers, spec, folder, prompt, prefill, device)
    print("  reloaded fixture reproduces prefill: max |diff| %.3g" % diff)
    if diff > 1e-4:
        raise RuntimeError("reloaded model differs from the reference by %g" % diff)
    for fname in sorted(os.listdir(folder)):
        print("  %-18s %8d bytes" % (fname, os.path.getsize(os.path.join(folder, fname))))


def main():
    args = parse_args()
    import torch
    import transformers

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    print("torch %s, transformers %s, device %s" % (torch.__version__, transformers.__version__,
                                                   args.device))

    gen = torch.Generator(device="cpu").manual_seed(kSeed)
    prompt = [int(t) for t in torch.randint(0, kVocab, (kPromptLen,), generator=gen)]
    print("prompt %s" % prompt)

    only = [s for s in args.only.split(",") if s]
    results = []
    for spec in SPECS:
        if only and spec[0] not in only:
            continue
        print("== %s (issue %s): %s" % (spec[0], spec[1], spec[5]))
        t0 = time.time()
        try:
            make_fixture(torch, transformers, spec, args.out, prompt, args.device)
            results.append((spec[0], "ok"))
        except Exception as e:
            traceback.print_exc(file=sys.stdout)
            folder = os.path.join(args.out, spec[0])
            if os.path.exists(folder):
                shutil.rmtree(folder)
            results.append((spec[0], "FAILED: %s: %s" % (type(e).__name__, str(e)[:200])))
        print("  (%.1f s)" % (time.time() - t0))
        sys.stdout.flush()

    print("== summary")
    for name, status in results:
        print("  %-12s %s" % (name, status))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Trains frink's demo model (models/frink-demo.gguf): a small Llama on the King James Bible.

Input: the folder tools/prepare_demo_corpus.py writes (train.txt, heldout.txt).
Output, in OUT/:
  tokenizer.json      byte-level BPE (GPT-2's pre-tokenizer regex, exactly llama.cpp's "gpt-2"
                      pre-tokenizer), trained on train.txt alone; "<|endoftext|>" is id 0 and
                      serves as BOS (and EOS)
  config.json,        transformers' LlamaForCausalLM, tied embeddings, saved in bfloat16
  model.safetensors   (frink convert reads this folder and writes the GGUF)
  reference.json      held-out perplexity under frink perplexity's windowing, token counts,
                      seed, versions, the command line, training figures
  heldout_ids.json    the held-out text's token ids (with BOS), for checking frink's tokenizer

Recipe (fixed seed 1234): train.txt is split into train (its first 98%) and dev (the rest,
contiguous) for model selection; heldout.txt is never seen until the final evaluation. Each
training sequence is BOS + n_ctx - 1 tokens from a random offset, the same shape as the windows
frink perplexity scores. AdamW (0.9, 0.95, wd 0.1), bf16 autocast, warmup then cosine to 10%,
residual and embedding dropout (forward hooks, so the saved model is plain Llama). The corpus is
about a million tokens, small for 20M parameters, so overfitting is the risk, not compute: a
few candidates (dropout, epochs) run in turn, each keeps its best dev checkpoint (checked every
epoch), and the best over all wins. A candidate whose projected time would pass the wall-time
budget is skipped and logged.

Perplexity (the reference for tests/cli/demo_model_test.cpp) is computed exactly as
src/engine/perplexity.cpp (llama-perplexity) does: tokens = [BOS] + encode(text) with special
tokens not parsed; non-overlapping windows of n_ctx tokens; each window's first token replaced
by BOS and run from an empty context; the logits at positions [n_ctx/2, n_ctx - 1) score the
token after each; PPL = exp(mean NLL). The weights are the saved bfloat16 ones, computed in
float32 (TF32 off), which is what frink reads before quantizing.

Usage (on the GPU machine: torch 2.11, transformers 5.17, tokenizers 0.23):
  python3 tools/train_demo_model.py --corpus .fixtures/corpus --out OUT [--smoke]
--smoke runs every stage with a few steps, to catch errors before a full run.
"""

import argparse
import json
import math
import os
import platform
import sys
import time

kSeed = 1234
kVocab = 8192
kCtx = 512
kBos = "<|endoftext|>"
kDevFraction = 0.02
kBatch = 32            # sequences per step (x 512 tokens = 16k tokens)
kLr, kMinLrFrac, kWarmup = 1e-3, 0.1, 100
kWallBudget = 240.0    # seconds of training over all candidates
kTestChunks = 8        # windows the CI test scores (frink perplexity --chunks 8)

# ~20.7M parameters: Q8_0 about 22 MB (the repository's limit is 25 MB).
MODEL = dict(hidden_size=512, intermediate_size=1280, num_hidden_layers=6, num_attention_heads=8,
             num_key_value_heads=4, max_position_embeddings=kCtx, rms_norm_eps=1e-5,
             tie_word_embeddings=True, hidden_act="silu")

# A first run (dropout 0.1/12 epochs, 0.2/24, 0.3/40) found the dev optimum near epoch 10, mid-schedule;
# these end their cosine there.
CANDIDATES = [dict(dropout=0.2, epochs=10), dict(dropout=0.2, epochs=14), dict(dropout=0.3, epochs=14)]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def train_tokenizer(text: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    # GPT-2's regex, no prefix space: llama.cpp's "gpt-2" pre-tokenizer (frink's kGpt2).
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=kVocab, special_tokens=[kBos], min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([text], trainer=trainer)
    # BOS before every text, as every training sequence starts (transformers' encode adds it).
    tok.post_processor = processors.TemplateProcessing(single=f"{kBos} $A", special_tokens=[(kBos, tok.token_to_id(kBos))])
    return tok


def encode(tok, text: str) -> list:
    return tok.encode(text, add_special_tokens=False).ids


def add_dropout(model, p: float):
    """nanoGPT-style dropout on the embedding output and each residual branch (training only)."""
    import torch.nn.functional as F

    def drop(mod, inp, out):
        if isinstance(out, tuple):
            return (F.dropout(out[0], p, mod.training),) + tuple(out[1:])
        return F.dropout(out, p, mod.training)

    hooks = [model.model.embed_tokens.register_forward_hook(drop)]
    for layer in model.model.layers:
        hooks.append(layer.self_attn.register_forward_hook(drop))
        hooks.append(layer.mlp.register_forward_hook(drop))
    return hooks


def frink_perplexity(model, tokens, bos: int, n_ctx: int, n_chunks: int = -1) -> dict:
    """src/engine/perplexity.cpp's run_perplexity, in float64 log-softmax. `tokens` starts with BOS."""
    import torch
    n_chunk = len(tokens) // n_ctx
    if n_chunks > 0:
        n_chunk = min(n_chunk, n_chunks)
    first = n_ctx // 2
    t = torch.tensor(tokens, dtype=torch.long, device="cuda")
    nll, n, chunk_nll = 0.0, 0, []
    model.eval()
    with torch.no_grad():
        for c in range(n_chunk):
            w = t[c * n_ctx:(c + 1) * n_ctx].clone()
            w[0] = bos
            logits = model(w[None]).logits[0].double()
            lp = torch.log_softmax(logits[first:n_ctx - 1], dim=-1)
            target = t[c * n_ctx + first + 1:(c + 1) * n_ctx]
            chunk_nll.append(float(-lp.gather(1, target[:, None]).sum()))
            nll += chunk_nll[-1]
            n += int(target.numel())
    # chunk_nll[i]: summed NLL of window i, so the PPL of the first k windows is
    # exp(sum(chunk_nll[:k]) / (k * (n_ctx - 1 - n_ctx // 2))).
    return dict(n_ctx=n_ctx, n_chunks=n_chunk, n_scored=n, nll_mean=nll / n, ppl=math.exp(nll / n),
                chunk_nll=chunk_nll)


def train_candidate(cand, cfg, train_ids, dev_ids, bos, steps_per_epoch, smoke, time_left):
    import torch
    from transformers import LlamaForCausalLM
    torch.manual_seed(kSeed)
    gen = torch.Generator(device="cuda").manual_seed(kSeed)
    model = LlamaForCausalLM(cfg).cuda()
    hooks = add_dropout(model, cand["dropout"])
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=kLr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    n_epochs = cand["epochs"]
    total = 20 if smoke else n_epochs * steps_per_epoch
    eval_every = 10 if smoke else steps_per_epoch
    data = torch.tensor(train_ids, dtype=torch.long, device="cuda")
    span = kCtx - 1
    best = dict(dev_ppl=float("inf"), step=0, state=None)
    t0 = time.time()
    loss_ema = None
    for step in range(1, total + 1):
        lr = kLr * step / kWarmup if step <= kWarmup else \
            kLr * (kMinLrFrac + (1 - kMinLrFrac) * 0.5 * (1 + math.cos(math.pi * (step - kWarmup) / max(1, total - kWarmup))))
        for g in opt.param_groups:
            g["lr"] = lr
        model.train()
        off = torch.randint(0, data.numel() - span, (kBatch,), generator=gen, device="cuda")
        x = torch.stack([data[o:o + span] for o in off.tolist()])
        x = torch.cat([torch.full((kBatch, 1), bos, dtype=torch.long, device="cuda"), x], dim=1)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        lv = float(loss.detach())
        loss_ema = lv if loss_ema is None else 0.95 * loss_ema + 0.05 * lv
        if step % eval_every == 0 or step == total:
            dev = frink_perplexity(model, dev_ids, bos, kCtx)
            el = time.time() - t0
            mark = ""
            if dev["ppl"] < best["dev_ppl"]:
                best = dict(dev_ppl=dev["ppl"], step=step, train_loss=loss_ema,
                            state={k: v.detach().clone() for k, v in model.state_dict().items()})
                mark = " *"
            log(f"  step {step}/{total} epoch {step / steps_per_epoch:.1f} lr {lr:.2e} train loss {loss_ema:.4f} "
                f"dev ppl {dev['ppl']:.3f}{mark} ({el:.0f} s)")
            if el > time_left:
                log(f"  wall-time budget reached after {el:.0f} s: candidate stopped at step {step}")
                break
    for h in hooks:
        h.remove()
    best.update(steps_run=step, seconds=time.time() - t0, final_train_loss=loss_ema, **cand)
    model.load_state_dict(best["state"])
    return model, best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", required=True, help="folder with train.txt and heldout.txt")
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="a few steps of every stage")
    a = ap.parse_args()

    import hashlib
    import tokenizers
    import torch
    import transformers
    from transformers import LlamaConfig

    t_start = time.time()
    torch.manual_seed(kSeed)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.makedirs(a.out, exist_ok=True)
    read = lambda n: open(os.path.join(a.corpus, n), encoding="ascii").read()
    train_text, heldout_text = read("train.txt"), read("heldout.txt")
    cut = train_text.rfind("\n\n", 0, int(len(train_text) * (1 - kDevFraction))) + 2
    fit_text, dev_text = train_text[:cut], train_text[cut:]

    log(f"tokenizer: byte-level BPE, vocab {kVocab}, on {len(train_text)} bytes")
    tok = train_tokenizer(train_text)
    bos, n_vocab = tok.token_to_id(kBos), tok.get_vocab_size()
    assert bos == 0, bos
    log(f"tokenizer: {n_vocab} entries")
    tok.save(os.path.join(a.out, "tokenizer.json"))
    # What llama.cpp's converter (and frink convert) read for tokenizer.ggml.add_bos_token.
    with open(os.path.join(a.out, "tokenizer_config.json"), "w") as f:
        json.dump(dict(tokenizer_class="PreTrainedTokenizerFast", bos_token=kBos, eos_token=kBos,
                       add_bos_token=True, add_eos_token=False, model_max_length=kCtx), f, indent=2)
        f.write("\n")
    fit_ids = encode(tok, fit_text)
    dev_ids = [bos] + encode(tok, dev_text)
    heldout_ids = [bos] + encode(tok, heldout_text)
    log(f"tokens: train {len(fit_ids)}, dev {len(dev_ids)}, held-out {len(heldout_ids)} (with BOS)")

    cfg = LlamaConfig(vocab_size=n_vocab, bos_token_id=bos, eos_token_id=bos, **MODEL)
    steps_per_epoch = max(1, len(fit_ids) // (kBatch * (kCtx - 1)))
    results, best_model, best = [], None, None
    train_t0 = time.time()
    for cand in CANDIDATES[:1] if a.smoke else CANDIDATES:
        used = time.time() - train_t0
        if results and not a.smoke:
            sec_per_epoch = sum(r["seconds"] for r in results) / sum(r["steps_run"] / steps_per_epoch for r in results)
            if used + sec_per_epoch * cand["epochs"] > kWallBudget:
                log(f"candidate {cand} skipped: {sec_per_epoch * cand['epochs']:.0f} s projected, {kWallBudget - used:.0f} s left")
                continue
        log(f"candidate {cand}: {cand['epochs']} epochs of {steps_per_epoch} steps x {kBatch} x {kCtx} tokens")
        model, r = train_candidate(cand, cfg, fit_ids, dev_ids, bos, steps_per_epoch, a.smoke, kWallBudget - used)
        log(f"candidate {cand}: best dev ppl {r['dev_ppl']:.3f} at step {r['step']} ({r['seconds']:.0f} s)")
        state = r.pop("state")
        results.append(r)
        if best is None or r["dev_ppl"] < best["dev_ppl"]:
            best, best_model = r, model
        else:
            del model, state
    train_seconds = time.time() - train_t0
    n_params = sum(p.numel() for p in best_model.parameters())
    log(f"chosen: {best}, {n_params} parameters, training wall time {train_seconds:.0f} s")

    # Save in bfloat16; evaluate those exact weights in float32.
    best_model = best_model.to(torch.bfloat16)
    best_model.save_pretrained(a.out, safe_serialization=True, max_shard_size="1GB")
    best_model = best_model.to(torch.float32)
    full = frink_perplexity(best_model, heldout_ids, bos, kCtx)
    prefix = frink_perplexity(best_model, heldout_ids, bos, kCtx, kTestChunks)
    dev = frink_perplexity(best_model, dev_ids, bos, kCtx)
    log(f"held-out perplexity (bf16 weights, fp32 compute): all {full['n_chunks']} windows {full['ppl']:.4f}, "
        f"first {kTestChunks} windows {prefix['ppl']:.4f}; dev {dev['ppl']:.4f}")

    samples = {}
    for prompt in ["In the beginning", "And the LORD said unto Moses,"]:
        try:  # a sample is for the log only; a failure here must not lose the reference
            ids = torch.tensor([[bos] + encode(tok, prompt)], device="cuda")
            out = best_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=60, do_sample=False,
                                      pad_token_id=bos)
            samples[prompt] = tok.decode(out[0, 1:].tolist())
            log(f"greedy: {samples[prompt]!r}")
        except Exception as e:  # noqa: BLE001
            log(f"greedy sample failed: {e!r}")

    sha = lambda s: hashlib.sha256(s.encode("ascii")).hexdigest()
    ref = dict(
        written_by="tools/train_demo_model.py",
        command="python3 " + " ".join(sys.argv),
        seed=kSeed,
        smoke=a.smoke,
        versions=dict(python=platform.python_version(), torch=torch.__version__, transformers=transformers.__version__,
                      tokenizers=tokenizers.__version__, cuda=torch.version.cuda, gpu=torch.cuda.get_device_name()),
        corpus=dict(package="bible-kjv-text (King James Version; public domain)", train_bytes=len(train_text),
                    train_sha256=sha(train_text), heldout_bytes=len(heldout_text), heldout_sha256=sha(heldout_text),
                    dev="the last ~2% of train.txt (from a chapter start), used only to pick the checkpoint"),
        tokenizer=dict(kind="byte-level BPE (tokenizers BpeTrainer), pre-tokenizer ByteLevel(add_prefix_space=False, "
                       "use_regex=True) = llama.cpp 'gpt-2'", vocab_size=n_vocab, bos_id=bos, eos_id=bos, bos=kBos),
        model=dict(arch="LlamaForCausalLM", n_params=n_params, dtype_saved="bfloat16", **MODEL),
        training=dict(candidates=results, chosen=dict((k, v) for k, v in best.items()), batch_sequences=kBatch,
                      seq_len=kCtx, lr=kLr, min_lr_fraction=kMinLrFrac, warmup_steps=kWarmup,
                      optimizer="AdamW(0.9, 0.95, eps 1e-8, weight decay 0.1 on matrices), grad clip 1.0, bf16 autocast",
                      steps_per_epoch=steps_per_epoch, train_tokens=len(fit_ids), wall_seconds=round(train_seconds, 1)),
        perplexity=dict(
            windowing="frink perplexity / llama-perplexity: tokens = [BOS] + encode(text) (special tokens not parsed); "
                      "non-overlapping windows of n_ctx tokens, window[0] := BOS, each from an empty context; logits at "
                      "positions [n_ctx/2, n_ctx - 1) score the next token; PPL = exp(mean NLL)",
            weights="the saved bfloat16 weights, computed in float32 (TF32 off), log-softmax in float64",
            text="heldout.txt (models/frink-demo-heldout.txt)", n_tokens=len(heldout_ids),
            heldout_ids_sha256=hashlib.sha256(json.dumps(heldout_ids).encode()).hexdigest(),
            test=dict(prefix, command=f"frink perplexity -m models/frink-demo.gguf -f models/frink-demo-heldout.txt "
                                      f"-c {kCtx} --chunks {kTestChunks}"),
            full=full, dev=dev),
        greedy_samples=samples,
        total_seconds=round(time.time() - t_start, 1),
    )
    with open(os.path.join(a.out, "reference.json"), "w") as f:
        json.dump(ref, f, indent=2)
        f.write("\n")
    with open(os.path.join(a.out, "heldout_ids.json"), "w") as f:
        json.dump(heldout_ids, f)
    log(f"wrote {sorted(os.listdir(a.out))} in {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()

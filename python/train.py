"""Train the small or large recall model on freshly generated synthetic episodes (python/episodes.py).

  /usr/bin/python3 python/train.py --model small --minutes 20
  /usr/bin/python3 python/train.py --model large --minutes 25
  /usr/bin/python3 python/train.py --model large --resume models/large/model.safetensors --minutes 15 \
      --lr 1e-3 --warmup 5 --eval-every 7                     # how the committed large model was continued

Data: every step draws new training episodes (RNG stream TRAIN_STREAM, disjoint from the evaluation files) with
probe triples `query key value` inserted inline at their probe points (3 per fact, ages spread); the loss is the
cross-entropy of the answer token after every `query key` (inserted probes and the episode's own re-reads), on
nothing else.
Curriculum: stage 0, batches of 16 episodes of 160 tokens, until a minute's training accuracy reaches
--stage0-acc (or --stage0 of the run); stage 1, batches of 8 episodes of 450 tokens (cropped/padded to 480),
--stretch of them with "stretched" RoPE positions (a sorted random sample of 0..1759, so relative distances up to
~1,760 are seen cheaply), until --stage1-acc (or --phase-a of the run); stage 2, each step a batch of
--batch-long 1700-token episodes (1760 long, contiguous positions) with probability --long-share, else a stage-1
batch. Init: random, then (--init circuit, the default) model.init_recall_circuit on layer 0.
AdamW, linear warm-up then cosine decay to 10%, over time (--minutes) or, for a bit-exact rerun, over steps
(--steps; the stages then change at their run fractions only, not on accuracy). Every minute: tokens/s, training loss and accuracy, accuracy on held-out sequences; every --eval-every
minutes (stage 2) the exact full-cache recall on models/episodes-{450,1700}.json (evaluate_full_cache.py); the best
checkpoint by min(tier recall) is kept, and the run stops early once the last minute's answer loss is at most
--target-loss and both tiers and the held-out sets reach --target.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import episodes as E  # noqa: E402
import evaluate_full_cache as EV  # noqa: E402
import llama_model as LM  # noqa: E402
import model as M  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_batch(tier, length, seed, first_index, count, stretch_p, rng, max_pos):
    xs, ys, ps = [], [], []
    for b in range(count):
        x, y = E.training_sequence(tier, seed, first_index + b, probes_per_fact=3, length=length)
        if stretch_p > 0 and rng.random() < stretch_p:
            p = np.sort(rng.choice(max_pos, size=length, replace=False))
        else:
            p = np.arange(length)
        xs.append(x), ys.append(y), ps.append(p)
    return torch.from_numpy(np.stack(xs)), torch.from_numpy(np.stack(ys)), torch.from_numpy(np.stack(ps))


def loss_and_acc(m, x, y, p):
    h = m(x, positions=p, hidden_only=True)
    sel = y != -100
    logits = F.linear(h[sel], m.embed)
    tgt = y[sel]
    loss = F.cross_entropy(logits, tgt)
    return loss, (logits.argmax(-1) == tgt).float().sum().item(), tgt.numel()


@torch.no_grad()
def held_out_acc(m, batches):
    c = n = 0
    for x, y, p in batches:
        _, cc, nn_ = loss_and_acc(m, x, y, p)
        c += cc
        n += nn_
    return c / max(1, n)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["small", "large", "tiny", "llama-small", "llama-large"], required=True)
    ap.add_argument("--d-model", type=int)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--minutes", type=float, default=20)
    ap.add_argument("--steps", type=int, help="fixed step count (deterministic schedule) instead of --minutes")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rope-theta", type=float, default=500000.0)
    ap.add_argument("--init", choices=["circuit", "random"], default="circuit",
                    help="circuit: model.init_recall_circuit on top of the random init")
    ap.add_argument("--alpha2", type=float, default=8.0)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--wd", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--batch-short", type=int, default=8)
    ap.add_argument("--batch-long", type=int, default=2)
    ap.add_argument("--stage0", type=float, default=0.25, help="max run fraction on 160-token episodes")
    ap.add_argument("--stage0-acc", type=float, default=0.9, help="leave stage 0 at this training accuracy")
    ap.add_argument("--phase-a", type=float, default=0.45, help="max run fraction before 1700-token batches")
    ap.add_argument("--stage1-acc", type=float, default=0.9, help="start 1700-token batches at this accuracy")
    ap.add_argument("--long-share", type=float, default=0.5)
    ap.add_argument("--stretch", type=float, default=0.5)
    ap.add_argument("--eval-every", type=float, default=4.0, help="minutes between full-cache evaluations")
    ap.add_argument("--target", type=float, default=0.98)
    ap.add_argument("--target-loss", type=float, default=0.05,
                    help="early stop also needs the last minute's mean answer loss (nats) at or below this")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--need-aligned-eval", action="store_true",
                    help="the full-cache evaluations also ask the need-aligned files' probes")
    ap.add_argument("--out", help="output directory (default models/<model>)")
    ap.add_argument("--resume", help="continue from these weights (straight to stage 2; fresh optimizer); the "
                                     "log is appended to")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    llama = a.model.startswith("llama-")
    size = dict((LM if llama else M).SIZES[a.model])
    if a.d_model:
        size["d_model"] = a.d_model
    if a.layers:
        size["n_layers"] = a.layers
    if a.heads:
        size["n_heads"] = a.heads
    cfg = (LM if llama else M).make_config(E.VOCAB_SIZE, **size)
    cfg["rope_theta"] = a.rope_theta
    m = LM.LlamaLM(cfg) if llama else M.TinyLM(cfg)
    m.init_weights(a.seed)
    if a.resume:
        prev, _, _ = (LM if llama else M).load_model(a.resume)
        if prev.config != cfg:
            raise SystemExit(f"--resume: config {prev.config} differs from {cfg}")
        m.load_state_dict(prev.state_dict())
    elif a.init == "circuit":
        if llama:
            info = LM.init_recall_circuit(m, a.seed)
            print(f"recall-circuit init (previous-token + induction heads): {info}")
        else:
            low = M.init_recall_circuit(m, a.seed, alpha2=a.alpha2)
            print(f"recall-circuit init: low-frequency RoPE pairs {low}")
    out = a.out or os.path.join(ROOT, "models", a.model)
    os.makedirs(out, exist_ok=True)
    logf = open(os.path.join(out, "train_log.txt"), "a" if a.resume else "w")

    def log(s):
        line = f"[{time.strftime('%H:%M:%S', time.gmtime())}] {s}"
        print(line, flush=True)
        logf.write(line + "\n")
        logf.flush()

    nparam = sum(p.numel() for p in m.parameters())
    log(f"model {a.model}: {json.dumps(cfg)}; {nparam} parameters")
    log(f"args: {json.dumps(vars(a))}")
    if a.resume:
        log(f"resumed from {a.resume} (stage 2)")
    decay = [p for n, p in m.named_parameters() if p.dim() == 2 and n != "embed" and "conv" not in n]
    nodecay = [p for n, p in m.named_parameters() if not (p.dim() == 2 and n != "embed" and "conv" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.98))
    rng = np.random.default_rng([a.seed, 12345])
    max_pos = 1760
    val_seed = a.seed + 1_000_000
    vrng = np.random.default_rng([val_seed])
    val_short = [make_batch(450, 480, val_seed, 0, 8, 0.0, vrng, max_pos)]
    val_long = [make_batch(1700, 1760, val_seed, 1000, 2, 0.0, vrng, max_pos)]
    ep_files = [os.path.join(ROOT, "models/episodes-450.json"), os.path.join(ROOT, "models/episodes-1700.json")]
    if a.need_aligned_eval:  # both families must reach the target (the need-aligned one holds the anchors)
        ep_files += [os.path.join(ROOT, "models/episodes-need-450.json"),
                     os.path.join(ROOT, "models/episodes-need-1700.json")]
    qtok = E.VOCAB_LAYOUT["query"]

    t0 = time.time()
    total_s = a.minutes * 60
    step = 0
    idx = {160: 0, 450: 0, 1700: 0}
    stage = 2 if a.resume else 0 if a.stage0 > 0 else 1
    acc_recent = 0.0
    stats = dict(loss=0.0, c=0, n=0, tok=0, steps=0)
    last_log, last_eval = t0, t0
    best = -1.0
    best_info = None
    history = []

    def frac():
        return step / a.steps if a.steps else (time.time() - t0) / total_s

    def full_eval(tag):
        nonlocal best, best_info
        m.eval()
        res = [EV.evaluate(m, f) for f in ep_files]
        m.train()
        vs, vl = held_out_acc(m, val_short), held_out_acc(m, val_long)
        score = min(r["recall"] for r in res)
        regs = "; ".join(f"{r['tier']}: " + " ".join(f"{k} {v['correct']}/{v['probes']}" for k, v in r["regions"].items())
                         for r in res)
        log(f"EVAL {tag} step {step}: full-cache recall 450 {100 * res[0]['recall']:.1f}% 1700 "
            f"{100 * res[1]['recall']:.1f}% (held-out inline 450 {100 * vs:.1f}% 1700 {100 * vl:.1f}%) [{regs}]")
        if score >= best:
            best = score
            best_info = {"step": step, "elapsed_s": round(time.time() - t0), "results": res,
                         "held_out_inline": {"450": vs, "1700": vl}}
            (LM if llama else M).save_model(m, os.path.join(out, "model.safetensors"), E.VOCAB_LAYOUT, a.model)
            log(f"saved checkpoint (min tier recall {100 * score:.1f}%)")
        return res, vs, vl

    m.train()
    while True:
        f = frac()
        if f >= 1.0:
            break
        lr = a.lr * min(1.0, (step + 1) / a.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, f))))
        for g in opt.param_groups:
            g["lr"] = lr
        if stage == 0 and (f >= a.stage0 or (acc_recent >= a.stage0_acc and not a.steps)):
            stage, acc_recent = 1, 0.0
            log(f"stage 1 (450-token episodes) from step {step}")
        if stage == 1 and (f >= a.phase_a or (acc_recent >= a.stage1_acc and not a.steps)):
            stage, acc_recent = 2, 0.0
            log(f"stage 2 (mixed 1700/450) from step {step}")
        if stage == 0:
            x, y, p = make_batch(160, 176, a.seed, idx[160], 2 * a.batch_short, 0.0, rng, max_pos)
            idx[160] += 2 * a.batch_short
        elif stage == 2 and rng.random() < a.long_share:
            x, y, p = make_batch(1700, 1760, a.seed, idx[1700], a.batch_long, 0.0, rng, max_pos)
            idx[1700] += a.batch_long
        else:
            x, y, p = make_batch(450, 480, a.seed, idx[450], a.batch_short, a.stretch, rng, max_pos)
            idx[450] += a.batch_short
        loss, c, n = loss_and_acc(m, x, y, p)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        step += 1
        stats["loss"] += loss.item()
        stats["c"] += c
        stats["n"] += n
        stats["tok"] += x.numel()
        stats["steps"] += 1
        now = time.time()
        if now - last_log >= 60:
            vs, vl = held_out_acc(m, val_short), held_out_acc(m, val_long)
            acc_recent = stats["c"] / max(1, stats["n"])
            recent_loss = stats["loss"] / max(1, stats["steps"])
            log(f"step {step} t {now - t0:.0f}s lr {lr:.2e} stage {stage} "
                f"loss {stats['loss'] / stats['steps']:.3f} train-acc {100 * stats['c'] / max(1, stats['n']):.1f}% "
                f"held-out 450 {100 * vs:.1f}% 1700 {100 * vl:.1f}% tok/s {stats['tok'] / (now - last_log):.0f} "
                f"seqs 160 {idx[160]} 450 {idx[450]} 1700 {idx[1700]}")
            history.append({"step": step, "t": round(now - t0), "loss": stats["loss"] / stats["steps"],
                            "held_out_450": vs, "held_out_1700": vl})
            stats = dict(loss=0.0, c=0, n=0, tok=0, steps=0)
            last_log = time.time()
            if min(vs, vl) >= a.target and stage == 2 and not a.steps and recent_loss <= a.target_loss:
                res, vs2, vl2 = full_eval("early-check")
                last_eval = time.time()
                if min(r["recall"] for r in res) >= a.target:
                    log("target reached: stopping early")
                    break
        if now - last_eval >= a.eval_every * 60 and stage == 2:
            full_eval("periodic")
            last_eval = time.time()
    res, vs, vl = full_eval("final")
    log(f"done: {step} steps in {time.time() - t0:.0f}s; sequences {idx}; "
        f"best checkpoint step {best_info['step']} (min tier recall {100 * best:.1f}%)")
    summary_path = os.path.join(out, "train_summary.json")
    previous = None
    if a.resume and os.path.exists(summary_path):
        with open(summary_path) as fprev:
            previous = json.load(fprev)
    with open(summary_path, "w") as fsum:
        json.dump({"previous_run": previous, "model": a.model, "config": cfg, "parameters": nparam, "args": vars(a), "steps": step,
                   "seconds": round(time.time() - t0), "sequences": {str(k): v for k, v in idx.items()},
                   "best": best_info, "history": history}, fsum, indent=1)


if __name__ == "__main__":
    main()

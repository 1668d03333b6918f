#!/usr/bin/env python3
"""End-to-end checkpoint tests of kshard-train (--save-dir, --resume,
--init-from, --export), launched like run_train.py launches (same launcher,
same per-rank exit codes, same token files).

  train_checkpoint.py --exe build/host/examples/train/kshard-train resume
  train_checkpoint.py ... export
  train_checkpoint.py ... async
  train_checkpoint.py ... bad

resume: (1) run A trains 6 steps straight; run B trains 3 steps with
  --save-dir, then `--resume DIR --steps 6` prints steps 4..6 with exactly A's
  printed losses and gradient norms (constant LR schedule, so B's shorter
  schedule, which the checkpoint keeps, gives the same rates; the warning
  about it is checked). (2) A cosine schedule with warmup: run B' saves at
  steps 3 and 6 (--save-every 3, each once); its step 6 is removed and the
  same command with --resume must print exactly A's steps 4..6. (3) The step-3
  checkpoint of 2 ranks resumed on 1 rank (--batch 8) and on 4 ranks as a 2x2
  mesh (--batch 2): the same global batches, losses within RESHARD_TOL
  relative of A's (the reductions add in another order). (4) --keep 2 leaves
  the newest two checkpoints; --resume on an empty directory starts fresh.
export: a 2-rank run with --val-data --eval-every --export model.safetensors
  (and --save-dir); `--eval-only --init-from model.safetensors` on 1 rank and
  `--init-from <save-dir>/step-6` on a 2x2 mesh print its final eval_loss
  within EVAL_TOL relative; --export-dtype bf16 writes BF16 tensors (read by
  Python's safetensors when it is installed).
async: --async-save (checkpoints written on a background thread): a run that
  saves at steps 3 and 6 prints the uninterrupted run's steps, its
  checkpoints are byte for byte those of the same run saving synchronously,
  the summary reports the blocked and background write times, and with step
  6 removed `--resume --async-save` prints the uninterrupted run's steps
  4..6. A write that fails on rank 1 (KSHARD_CHECKPOINT_TEST_FAULT=enospc),
  at a save during the run or at the last save (reported by the wait before
  exit), ends every rank with exit 2 and a message naming shard-00001.bin,
  and leaves no step-N or temporary directory of that save.
bad: bad checkpoint options and inputs end every rank with exit 2 and a
  message naming the problem (no hang): --resume without a path,
  --init-from with --resume, --export with --eval-only, --init-from a missing
  directory / missing or truncated safetensors file / truncated checkpoint.
"""
import argparse
import json
import os
import re
import shlex
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run_train as rt  # noqa: E402

# Printed losses have 6 decimals (~2e-7 relative at 4 nats); measured on the
# host at 2 -> 1 and 2 -> 2x2 ranks: see docs/CHECKPOINTS.md.
RESHARD_TOL = 1e-5
EVAL_TOL = 1e-6

MODEL = "--data @TRAIN@ --vocab 64 --layers 2 --width 32 --heads 2 --seq 16"
COSINE = "--lr-schedule cosine --warmup 2 --min-lr 3e-4 --weight-decay 0.1"


class Ctx:
    pass


def run_ok(a, argstr, np=None):
    """Launch; every rank must exit 0. Returns rank 0's stdout."""
    args = shlex.split(rt.substitute(a, argstr))
    if np is not None:
        args = [f"np={np}"] + args
    p, rcs = rt.launch(a, args)
    rt.show(p)
    ranks = {str(r) for r in range(a.last_np)}
    if set(rcs) != ranks or any(c != 0 for c in rcs.values()):
        raise rt.Failure(f"[{argstr}] exit codes {rcs}, expected 0 on ranks {sorted(ranks)}")
    return p.stdout


def steps_of(out):
    """{step: (loss text, grad_norm text)} of rank 0's step lines."""
    return {int(m.group(1)): (m.group(2), m.group(3))
            for m in re.finditer(r"^step\s+(\d+)/\d+\s+loss (\S+)\s+grad_norm (\S+)", out, re.M)}


def saves_of(out):
    return [int(x) for x in re.findall(r"^checkpoint saved \S+ step (\d+) bytes \d+ seconds",
                                       out, re.M)]


def expect(cond, msg):
    if not cond:
        raise rt.Failure(msg)


def same_steps(got, want, steps, what):
    for s in steps:
        expect(s in got, f"{what}: no step {s} line")
        expect(got[s] == want[s], f"{what}: step {s} printed loss/grad_norm {got[s]}, "
                                  f"the uninterrupted run {want[s]}")
    print(f"OK: {what}: steps {list(steps)} print exactly the uninterrupted run's "
          f"losses and gradient norms")


def close_steps(got, want, steps, tol, what):
    worst = 0.0
    for s in steps:
        expect(s in got, f"{what}: no step {s} line")
        x, y = float(got[s][0]), float(want[s][0])
        worst = max(worst, abs(x - y) / abs(y))
    expect(worst <= tol, f"{what}: losses {[got[s][0] for s in steps]} vs "
                         f"{[want[s][0] for s in steps]}: relative {worst:.2e} > {tol:g}")
    print(f"OK: {what}: steps {list(steps)} within {worst:.1e} relative (tolerance {tol:g})")


def ckpts(d):
    return sorted(n for n in os.listdir(d) if n.startswith("step-")) if os.path.isdir(d) else []


def test_resume(a):
    d = a.tmp
    # (1) The brief's case: 3 steps, then --resume --steps 6, constant schedule.
    base = f"{MODEL} --batch 4"
    A = steps_of(run_ok(a, f"{base} --steps 6"))
    expect(sorted(A) == list(range(1, 7)), f"run A printed steps {sorted(A)}")
    s1 = os.path.join(d, "s1")
    out = run_ok(a, f"{base} --steps 3 --save-dir {s1}")
    expect(saves_of(out) == [3], f"3-step run saved steps {saves_of(out)}, expected [3]")
    out = run_ok(a, f"{base} --steps 6 --save-dir {s1} --resume {s1}")
    expect(re.search(r"^resumed from \S+step-0000000003 step 3", out, re.M),
           "no 'resumed from .../step-0000000003 step 3' line")
    expect("warning: the checkpoint's LR schedule" in out,
           "no warning that the checkpoint's schedule (total 3) differs from --steps 6")
    got = steps_of(out)
    expect(sorted(got) == [4, 5, 6], f"resumed run printed steps {sorted(got)}, expected 4..6")
    same_steps(got, A, range(4, 7), "resume 3 -> 6 (constant LR)")
    expect(saves_of(out) == [6], f"resumed run saved {saves_of(out)}, expected [6]")

    # (2) Cosine with warmup: the interrupted run is the same command line.
    cos = f"{MODEL} --batch 4 --steps 6 {COSINE}"
    A2 = steps_of(run_ok(a, cos))
    s2 = os.path.join(d, "s2")
    out = run_ok(a, f"{cos} --save-dir {s2} --save-every 3")
    expect(saves_of(out) == [3, 6], f"--save-every 3 saved {saves_of(out)}, expected [3, 6] "
                                     "(the last step once)")
    same_steps(steps_of(out), A2, range(1, 7), "a run that saves")
    shutil.rmtree(os.path.join(s2, "step-0000000006"))
    s3 = os.path.join(d, "s3")
    shutil.copytree(s2, s3)  # step 3 only, for (3)
    out = run_ok(a, f"{cos} --save-dir {s2} --save-every 3 --resume {s2}")
    expect("warning:" not in out, "a warning although the command line is the same")
    expect(re.search(r"^resumed from \S+step-0000000003 step 3", out, re.M), "no resumed line")
    same_steps(steps_of(out), A2, range(4, 7), "resume after step 3 (cosine, warmup)")
    expect(saves_of(out) == [6], f"resumed run saved {saves_of(out)}, expected [6]")

    # (3) Another world size / mesh, same global batch (8 sequences per step).
    cos_nb = f"{MODEL} --steps 6 {COSINE}"
    for np, extra, what in ((1, "--batch 8", "2 -> 1 rank"),
                            (4, "--batch 2 --mesh 2x2", "2 -> 2x2 ranks")):
        s = os.path.join(d, f"s3_np{np}")
        shutil.copytree(s3, s)
        out = run_ok(a, f"{cos_nb} {extra} --save-dir {s} --resume {s}", np=np)
        expect(re.search(r"^note: the checkpoint was saved on 2 ranks", out, re.M),
               f"{what}: no note that the checkpoint was resharded")
        close_steps(steps_of(out), A2, range(4, 7), RESHARD_TOL, f"resume {what}")

    # (4) --keep, and --resume of an empty directory.
    s4 = os.path.join(d, "s4")
    out = run_ok(a, f"{base} --steps 4 --save-dir {s4} --save-every 1 --keep 2 --resume {s4}")
    expect("resume: no checkpoint in" in out, "no note that the resume starts fresh")
    expect(saves_of(out) == [1, 2, 3, 4], f"--save-every 1 saved {saves_of(out)}")
    expect(ckpts(s4) == ["step-0000000003", "step-0000000004"],
           f"--keep 2 left {ckpts(s4)}")
    same_steps(steps_of(out), A, range(1, 5), "--resume with no checkpoint starts fresh")
    print("OK: --keep 2 leaves the newest two")

    # (5) Delayed fp8 scaling: the amax histories are model state; a resumed
    # run scales (and so prints) exactly as the uninterrupted one. Without the
    # saved state step 4 would cast with fresh scales and print other losses.
    fp8 = f"{base} --recipe fp8-delayed --fp8-amax-history 4"
    A5 = steps_of(run_ok(a, f"{fp8} --steps 6"))
    s5 = os.path.join(d, "s5")
    run_ok(a, f"{fp8} --steps 3 --save-dir {s5}")
    with open(os.path.join(s5, "step-0000000003", "manifest.json")) as f:
        st = json.load(f).get("fp8_state")
    # 2 layers x 4 Linears x 3 operands (the head stays bf16): a 16-byte slot
    # of values each, 4 history entries each, position and flag.
    expect(st is not None and len(st) == 24 * 4 + 24 * 4 + 2,
           f"manifest fp8_state has {None if st is None else len(st)} values, expected 194")
    out = run_ok(a, f"{fp8} --steps 6 --save-dir {s5} --resume {s5}")
    same_steps(steps_of(out), A5, range(4, 7), "fp8-delayed resume 3 -> 6")


def test_export(a):
    d = a.tmp
    st = os.path.join(d, "model.safetensors")
    sd = os.path.join(d, "save")
    ev = "--val-data @VAL@ --eval-batches 4 --batch 4"
    out = run_ok(a, f"{MODEL} {ev} --eval-every 3 --steps 6 {COSINE} --export {st} "
                    f"--save-dir {sd}")
    evals = rt.eval_losses(out)
    expect(len(evals) == 2, f"{len(evals)} eval_loss lines, expected 2")
    expect(re.search(r"^exported \S+ step 6 dtype f32 bytes \d+", out, re.M), "no exported line")
    expect(re.search(r"^summary: checkpoints in \S+ \(newest \S+step-0000000006\)", out, re.M),
           "no 'summary: checkpoints in ... (newest .../step-0000000006)' line")
    expect(re.search(r"^summary: weights exported to \S+ \(f32\)", out, re.M),
           "no 'summary: weights exported to ...' line")
    final = evals[-1]
    step6 = os.path.join(sd, "step-0000000006")
    for np, src, extra, what in ((1, st, "", "safetensors on 1 rank"),
                                 (4, step6, "--mesh 2x2", "checkpoint step 6 on 2x2"),
                                 (2, st, "--recipe bf16", "safetensors under bf16 (ran)"),
                                 (2, step6, "resume", "--resume of checkpoint step 6"),
                                 (1, sd, "resume", "--resume of the save dir (newest)")):
        how = f"--resume {src}" if extra == "resume" else f"--init-from {src} {extra}"
        out = run_ok(a, f"{MODEL} {ev} --eval-only {how}", np=np)
        expect(re.search(r"^(initialised|resumed) from ", out, re.M),
               f"{what}: no 'initialised from' / 'resumed from' line")
        e = rt.eval_losses(out)
        expect(len(e) == 1, f"{what}: {len(e)} eval_loss lines")
        if "bf16" in extra:
            continue  # bf16 compute: another number; it must only run
        rel = abs(e[0] - final) / abs(final)
        expect(rel <= EVAL_TOL, f"{what}: eval_loss {e[0]} vs the trained run's {final}: "
                                f"relative {rel:.2e} > {EVAL_TOL:g}")
        print(f"OK: --init-from {what}: eval_loss {e[0]} = the trained run's {final} "
              f"(relative {rel:.1e}, tolerance {EVAL_TOL:g})")
    # Hugging Face's format: --export-hf after training, then --init-from the
    # folder (on other meshes) gives the trained run's eval_loss.
    for arch, flags in (("llama", "--arch llama --kv-heads 1 --rope-theta 500"),
                        ("gpt2", "--tie-embeddings")):
        hf = os.path.join(d, "hf-" + arch)
        out = run_ok(a, f"{MODEL} {flags} {ev} --eval-every 3 --steps 3 {COSINE} --export-hf {hf}")
        final = rt.eval_losses(out)[-1]
        # On 2x2 without the arch flags: --arch, --kv-heads, --rope-theta and
        # --tie-embeddings come from the folder's config.json.
        for np, extra in ((1, flags), (4, "--mesh 2x2")):
            out = run_ok(a, f"{MODEL} {ev} --eval-only --init-from {hf} {extra}", np=np)
            expect(re.search(r"^initialised from \S+ +\(Hugging Face ", out, re.M),
                   f"--init-from {hf}: no 'initialised from ... (Hugging Face ...)' line")
            e = rt.eval_losses(out)
            rel = abs(e[0] - final) / abs(final)
            expect(len(e) == 1 and rel <= EVAL_TOL,
                   f"--init-from {hf} on {np} ranks: eval_loss {e} vs the trained run's {final}")
            print(f"OK: --init-from a Hugging Face {arch} folder on {np} rank(s): eval_loss {e[0]} = "
                  f"the trained run's {final} (relative {rel:.1e})")
    # bf16 export, read by Python's own safetensors package when installed.
    bf = os.path.join(d, "model.bf16.safetensors")
    out = run_ok(a, f"{MODEL} --steps 1 --export {bf} --export-dtype bf16")
    expect(re.search(r"^exported \S+ step 1 dtype bf16", out, re.M), "no bf16 exported line")
    try:
        from safetensors import safe_open
    except ImportError:
        print("note: Python's safetensors is not installed; bf16 file not read back")
        return
    with safe_open(bf, framework="numpy") as f:
        keys = list(f.keys())
        meta = f.metadata()
    expect("layers.0.weight" in keys and "layers.4.weight" in keys, f"tensors {keys}")
    expect(meta.get("kshard.train.step") == "1", f"metadata {meta}")
    import json
    import struct
    with open(bf, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        header = json.loads(fh.read(n))
    dtypes = {v["dtype"] for k, v in header.items() if k != "__metadata__"}
    expect(dtypes == {"BF16"}, f"bf16 export has dtypes {dtypes}")
    print(f"OK: --export-dtype bf16: {len(keys)} BF16 tensors, step metadata, read by safetensors")


def same_dirs(x, y, what):
    fx, fy = sorted(os.listdir(x)), sorted(os.listdir(y))
    expect(fx == fy, f"{what}: files {fx} vs {fy}")
    for f in fx:
        with open(os.path.join(x, f), "rb") as g, open(os.path.join(y, f), "rb") as h:
            expect(g.read() == h.read(), f"{what}: {f} differs")
    print(f"OK: {what}: {len(fx)} files, byte for byte the same")


def test_async(a):
    d = a.tmp
    base = f"{MODEL} --batch 4 --steps 6"
    A = steps_of(run_ok(a, base))
    sa, ss = os.path.join(d, "async"), os.path.join(d, "sync")
    out = run_ok(a, f"{base} --save-dir {sa} --save-every 3 --async-save")
    expect(saves_of(out) == [3, 6], f"--async-save saved {saves_of(out)}, expected [3, 6]")
    same_steps(steps_of(out), A, range(1, 7), "a run that saves asynchronously")
    m = re.search(r"^summary: checkpoint: 2 saves \(async\), blocked (\S+) s, "
                  r"background write (\S+) s$", out, re.M)
    expect(m, "no 'summary: checkpoint: 2 saves (async), blocked X s, background write Y s' line")
    print(f"OK: async summary: blocked {m.group(1)} s, background write {m.group(2)} s")
    out = run_ok(a, f"{base} --save-dir {ss} --save-every 3")
    expect(re.search(r"^summary: checkpoint: 2 saves \(sync\), blocked \S+ s", out, re.M),
           "no 'summary: checkpoint: 2 saves (sync), blocked X s' line")
    for step in ("step-0000000003", "step-0000000006"):
        same_dirs(os.path.join(sa, step), os.path.join(ss, step), f"async vs sync {step}")
    expect(ckpts(sa) == ["step-0000000003", "step-0000000006"] and
           not [n for n in os.listdir(sa) if n.startswith(".")], f"{sa} holds {os.listdir(sa)}")
    shutil.rmtree(os.path.join(sa, "step-0000000006"))
    out = run_ok(a, f"{base} --save-dir {sa} --save-every 3 --async-save --resume {sa}")
    expect(re.search(r"^resumed from \S+step-0000000003 step 3", out, re.M), "no resumed line")
    same_steps(steps_of(out), A, range(4, 7), "--resume of an asynchronous checkpoint")
    expect(saves_of(out) == [6], f"resumed run saved {saves_of(out)}, expected [6]")

    # A failed background write: during the run (the save of step 3, found by
    # a later step) and at the last save (found by the wait before exit).
    a.expect_error = 2
    a.allow_steps = True
    for step in (3, 6):
        sf = os.path.join(d, f"fail{step}")
        rt.check_error(a, f"/.tmp-step-000000000{step}/shard-00001.bin::"
                          f"KSHARD_CHECKPOINT_TEST_FAULT=enospc:1:{step} {base} --save-dir {sf} "
                          f"--save-every 3 --async-save")
        left = sorted(os.listdir(sf)) if os.path.isdir(sf) else []
        want = [] if step == 3 else ["step-0000000003"]
        expect(left == want, f"after the failed save of step {step}, {sf} holds {left}, "
                             f"expected {want}")


def test_bad(a):
    d = a.tmp
    # Real files to damage: a safetensors export and a checkpoint of 1 step.
    good = os.path.join(d, "good.safetensors")
    sd = os.path.join(d, "save")
    run_ok(a, f"{MODEL} --steps 1 --export {good} --save-dir {sd}")
    trunc = os.path.join(d, "truncated.safetensors")
    size = os.path.getsize(good)
    with open(good, "rb") as f, open(trunc, "wb") as g:
        g.write(f.read(size // 2))
    # A Hugging Face folder of a Llama with 1 key/value head.
    hf = os.path.join(d, "hf")
    llama = "--arch llama --kv-heads 1"
    run_ok(a, f"{MODEL} {llama} --steps 1 --export-hf {hf}")
    hf_mistral = os.path.join(d, "hf-mistral")
    shutil.copytree(hf, hf_mistral)
    cfg = json.load(open(os.path.join(hf_mistral, "config.json")))
    cfg.update({"model_type": "mistral", "architectures": ["MistralForCausalLM"]})
    json.dump(cfg, open(os.path.join(hf_mistral, "config.json"), "w"))
    step = os.path.join(sd, "step-0000000001")
    shard = os.path.join(step, "shard-00001.bin")
    os.truncate(shard, os.path.getsize(shard) // 2)
    a.expect_error = 2
    a.allow_steps = False
    missing_dir = os.path.join(d, "no-such-run", "step-0000000001")
    missing_st = os.path.join(d, "missing.safetensors")
    cases = [
        "the required argument for option '--resume' is missing::--resume",
        "--save-every without --save-dir::--save-every 2",
        f"--init-from with --resume::--resume {sd} --init-from {good}",
        f"--export with --eval-only::--eval-only --val-data @VAL@ --export {good}",
        "--export-dtype 'f16' is unknown::--export f.safetensors --export-dtype f16",
        f"{missing_dir}::{MODEL} --init-from {missing_dir}",
        f"{missing_st}::{MODEL} --init-from {missing_st}",
        f"{trunc}::{MODEL} --init-from {trunc}",
        f"{shard}::{MODEL} --init-from {step}",
        f"{shard}::{MODEL} --resume {sd}",
        f"{shard}::{MODEL} --resume {step}",
        f"num_key_value_heads is 1 but the model's is 2::{MODEL} --arch llama --kv-heads 2 --init-from {hf}",
        f"model_type is llama but the model's is gpt2::{MODEL} --arch gpt2 --tie-embeddings --init-from {hf}",
        f"model_type is 'mistral'::{MODEL} {llama} --init-from {hf_mistral}",
    ]
    failures = []
    for c in cases:
        try:
            rt.check_error(a, c)
        except rt.Failure as e:
            failures.append(str(e))
    if failures:
        raise rt.Failure("; ".join(failures))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--launcher", default=os.path.join(HERE, "..", "harness", "kshard-launch"))
    ap.add_argument("--launcher-arg", action="append", default=[])
    ap.add_argument("--exe", required=True)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--keep-tmp", action="store_true")
    ap.add_argument("scenario", choices=["resume", "export", "async", "bad"])
    a = ap.parse_args()
    a.tmp = tempfile.mkdtemp(prefix=f"kshard_ckpt_{a.scenario}_")
    a.files = rt.write_token_files(a.tmp)
    try:
        {"resume": test_resume, "export": test_export, "async": test_async,
         "bad": test_bad}[a.scenario](a)
    except rt.Failure as e:
        print(f"FAIL: {e}")
        return 1
    finally:
        if not a.keep_tmp:
            shutil.rmtree(a.tmp, ignore_errors=True)
    print(f"PASS: {a.scenario}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

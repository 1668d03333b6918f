#!/usr/bin/env python3
"""Test driver for kshard-train: launches it under the MPI launcher and checks,
per rank, what it returned and printed. Launches go through kshard-launch
(tests/harness), which lays out the site's launcher command line
(--launcher-arg=--mpiexec=srun, ...) and adds Open MPI's own flags only for
Open MPI.

Each rank runs inside a small shell wrapper (rank_exit) that prints
"KSHARD_RANK_EXIT rank=<r> rc=<code>" after the program ends, so the driver
sees every rank's exit code (mpiexec alone reports one code for the job). The
first error case is also launched without the wrapper, to check the code
mpiexec itself returns.

  run_train.py --launcher-arg=--mpiexec=mpiexec --exe build/h5/examples/train/kshard-train --np 2 \
      --expect-learning --run=                       # default run: loss must fall
  run_train.py ... --expect-steps 3 "--run=--mesh 1x2 --recipe bf16 --accum 2 --steps 3"
  run_train.py ... --expect-error 2 "--case=--width 0 is out of range::--width 0"

Success runs (--run): every rank exits 0, rank 0 prints a step line per step
and the summary with finite losses; with --expect-learning the last loss must
be well below the first and below the uniform guess ln(vocab).
With --expect-same-losses TOL, every run's per-step losses must match the
first run's (a leading np=N word of ARGS sets that run's rank count).
Error cases (--case NEEDLE::ARGS; leading NAME=VALUE words of ARGS set the environment): every rank exits with the given code and
every rank's stderr line "[rank r] kshard-train: error: ..." contains NEEDLE.
Abort cases (--abort-case NEEDLE::ARGS): only some ranks fail; the job must
end with a non-zero code and the failing rank's message, instead of hanging.
A launch that runs past --timeout is a failure (a hang), not a wait.

Stress mode (--stress N): the error cases are launched N times in all (round
robin), each checked as above, with OMP_NUM_THREADS=2 (unless set) and one
core kept busy by a spinning process: the conditions under which a rank's
error line once went missing from the merged output (issue 23: another
rank's piecewise-written line was still open when it arrived). Prints how
many launches failed and how.

Token files (--token-files): the driver writes, in a temporary directory,
little-endian uint16 token files with Python and replaces these words in every
--run/--case: @TRAIN@ (20000 tokens of a learnable stream over vocab 64),
@VAL@ (3000 tokens of the same stream, another seed), @TRAIN32@ and @VAL32@
(the same as uint32), @ODD@ (an odd number of bytes), @SHORT@ (10 tokens), @BIGID@
(@TRAIN@ with a few ids >= 64), @MISSING@ (no such file).
--expect-eval N: rank 0 prints N finite "eval_loss <value>" lines;
--expect-same-eval TOL: every run's eval losses equal the first run's within
TOL (relative); --allow-steps: error cases may train first (divergence).
--sample runs: rank 0 prints the generated ids; --expect-sample FRAC: at least
FRAC of them are the Markov chain's likely successor; --expect-same-samples:
every run generates the first run's tokens.
"""
import array
import random
import shutil
import tempfile
import argparse
import math
import os
import re
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def launch(a, args, wrap=True):
    env = dict(os.environ)
    np = a.np
    # A leading np=N word launches N ranks instead of --np.
    if args and re.match(r"^np=\d+$", args[0]):
        np = int(args.pop(0)[3:])
    # Leading NAME=VALUE words set the environment of the launch.
    while args and re.match(r"^[A-Z_][A-Z0-9_]*=", args[0]):
        k, v = args.pop(0).split("=", 1)
        env[k] = v
    cmd = [a.launcher, "--np", str(np), *a.launcher_arg, "--"]
    if wrap:
        env["KSHARD_RANK_EXE"] = a.exe
        cmd += [os.path.join(HERE, "rank_exit"), *args]
    else:
        cmd += [a.exe, *args]
    print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    a.last_np = np
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           errors="replace", timeout=a.timeout, env=env)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        print(out)
        raise Failure(f"launch ran past {a.timeout} s (a hang?)")
    rcs = {}
    for m in re.finditer(r"KSHARD_RANK_EXIT rank=(\S+) rc=(\d+)", p.stdout):
        rcs[m.group(1)] = int(m.group(2))
    return p, rcs


class Failure(Exception):
    pass


def show(p):
    sys.stdout.write(p.stdout)
    if p.stderr:
        sys.stdout.write("--- stderr ---\n" + p.stderr)
    sys.stdout.flush()


def write_token_files(d):
    """The token files of --token-files, written here with Python alone."""
    def stream(n, seed):
        r = random.Random(seed)
        t, cur = [], 0
        for _ in range(n):
            cur = (cur * 3 + 1) % 64 if r.random() < 0.9 else r.randrange(64)
            t.append(cur)
        return t
    def write(name, tokens, code="H", extra=b""):
        path = os.path.join(d, name)
        with open(path, "wb") as f:
            a = array.array(code, tokens)
            if sys.byteorder != "little":
                a.byteswap()
            f.write(a.tobytes() + extra)
        return path
    train = stream(20000, 1)
    big = list(train)
    for i in (5000, 10000, 15000, 19000):
        big[i] = 64
    val = stream(3000, 2)
    return {"@TRAIN@": write("train.bin", train), "@VAL@": write("val.bin", val),
            "@VAL32@": write("val32.bin", val, "I"),
            "@TRAIN32@": write("train32.bin", train, "I"),
            "@ODD@": write("odd.bin", train[:100], extra=b"\x01"),
            "@SHORT@": write("short.bin", train[:10]), "@BIGID@": write("bigid.bin", big),
            "@MISSING@": os.path.join(d, "missing.bin")}


def substitute(a, text):
    for k, v in a.files.items():
        text = text.replace(k, v)
    return text


def eval_losses(out):
    return [float(x) for x in re.findall(r"^eval_loss (\S+)", out, re.M)]


def check_run(a, argstr):
    args = shlex.split(substitute(a, argstr))
    p, rcs = launch(a, args)
    show(p)
    ranks = {str(r) for r in range(a.last_np)}
    if set(rcs) != ranks:
        raise Failure(f"exit codes seen for ranks {sorted(rcs)}, expected {sorted(ranks)} "
                      f"(mpiexec rc {p.returncode})")
    bad = {r: c for r, c in rcs.items() if c != 0}
    if bad:
        raise Failure(f"ranks exited with {bad}")
    evals = eval_losses(p.stdout)
    if not all(math.isfinite(x) for x in evals):
        raise Failure(f"non-finite eval_loss: {evals}")
    if a.expect_eval is not None and len(evals) != a.expect_eval:
        raise Failure(f"{len(evals)} eval_loss lines, expected {a.expect_eval}")
    check_sample(a, p, argstr, "--sample" in args)
    if "--eval-only" in args:
        if re.search(r"^step ", p.stdout, re.M):
            raise Failure("--eval-only trained")
        a.evals.append((argstr, evals))
        return []
    a.evals.append((argstr, evals))
    steps = re.findall(r"^step\s+(\d+)/(\d+)\s+loss (\S+)", p.stdout, re.M)
    if not steps:
        raise Failure("no step lines on rank 0")
    if a.expect_steps is not None and len(steps) != a.expect_steps:
        raise Failure(f"{len(steps)} step lines, expected {a.expect_steps}")
    m = re.search(r"^summary: first_loss=(\S+) last_loss=(\S+) \(uniform (\S+), floor (\S+)\)",
                  p.stdout, re.M)
    if not m:
        raise Failure("no summary line with first_loss/last_loss")
    first, last, uniform, floor = (float(x) for x in m.groups())
    if not (math.isfinite(first) and math.isfinite(last)):
        raise Failure(f"non-finite loss: first {first}, last {last}")
    for word in ("tokens/s mean", "persistent per rank", "ZeRO-3 bound", "peak per rank"):
        if word not in p.stdout:
            raise Failure(f"summary lacks '{word}'")
    if a.expect_learning:
        # "Clearly below": at most 60% of the first loss and at least 1 nat
        # under the uniform guess (the task's floor is 0.5 nats).
        if not (last < 0.6 * first and last < uniform - 1.0):
            raise Failure(f"loss did not fall enough: first {first:.4f}, last {last:.4f} "
                          f"(uniform {uniform:.3f}, floor {floor:.3f})")
        print(f"OK: loss {first:.4f} -> {last:.4f} (uniform {uniform:.3f}, floor {floor:.3f})")
    return [float(x[2]) for x in steps]


def check_sample(a, p, argstr, asked):
    """--sample N: rank 0 prints the N generated ids, and on the Markov task
    how many follow the chain; --expect-sample FRAC: at least FRAC of them
    are the chain's likely successor (a greedy sample of a model that learnt
    the chain takes it at every step)."""
    m = re.search(r"^sample: (\d+) tokens after a prompt of \d+ \([^)]*\): (\S+)$", p.stdout, re.M)
    if not asked:
        if m:
            raise Failure("a sample line without --sample")
        return
    if not m:
        raise Failure("no 'sample: N tokens ...' line")
    ids = [int(x) for x in m.group(2).split(",")]
    if len(ids) != int(m.group(1)):
        raise Failure(f"sample line has {len(ids)} ids, says {m.group(1)}")
    a.samples.append((argstr, ids))
    if "--prompt " in argstr and not re.search(r"^sample text: .*$", p.stdout, re.M):
        raise Failure("a text prompt, but no 'sample text:' line")
    if a.expect_sample is not None:
        c = re.search(r"^sample: the Markov chain's likely successor (\d+) of (\d+)", p.stdout, re.M)
        if not c:
            raise Failure("no Markov agreement line after the sample")
        likely, n = int(c.group(1)), int(c.group(2))
        if likely < a.expect_sample * n:
            raise Failure(f"sample follows the chain's likely successor {likely} of {n} times, "
                          f"expected at least {a.expect_sample:g} of them")
        print(f"OK: [{argstr}] sample takes the likely successor {likely} of {n} times")


def check_error(a, case, plain=False):
    if "::" not in case:
        raise Failure(f"--case '{case}' is not NEEDLE::ARGS")
    needle, argstr = substitute(a, case).split("::", 1)
    p, rcs = launch(a, shlex.split(argstr))
    show(p)
    ranks = {str(r) for r in range(a.np)}
    if set(rcs) != ranks:
        raise Failure(f"[{argstr}] exit codes seen for ranks {sorted(rcs)}, expected all of "
                      f"{sorted(ranks)}")
    wrong = {r: c for r, c in rcs.items() if c != a.expect_error}
    if wrong:
        raise Failure(f"[{argstr}] ranks exited with {wrong}, expected {a.expect_error} on all")
    for r in sorted(ranks):
        lines = [l for l in p.stderr.splitlines() if l.startswith(f"[rank {r}] kshard-train: error:")]
        if not lines:
            raise Failure(f"[{argstr}] rank {r} printed no '[rank {r}] kshard-train: error:' line")
        if not any(needle in l for l in lines):
            raise Failure(f"[{argstr}] rank {r}'s message does not name the problem "
                          f"('{needle}'): {lines}")
    if not a.allow_steps and re.search(r"^step ", p.stdout, re.M):
        raise Failure(f"[{argstr}] training started despite the bad option")
    print(f"OK: [{argstr}] -> exit {a.expect_error} on every rank, message names '{needle}'")
    if plain:
        p, _ = launch(a, shlex.split(argstr), wrap=False)
        if p.returncode != a.expect_error:
            show(p)
            raise Failure(f"[{argstr}] mpiexec returned {p.returncode}, expected {a.expect_error}")
        print(f"OK: [{argstr}] -> mpiexec itself returns {a.expect_error}")


def stress(a):
    """--stress N: the error cases again and again on a busy machine."""
    env_threads = "OMP_NUM_THREADS" in os.environ
    if not env_threads:
        os.environ["OMP_NUM_THREADS"] = "2"
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    failures = []
    t0 = time.monotonic()
    try:
        for i in range(a.stress):
            case = a.case[i % len(a.case)]
            try:
                check_error(a, case)
            except Failure as e:
                failures.append(f"launch {i + 1}: {e}")
    finally:
        spinner.kill()
        spinner.wait()
        if not env_threads:
            del os.environ["OMP_NUM_THREADS"]
    print(f"stress: {a.stress} launches of {len(a.case)} error case(s) with "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '2')} and a busy core in "
          f"{time.monotonic() - t0:.0f} s: {len(failures)} failed")
    return failures


def check_abort(a, case):
    """Only some ranks fail: the job must end (abort), not hang."""
    needle, argstr = case.split("::", 1)
    t0 = time.monotonic()
    p, rcs = launch(a, shlex.split(argstr), wrap=False)
    took = time.monotonic() - t0
    show(p)
    if p.returncode == 0:
        raise Failure(f"[{argstr}] mpiexec returned 0 although a rank failed")
    if needle not in p.stderr:
        raise Failure(f"[{argstr}] no message naming '{needle}'")
    if "aborting the job so that no rank hangs" not in p.stderr:
        raise Failure(f"[{argstr}] the failing rank did not say that it aborts the job")
    print(f"OK: [{argstr}] -> job aborted after {took:.1f} s (mpiexec rc {p.returncode})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--launcher", default=os.path.join(HERE, "..", "harness", "kshard-launch"),
                    help="kshard-launch (default: the source tree's)")
    ap.add_argument("--launcher-arg", action="append", default=[],
                    help="an option of kshard-launch, e.g. --launcher-arg=--mpiexec=srun")
    ap.add_argument("--mpiexec", help="shorthand for --launcher-arg=--mpiexec=PATH")
    ap.add_argument("--exe", required=True)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--run", action="append", default=[], help="arguments of a successful run")
    ap.add_argument("--expect-learning", action="store_true")
    ap.add_argument("--expect-steps", type=int)
    ap.add_argument("--expect-same-losses", type=float, metavar="TOL",
                    help="every --run's step losses must equal the first run's within TOL")
    ap.add_argument("--expect-error", type=int)
    ap.add_argument("--case", action="append", default=[], help="NEEDLE::ARGS of a bad run")
    ap.add_argument("--abort-case", action="append", default=[],
                    help="NEEDLE::ARGS of a run in which only some ranks fail")
    ap.add_argument("--token-files", action="store_true",
                    help="write token files and substitute @TRAIN@, @VAL@, ... in the runs")
    ap.add_argument("--expect-eval", type=int, help="number of eval_loss lines of each run")
    ap.add_argument("--expect-same-eval", type=float, metavar="TOL",
                    help="every run's eval losses equal the first run's within TOL (relative)")
    ap.add_argument("--stress", type=int, metavar="N",
                    help="launch the --case runs N times in all on a busy core (see above)")
    ap.add_argument("--expect-sample", type=float, metavar="FRAC",
                    help="--sample runs: at least FRAC of the tokens are the Markov chain's "
                         "likely successor")
    ap.add_argument("--expect-same-samples", action="store_true",
                    help="every --sample run generates the first run's tokens")
    ap.add_argument("--allow-steps", action="store_true",
                    help="error cases may print step lines (they fail while training)")
    a = ap.parse_args()
    a.files, a.evals, a.samples = {}, [], []
    tmp = None
    if a.token_files:
        tmp = tempfile.mkdtemp(prefix="kshard_run_train_")
        a.files = write_token_files(tmp)
    try:
        return run_all(a, ap)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def run_all(a, ap):
    if a.mpiexec:
        a.launcher_arg.append(f"--mpiexec={a.mpiexec}")
    if not a.run and not a.case and not a.abort_case:
        ap.error("nothing to run: give --run and/or --case")
    if a.case and a.expect_error is None:
        ap.error("--case needs --expect-error CODE")
    if a.stress:
        if not a.case or a.run or a.abort_case:
            ap.error("--stress takes --case runs only")
        failures = stress(a)
        for f in failures:
            print("FAIL: " + f)
        return 1 if failures else 0
    failures = []
    curves = []
    for r in a.run:
        try:
            curves.append((r, check_run(a, r)))
        except Failure as e:
            failures.append(f"run [{r}]: {e}")
    if a.expect_same_losses is not None and len(curves) == len(a.run):
        ref_args, ref = curves[0]
        for args, c in curves[1:]:
            diff = max((abs(x - y) for x, y in zip(ref, c)), default=0.0)
            if len(c) != len(ref) or diff > a.expect_same_losses:
                failures.append(f"run [{args}] losses {c} differ from [{ref_args}] {ref} "
                                f"by up to {diff:.2e} (tolerance {a.expect_same_losses:g})")
            else:
                print(f"OK: [{args}] step losses match [{ref_args}] within {diff:.1e}")
    if a.expect_same_eval is not None and len(a.evals) == len(a.run):
        ref_args, ref = a.evals[0]
        for args, e in a.evals[1:]:
            diff = max((abs(x - y) / abs(y) for x, y in zip(e, ref)), default=0.0)
            if len(e) != len(ref) or not ref or diff > a.expect_same_eval:
                failures.append(f"run [{args}] eval losses {e} differ from [{ref_args}] {ref} "
                                f"(relative {diff:.2e}, tolerance {a.expect_same_eval:g})")
            else:
                print(f"OK: [{args}] eval losses match [{ref_args}] within {diff:.1e} relative")
    if a.expect_same_samples and len(a.samples) == len(a.run):
        ref_args, ref = a.samples[0]
        for args, ids in a.samples[1:]:
            if ids != ref:
                failures.append(f"run [{args}] sampled {ids}, [{ref_args}] {ref}")
            else:
                print(f"OK: [{args}] samples the same {len(ids)} tokens as [{ref_args}]")
    for i, c in enumerate(a.case):
        try:
            check_error(a, c, plain=i == 0)
        except Failure as e:
            failures.append(str(e))
    for c in a.abort_case:
        try:
            check_abort(a, c)
        except Failure as e:
            failures.append(str(e))
    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

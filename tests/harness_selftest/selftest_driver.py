#!/usr/bin/env python3
"""Drives the harness self-test suites and asserts on what they print and return.

Each suite is run exactly as CTest runs real suites (kshard-run-suite, one
mpiexec launch); the assertions below are the harness' contract:
  * a failure on one rank fails the test on every rank, the suite exits
    non-zero, and rank 0's summary names the test and the failing rank;
  * a hang is ended by the watchdog within its timeout, naming the test and
    each rank's last collective;
  * a rank that dies ends the launch promptly, naming the test it was in;
  * expected failures and skips keep the suite green;
  * a filter that matches no test is an error, not a silent pass;
  * a suite launched at a world size it does not declare runs no case, and
    every rank says so once.
"""
import argparse
import subprocess
import sys
import time

failures = []


def check(cond, what, output=""):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)
        if output:
            print("---- output ----\n" + output[-4000:] + "\n----------------")


LAUNCHER_ARGS = []  # the site's launcher options (--mpiexec=..., ...), from CMake


def run(launcher, bindir, logs, suite, np=2, extra=(), timeout=120):
    cmd = [launcher, "--np", str(np), *LAUNCHER_ARGS, "--logs", logs, "--",
           f"{bindir}/selftest_{suite}", *extra]
    t0 = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout, time.monotonic() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--bindir", required=True)
    ap.add_argument("--logs", required=True)
    ap.add_argument("--launcher-arg", action="append", default=[],
                    help="an option of kshard-run-suite, e.g. --launcher-arg=--mpiexec=srun")
    a = ap.parse_args()
    LAUNCHER_ARGS.extend(a.launcher_arg)

    rc, out, _ = run(a.launcher, a.bindir, a.logs, "one_rank_fails")
    check(rc != 0, "one_rank_fails: suite exits non-zero", out)
    check("FAILED  selftest/plain_check_fails_on_rank_1  on ranks [1]" in out,
          "one_rank_fails: summary names the plain check and rank 1", out)
    check("FAILED  selftest/collective_check_fails_on_rank_1  on ranks [1]" in out,
          "one_rank_fails: summary names the collective check and rank 1", out)
    check("FAILED  selftest/throws_on_rank_0  on ranks [0]" in out,
          "one_rank_fails: an exception on rank 0 is named", out)
    check("FAILED  selftest/leaks_memory_on_rank_1  on ranks [1]" in out and
          "'deliberately_leaked' 4000 B" in out,
          "one_rank_fails: a leaked View is caught, with its label", out)
    check("passes_after_failures" not in out.split("summary")[-1].split("FAILED")[-1] or
          "FAILED  selftest/passes_after_failures" not in out,
          "one_rank_fails: later tests still pass", out)
    check("failing it here too" in out,
          "one_rank_fails: ranks that passed report the other ranks' failure", out)

    rc, out, wall = run(a.launcher, a.bindir, a.logs, "hang")
    check(rc == 124, f"hang: watchdog exit code 124 (got {rc})", out)
    check(wall < 30, f"hang: launch ended within 30 s of a 3 s timeout (took {wall:.1f} s)", out)
    check("rank 0: test 'selftest/rank_1_skips_all_gather' exceeded its timeout of 3.0 s" in out,
          "hang: rank 0's watchdog names the test", out)
    check("all_gather 16 B f32 IN FLIGHT" in out, "hang: the stuck collective is named", out)
    check("rank 1: test 'selftest/rank_1_skips_all_gather'" in out,
          "hang: rank 1 (in a collective check) reports too", out)
    check("never_reached" not in out, "hang: nothing runs after the hung test", out)

    rc, out, wall = run(a.launcher, a.bindir, a.logs, "rank_dies")
    check(rc != 0, "rank_dies: suite exits non-zero", out)
    check(wall < 20, f"rank_dies: launch ended promptly, well before the 30 s test timeout "
          f"(took {wall:.1f} s)", out)
    check("rank 1: running selftest/rank_1_exits" in out,
          "rank_dies: the dead rank's test is named", out)

    rc, out, _ = run(a.launcher, a.bindir, a.logs, "expected_and_skipped")
    check(rc == 0, f"expected_and_skipped: suite passes (rc {rc})", out)
    check("XFAIL   selftest/expected_failure_on_rank_1  on ranks [1]" in out,
          "expected_and_skipped: expected failure reported as XFAIL", out)
    check("SKIP selftest/mesh_cases/_2: mesh [3] does not fit 2 ranks" in out,
          "expected_and_skipped: a mesh that does not fit is skipped with its reason", out)
    check("2 skipped" in out, "expected_and_skipped: the summary counts the skips", out)
    # 2 plain cases + 4 mesh cases + one case per rank (delayed dataset, 2 ranks).
    check("on 2 ranks: 8 test cases" in out,
          "expected_and_skipped: the delayed dataset has one case per rank", out)

    rc, out, _ = run(a.launcher, a.bindir, a.logs, "expected_and_skipped",
                     extra=["--run_test=no_such_test"])
    check(rc != 0, f"empty filter: non-zero exit (rc {rc})", out)

    rc, out, _ = run(a.launcher, a.bindir, a.logs, "world_sizes", np=2)
    check(rc != 0, f"world_sizes at 2 ranks: non-zero exit (rc {rc})", out)
    for r in (0, 1):
        line = (f"[rank {r}] selftest_world_sizes: this suite runs at 1 or 3 ranks "
                f"(KSHARD_SUITE_WORLD_SIZES), launched at 2; no test case was run")
        check(out.count(line) == 1, f"world_sizes at 2 ranks: rank {r} says so once", out)
    check("summary of" not in out,
          "world_sizes at 2 ranks: no case ran", out)
    rc, out, _ = run(a.launcher, a.bindir, a.logs, "world_sizes", np=1)
    check(rc == 0 and "1 test cases, 0 failed" in out, f"world_sizes at 1 rank: runs (rc {rc})", out)

    print(f"{len(failures)} failed" if failures else "all harness self-checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

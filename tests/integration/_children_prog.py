"""The program of test_subprocesses.py: a parent that runs children of every kind that
--subprocesses follows (os.fork, multiprocessing fork / spawn / forkserver, a spawn Pool
of 2, subprocess running python -c), each child running one task `work` that sleeps and
spins known amounts and printing, as one JSON line, its pid and what it measured itself
with perf_counter: {"tag", "pid", "slept_s", "spun_s"}. The parent does the same (tag
"parent") after its children have ended."""
import asyncio
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


async def work(sleep_s, spin_s):
    t0 = time.perf_counter()
    await asyncio.sleep(sleep_s)
    t1 = time.perf_counter()
    while time.perf_counter() - t1 < spin_s:
        pass
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


async def child_main(tag, sleep_s, spin_s):
    slept, spun = await asyncio.create_task(work(sleep_s, spin_s))
    # One write: the Pool's two workers print at the same time (print writes the line and
    # its newline apart when stdout is unbuffered).
    sys.stdout.write(json.dumps({"tag": tag, "pid": os.getpid(), "slept_s": slept, "spun_s": spun}) + "\n")
    sys.stdout.flush()


def run(tag, sleep_s=0.03, spin_s=0.05):
    asyncio.run(child_main(tag, sleep_s, spin_s))


def main():
    pid = os.fork()
    if pid == 0:
        run("os.fork")
        sys.exit(0)
    os.waitpid(pid, 0)
    for method in ("fork", "spawn", "forkserver"):
        p = mp.get_context(method).Process(target=run, args=(f"mp-{method}",))
        p.start()
        p.join()
    with mp.get_context("spawn").Pool(2) as pool:
        pool.map(run, ["pool-a", "pool-b"])
    code = f"import sys; sys.path.insert(0, {HERE!r}); import _children_prog; _children_prog.run('subprocess')"
    subprocess.run([sys.executable, "-c", code], check=True)
    run("parent")


if __name__ == "__main__":
    main()

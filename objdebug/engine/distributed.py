"""Scale out on MindSpore's own launcher: `objdebug run --workers N` runs N workers through msrun.

Design (see docs/distributed.md):

- Every worker loads the target once and runs the whole pipeline. `Engine.evaluate` (the per-sample
  objective over data rows, the bulk of align, correlate and decompose) forms the same batches in
  every worker, evaluates the batches whose index i satisfies `i % world == rank`, and combines the
  per-sample rows with one `AllReduce(SUM)` into a zero buffer indexed by global row: each row is
  non-zero on exactly one rank, so the sum is exact and every worker holds the same numbers as a
  single process (same shapes, same graphs, same inputs). MindSpore 2.10's CPU backend (mccl)
  supports SUM only, which is all this needs.
- Everything else (gradients, stress probes) is small and runs identically in every worker, so
  every worker reaches the same findings; rank 0 alone renders and writes reports.
- A failure in one worker's share of an evaluation is announced through the same collective
  (an error flag beside the data), so all workers raise together instead of one of them waiting
  forever in the next collective.
- The launcher (`launch`) starts `msrun` with a temporary log directory and a result directory
  (`OBJDEBUG_WORKER_DIR`): each worker records its exit code and one-line message there, rank 0 its
  terminal report. The launcher prints rank 0's report, or the failing worker's message, and
  removes the directories unless a worker failed (then their path is shown).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from objdebug.core.errors import EXIT_INPUT_ERROR, EXIT_INTERNAL_ERROR, InputError

WORKER_DIR_ENV = "OBJDEBUG_WORKER_DIR"
LAUNCHER_ENV = "OBJDEBUG_LAUNCHER"  # the launcher's pid, in every process msrun starts


# --------------------------------------------------------------------------- inside a worker
def under_msrun() -> bool:
    """True in a process that msrun started as one of several workers."""
    return os.environ.get("MS_ROLE") == "MS_WORKER" and int(os.environ.get("MS_WORKER_NUM", "1") or 1) > 1


def serve_if_scheduler() -> None:
    """msrun runs the command once more as its scheduler (MS_ROLE=MS_SCHED): that process must only
    build the cluster. `init()` serves the workers and ends the process when they are done.
    Every process msrun starts (workers too) is first tied to the launcher (`tie_to_launcher`)."""
    tie_to_launcher()
    if os.environ.get("MS_ROLE") != "MS_SCHED":
        return
    from mindspore.communication import init

    init()
    sys.exit(0)


@dataclass
class World:
    """This process's place: rank 0 of 1 outside msrun."""

    rank: int = 0
    size: int = 1

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def allreduce_sum(self, array: np.ndarray) -> np.ndarray:
        """Element-wise sum over all workers (float32 on the wire; identity for one process)."""
        if not self.distributed:
            return array
        import mindspore as ms
        from mindspore import ops

        out = ops.AllReduce(ops.ReduceOp.SUM)(ms.Tensor(np.ascontiguousarray(array, np.float32)))
        return out.asnumpy()

    def to_dict(self) -> dict[str, int]:
        return {"rank": self.rank, "size": self.size}


_world: World | None = None


def world() -> World:
    """The process's World; under msrun the collective backend is initialised once (after the
    device is set: `init()` picks mccl on CPU, nccl on GPU, hccl on Ascend)."""
    global _world
    if _world is None:
        if under_msrun():
            from mindspore.communication import get_group_size, get_rank, init

            try:
                init()
            except Exception as exc:  # the cluster could not be built: say so in one line
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise InputError(f"For '--workers', the MindSpore cluster could not be initialised: "
                                 f"{first}") from None
            _world = World(rank=int(get_rank()), size=int(get_group_size()))
        else:
            _world = World()
    return _world


def shard_and_combine(n_rows: int, width_hint: int, batches: list, evaluate_batch) -> np.ndarray | None:
    """Evaluate this worker's share of `batches` and combine all workers' rows.

    `batches[i]` is a list of global row indices; `evaluate_batch(i)` returns float64[len(rows), K].
    Returns float64[n_rows, K] in every worker, or None outside a distributed run (the caller then
    evaluates every batch itself). A worker whose share raised makes every worker raise.
    """
    w = world()
    if not w.distributed:
        return None
    mine: dict[int, np.ndarray] = {}
    error = ""
    try:
        for i, rows in enumerate(batches):
            if i % w.size == w.rank:
                mine[i] = evaluate_batch(i)
    except Exception as exc:  # noqa: BLE001 - re-raised below, in every worker
        error = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
    k = next((int(v.shape[1]) for v in mine.values()), 0)
    # header: [K seen by a worker with results, workers with results, workers that failed]
    header = w.allreduce_sum(np.array([k, 1.0 if mine else 0.0, 1.0 if error else 0.0], np.float32))
    if header[2] > 0:
        raise RuntimeError(f"evaluation failed in {int(header[2])} of {w.size} workers"
                           + (f" (rank {w.rank}: {error})" if error else ""))
    k = int(round(header[0] / max(header[1], 1.0))) or width_hint
    buf = np.zeros((n_rows, k), np.float32)
    for i, values in mine.items():
        buf[batches[i]] = values
    return w.allreduce_sum(buf).astype(np.float64)


def record_exit(code: int, message: str = "", report_text: str | None = None,
                staged: list[tuple[str, str]] | None = None) -> None:
    """In a launched worker: leave the exit code, the one-line message and (rank 0) the report,
    and the report files rank 0 wrote as temporaries (`staged`: (temporary, path) pairs) that the
    launcher renames once the whole run ended well: a cancelled or killed run commits none."""
    folder = os.environ.get(WORKER_DIR_ENV)
    if not folder:
        return
    rank = os.environ.get("RANK_ID", "0")
    record = {"rank": int(rank), "code": int(code), "message": message, "staged": staged or []}
    if report_text is not None:
        Path(folder, f"rank_{rank}.out").write_text(report_text, encoding="utf-8")
    # whole or absent: the launcher may read it at any moment (a signal, a time-out)
    tmp = Path(folder, f".rank_{rank}.json.tmp")
    tmp.write_text(json.dumps(record), encoding="utf-8")
    os.replace(tmp, Path(folder, f"rank_{rank}.json"))


def launched() -> bool:
    """True in a worker that objdebug's launcher started (it collects the worker's records and
    commits rank 0's reports), False under a msrun the user started."""
    return bool(os.environ.get(WORKER_DIR_ENV))


def tie_to_launcher() -> None:
    """In every process msrun starts (workers, scheduler): die with the parent (msrun, which dies
    with objdebug's launcher), and end at once when the launcher is already gone (it died before
    the kernel was told). A CI runner that kills the job's process group leaves none running."""
    if not os.environ.get("MS_ROLE"):
        return
    from objdebug.engine.process_tree import alive, die_with_parent

    die_with_parent()
    launcher = os.environ.get(LAUNCHER_ENV, "")
    # (under a msrun the user started, msrun may be a container's pid 1: only ours is checked)
    if launcher.isdigit() and (os.getppid() == 1 or not alive(int(launcher))):
        os._exit(EXIT_INTERNAL_ERROR)


# --------------------------------------------------------------------------- the launcher
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _msrun() -> str:
    """msrun beside this interpreter (a venv's bin/), else on PATH."""
    here = Path(sys.executable).parent / "msrun"
    found = str(here) if here.is_file() else shutil.which("msrun")
    if not found:
        raise InputError("For '--workers', MindSpore's launcher 'msrun' must be installed "
                         "(it comes with the mindspore package), but it was not found.")
    return found


@dataclass
class LaunchResult:
    code: int
    output: str          # rank 0's terminal report, or the failing worker's message
    failed: bool
    log_dir: str | None  # kept (and named in the output) when a worker failed
    staged: list = field(default_factory=list)  # rank 0's report temporaries, for the caller to commit


def without_workers(argv: list[str]) -> list[str]:
    """The same command line less `--workers N` / `--workers=N`: what each worker runs."""
    args, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--workers":
            skip = True
        elif not a.startswith("--workers="):
            args.append(a)
    return args


def launch(cli_args: list[str], workers: int, *, timeout: float = 3600.0,
           cluster_timeout: int = 60) -> LaunchResult:
    """Run `objdebug <cli_args>` as `workers` msrun workers on this machine; wait; collect.

    Rank 0's report files come back as temporaries (`LaunchResult.staged`): the caller renames them
    when the run ended well. A launch that does not return (a signal, an error) removes them, so a
    report never appears for a cancelled run."""
    if workers < 2:
        raise InputError(f"For '--workers', the value must be >= 2 to launch workers, but got {workers}.")
    launcher = _msrun()  # before the folder: a missing msrun leaves nothing behind
    from objdebug.core import leftovers
    from objdebug.engine import process_tree, watchdog

    root = tempfile.mkdtemp(prefix="objdebug-msrun-")
    leftovers.mark(root)
    watchdog.scratch(root)  # the supervisor removes it if it must kill this process
    log_dir, result_dir = os.path.join(root, "logs"), os.path.join(root, "results")
    os.makedirs(result_dir)
    entry = os.path.join(root, "objdebug_worker.py")
    # a script of its own folder: msrun runs `python SCRIPT ARGS` (python from PATH)
    Path(entry).write_text("import sys\nfrom objdebug.cli import main\nsys.argv[0] = 'objdebug'\nmain()\n",
                           encoding="utf-8")
    env = dict(os.environ)
    env[WORKER_DIR_ENV] = result_dir
    env[LAUNCHER_ENV] = str(os.getpid())
    # the workers' scratch folders inside this one: whoever removes it (this process, or the
    # supervisor that had to kill it) removes theirs, which a SIGKILLed worker cannot
    env["TMPDIR"] = os.path.join(root, "tmp")
    os.makedirs(env["TMPDIR"])
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    # the workers import the same objdebug as this process
    pkg_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    # --tail_worker_log names no worker: msrun's `tail -f` of each log (its output went nowhere)
    # would outlive a killed msrun, as a child that no one ties to it
    cmd = [launcher, f"--worker_num={workers}", f"--local_worker_num={workers}",
           "--master_addr=127.0.0.1", f"--master_port={_free_port()}", "--join=True",
           f"--tail_worker_log={workers}", f"--log_dir={log_dir}",
           f"--cluster_time_out={cluster_timeout}", entry, *cli_args]
    # msrun and its workers get a session of their own; whatever ends this wait (a time-out, a
    # signal, an error) ends the whole tree too, and msrun dies with this process (its workers
    # with msrun: tie_to_launcher), so no worker outlives the launcher, even a SIGKILLed one
    watchdog.send("work", f"{workers} msrun workers ran")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, preexec_fn=process_tree.die_with_parent)
    msrun_code: int | None = None
    try:
        msrun_code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(proc)
    except BaseException:
        _stop(proc)
        discard(_records(result_dir).get(0, {}).get("staged", []))
        shutil.rmtree(root, ignore_errors=True)
        watchdog.scratch(root, add=False)
        raise
    records = _records(result_dir)
    out_file = Path(result_dir, "rank_0.out")
    report = out_file.read_text(encoding="utf-8") if out_file.is_file() else ""
    result = _collect(records, workers, msrun_code, report, log_dir, timeout)
    staged = [tuple(pair) for pair in records.get(0, {}).get("staged", [])]
    if result.failed:
        discard(staged)
    else:
        result.staged = staged
        shutil.rmtree(root, ignore_errors=True)
        watchdog.scratch(root, add=False)
    return result


def _records(result_dir: str) -> dict[int, dict]:
    records = {}
    for path in Path(result_dir).glob("rank_*.json"):
        rec = json.loads(path.read_text(encoding="utf-8"))
        records[rec["rank"]] = rec
    return records


def discard(staged) -> None:
    """Remove report temporaries that will not be committed."""
    for tmp, _ in staged:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def _stop(proc: subprocess.Popen) -> None:
    """Kill msrun, every process it started and their groups (msrun gives each worker a process
    group of its own, issue 23), and reap msrun."""
    from objdebug.engine.process_tree import kill_tree

    kill_tree(proc.pid)
    proc.wait()


def _collect(records: dict[int, dict], workers: int, msrun_code: int | None, report: str,
             log_dir: str, timeout: float) -> LaunchResult:
    """The run's exit code and output from the workers' records (pure: tested without msrun)."""
    where = f" (worker logs: {log_dir})"
    if msrun_code is None:
        return LaunchResult(EXIT_INTERNAL_ERROR, f"the {workers} workers did not finish within "
                            f"{timeout:g} s and were stopped{where}", True, log_dir)
    bad = sorted((r for r in records.values() if r["code"] in (EXIT_INPUT_ERROR, EXIT_INTERNAL_ERROR)),
                 key=lambda r: (r["code"] != EXIT_INPUT_ERROR, r["rank"]))
    if bad:
        r = bad[0]
        return LaunchResult(r["code"], f"worker {r['rank']}: {r['message']}{where}", True, log_dir)
    missing = sorted(set(range(workers)) - set(records))
    if missing:
        return LaunchResult(EXIT_INTERNAL_ERROR, f"worker(s) {', '.join(map(str, missing))} ended without "
                            f"a result (killed or crashed; msrun exit {msrun_code}){where}", True, log_dir)
    return LaunchResult(int(records[0]["code"]), report, False, None)

"""``hpcps run``'s mpirun command line (no MPI started here)."""

import os
import subprocess
import sys
import time

from hpcps.runtime import launch
from tests.helpers import alive
from hpcps.cli.main import QUICKSTART, build_parser


def test_oversubscribe_only_when_more_ranks_than_cores():
    cmd, _ = launch.build_command(4, "j.toml", mpirun="mpirun", flavour=("openmpi", 5), cores=2, is_root=False)
    assert cmd[:5] == ["mpirun", "-n", "4", "--map-by", ":OVERSUBSCRIBE"]
    cmd, _ = launch.build_command(2, "j.toml", mpirun="mpirun", flavour=("openmpi", 5), cores=2, is_root=False)
    assert "--map-by" not in cmd
    cmd, _ = launch.build_command(8, "j.toml", mpirun="mpirun", flavour=("openmpi", 4), cores=2, is_root=False)
    assert "--oversubscribe" in cmd
    cmd, env = launch.build_command(8, "j.toml", mpirun="mpiexec", flavour=("mpich", 4), cores=2, is_root=True)
    assert "--map-by" not in cmd and "--oversubscribe" not in cmd and env == {}


def test_workers_added_later_count_for_oversubscription():
    """[elastic] add_workers: 2 ranks + 2 spawned on 3 cores need oversubscription."""
    kw = dict(mpirun="mpirun", flavour=("openmpi", 5), cores=3, is_root=False)
    assert "--map-by" not in launch.build_command(2, "j.toml", **kw)[0]
    cmd, _ = launch.build_command(2, "j.toml", spare=2, **kw)
    assert cmd[:5] == ["mpirun", "-n", "2", "--map-by", ":OVERSUBSCRIBE"]


def test_run_as_root_variables_only_for_root(monkeypatch):
    monkeypatch.delenv("OMPI_MCA_osc", raising=False)
    _, env = launch.build_command(4, "j", mpirun="m", flavour=("openmpi", 5), cores=8, is_root=False)
    assert env == {"OMPI_MCA_osc": "^ucx"}
    _, env = launch.build_command(4, "j", mpirun="m", flavour=("openmpi", 5), cores=8, is_root=True)
    assert env == {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                   "OMPI_MCA_osc": "^ucx"}
    monkeypatch.setenv("OMPI_MCA_osc", "sm")                 # the user's choice is kept
    _, env = launch.build_command(4, "j", mpirun="m", flavour=("openmpi", 5), cores=8, is_root=False)
    assert "OMPI_MCA_osc" not in env


def test_command_runs_this_python_and_the_job():
    cmd, _ = launch.build_command(3, "jobs/x.toml", mpirun="m", python="/py", extra=["--host", "a"])
    assert cmd[-5:] == ["/py", "-m", "hpcps", "train", "jobs/x.toml"]
    assert cmd[3:5] == ["--host", "a"]


def test_flavour_of_the_installed_mpirun():
    kind, major = launch.mpi_flavour(launch.find_mpirun())
    assert kind in ("openmpi", "mpich", "unknown")


def test_run_returns_the_exit_status():
    assert launch.run([sys.executable, "-c", "raise SystemExit(3)"], {}) == 3
    assert launch.run([sys.executable, "-c", "import os,signal; os.kill(os.getpid(), signal.SIGTERM)"], {}) == 128 + 15


def test_default_job_is_the_quickstart_with_three_workers(capsys):
    assert QUICKSTART.exists()
    args = build_parser().parse_args(["run", "--dry-run"])
    assert args.func(args) == 0
    line = capsys.readouterr().out
    assert " -n 4 " in line and str(QUICKSTART) in line


def test_run_options_after_the_job_go_to_train_and_mpirun_args_after_dashes(capsys):
    """Bug: `hpcps run JOB --resume never` passed --resume to mpirun, which refused it."""
    from hpcps.cli.main import main

    assert main(["run", "--dry-run", str(QUICKSTART), "--resume", "never", "--", "--host", "a,b"]) == 0
    cmd = capsys.readouterr().out.strip().splitlines()[-1].split()
    train = cmd.index("train")
    assert cmd[train + 1:] == [str(QUICKSTART), "--resume", "never"]
    assert cmd.index("--host") < cmd.index("-m") and cmd[cmd.index("--host") + 1] == "a,b"


def test_local_rank_count_from_each_launcher_and_dedicated_cores():
    from hpcps.comm.launcher import cores_dedicated, launcher_local_size

    assert launcher_local_size({"OMPI_COMM_WORLD_LOCAL_SIZE": "3"}) == 3
    assert launcher_local_size({"MPI_LOCALNRANKS": "5"}) == 5
    assert launcher_local_size({"SLURM_STEP_ID": "0", "SLURM_STEP_TASKS_PER_NODE": "4(x2)"}) == 4
    assert launcher_local_size({"SLURM_STEP_TASKS_PER_NODE": "4"}) is None   # not inside a step
    assert launcher_local_size({}) is None
    assert cores_dedicated({"OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, cores=2)
    assert not cores_dedicated({"OMPI_COMM_WORLD_LOCAL_SIZE": "3"}, cores=2)
    assert not cores_dedicated({}, cores=64)            # unknown: behave as oversubscribed


def test_default_rank_count_follows_the_mode(capsys):
    """Bug: an allreduce job launched 4 ranks by default (servers + 3) though it has no servers."""
    from hpcps.cli.main import main

    root = QUICKSTART.parents[1]
    for job, n in (("adult_allreduce.toml", 3), ("adult_lbfgs.toml", None), ("adult_lr.toml", 4)):
        assert main(["run", "--dry-run", str(root / "jobs" / job)]) == 0
        cmd = capsys.readouterr().out.strip().splitlines()[-1].split()
        got = int(cmd[cmd.index("-n") + 1])
        if n is None:   # sandblaster: the coordinator, 3 workers and the servers
            from hpcps.config import load_job

            n = load_job(root / "jobs" / job).cluster.servers + 4
        assert got == n, job


def test_session_dir_is_under_prrte_base_then_tmpdir(tmp_path):
    assert launch.session_dir(7, {}) == launch.Path("/tmp/ompi.7")
    assert launch.session_dir(7, {"TMPDIR": "/t"}) == launch.Path("/t/ompi.7")
    assert launch.session_dir(7, {"TMPDIR": "/t", "PRTE_MCA_prte_tmpdir_base": "/b"}) == \
        launch.Path("/b/ompi.7")


def test_stale_session_dir_removed_only_with_rendezvous_files(tmp_path):
    env = {"PRTE_MCA_prte_tmpdir_base": str(tmp_path)}
    assert launch.clear_stale_session_dir(41, env) is None         # no directory
    d = tmp_path / "ompi.41"
    (d / "1").mkdir(parents=True)
    (d / "hwloc.sm").write_bytes(b"x")
    assert launch.clear_stale_session_dir(41, env) is None         # no rendezvous file: kept
    assert d.exists()
    (d / "pmix.vm.tool.41").write_text("prterun-vm-41@0.0;tcp4://127.0.0.1:1\n")
    assert launch.clear_stale_session_dir(42, env) is None         # another pid's: kept
    assert launch.clear_stale_session_dir(41, env) == d
    assert not d.exists() and list(tmp_path.iterdir()) == []


def test_check_has_its_own_help():
    """Issue 22, item 10: `hpcps check --help` was identical to `hpcps run --help`."""
    import subprocess

    def help_of(cmd):
        return subprocess.run([sys.executable, "-m", "hpcps", cmd, "--help"], capture_output=True,
                              text=True, check=True).stdout.replace(f"hpcps {cmd}", "hpcps X")

    run, check = help_of("run"), help_of("check")
    assert run != check
    assert "scikit-learn" in check and "max_auc_gap" in check
    assert "memory" in run and "scikit-learn" not in run


def test_a_map_by_after_double_dash_replaces_the_oversubscribe_one():
    """``hpcps run ... -- --map-by node:OVERSUBSCRIBE`` (one rank per test host in turn): Open MPI 5
    refuses a second --map-by, so the user's replaces hpcps's own (tests/multihost)."""
    extra = ["--map-by", "node:OVERSUBSCRIBE", "--hostfile", "hf"]
    cmd, _ = launch.build_command(6, "j.toml", mpirun="mpirun", flavour=("openmpi", 5), cores=2,
                                  is_root=False, extra=extra)
    assert cmd.count("--map-by") == 1 and cmd[cmd.index("--map-by") + 1] == "node:OVERSUBSCRIBE"
    cmd, _ = launch.build_command(6, "j.toml", mpirun="mpirun", flavour=("openmpi", 4), cores=2,
                                  is_root=False, extra=["--map-by", "node"])
    assert "--oversubscribe" not in cmd


def test_a_launch_that_exits_0_without_the_jobs_summary_did_not_finish(tmp_path):
    """Open MPI 5's mpirun exits 0 after losing a daemon (a node's link cut, tests/multihost):
    hpcps run then looks for this launch's summary in metrics.json."""
    import json
    import types

    from hpcps.cli.main import _unfinished
    cfg = types.SimpleNamespace(output=types.SimpleNamespace(dir=tmp_path),
                                train=types.SimpleNamespace(epochs=2))
    since = time.time()
    assert _unfinished(cfg, since)                                     # no metrics.json
    (tmp_path / "metrics.json").write_text(json.dumps({"epochs": [{"epoch": 1}]}))
    assert _unfinished(cfg, since)                                     # epochs, no summary
    (tmp_path / "metrics.json").write_text(json.dumps({"epochs": [], "summary": {"epochs": 1}}))
    assert not _unfinished(cfg, since)
    os.utime(tmp_path / "metrics.json", (since - 60, since - 60))     # an earlier launch's
    assert _unfinished(cfg, since)
    # a finished run launched again trains nothing and leaves its record as it was
    (tmp_path / "metrics.json").write_text(json.dumps({"epochs": [], "summary": {"epochs": 2}}))
    os.utime(tmp_path / "metrics.json", (since - 60, since - 60))
    assert not _unfinished(cfg, since)


def _wait_gone(pid, what):
    deadline = time.monotonic() + 10
    while alive(pid):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} {pid} is still alive")
        time.sleep(0.05)


def test_run_kills_what_an_exited_mpirun_left_in_its_session(tmp_path, capfd):
    """Found in CI (e8318f9): an added worker held before MPI_Init outlived its aborted launch.
    A fake mpirun starts a child in its session and exits 3: run() returns 3, the child is
    killed, and stderr says so."""
    pidfile = tmp_path / "child.pid"
    fake = ("import subprocess, sys; "
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
            f"open({str(pidfile)!r}, 'w').write(str(c.pid)); sys.exit(3)")
    assert launch.run([sys.executable, "-c", fake], {}, abort_exit_seconds=1.0) == 3
    _wait_gone(int(pidfile.read_text()), "the exited fake mpirun's child")
    assert "mpirun exited with status 3 and left 1 process(es)" in capfd.readouterr().err


def test_run_kills_the_session_of_an_mpirun_that_outlives_an_abort(tmp_path):
    """Issue 22.1: a rank aborted the job (it wrote HPCPS_ABORT_MARK) but mpirun — here a
    Python standing in for it, with a child of its own in its session — does not exit:
    run() kills every process of the session after abort_exit_seconds and returns the
    abort's status."""
    pidfile = tmp_path / "child.pid"
    fake = ("import os, subprocess, sys, time; "
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
            f"open({str(pidfile)!r}, 'w').write(str(c.pid)); "
            "open(os.environ['HPCPS_ABORT_MARK'], 'w').write('7\\n'); time.sleep(600)")
    t0 = time.monotonic()
    assert launch.run([sys.executable, "-c", fake], {}, abort_exit_seconds=1.0) == 7
    assert time.monotonic() - t0 < 30
    _wait_gone(int(pidfile.read_text()), "the fake mpirun's child")


def test_run_without_abort_waits_for_mpirun():
    code = "import time; time.sleep(1.5); raise SystemExit(4)"
    assert launch.run([sys.executable, "-c", code], {}, abort_exit_seconds=0.1) == 4

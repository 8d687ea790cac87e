"""tests/hosts/testhosts.py itself: up is idempotent, down leaves nothing, the rsh agent
runs a command on the host it names."""

import subprocess
import time
from pathlib import Path

from tests.hosts import testhosts as th


def leftovers() -> list:
    found = [str(p) for p in Path("/run/netns").glob("hpcps-h*")] if Path("/run/netns").is_dir() else []
    found += [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
              if "hpcps-hosts" in line.split()[4]]
    found += [p.name for p in Path("/sys/class/net").iterdir() if p.name.startswith("hpcps-")]
    if th.STATE.exists():
        found.append(str(th.STATE))
    return found


def test_up_is_idempotent_and_down_leaves_nothing(_hosts_session):
    hs = th.up(3)
    assert th.up(3) == hs and [h.name for h in th.existing()] == ["hpcps-h1", "hpcps-h2", "hpcps-h3"]
    names = [subprocess.run(h.cmd("hostname"), capture_output=True, text=True, check=True).stdout.strip()
             for h in hs]
    assert names == ["hpcps-h1", "hpcps-h2", "hpcps-h3"]
    sleeper = subprocess.Popen(hs[1].cmd("sleep", "300"))          # a process left on a host
    time.sleep(0.2)
    assert sleeper.pid in th.pids_on(hs[1])                         # nsenter execs sleep: same pid
    assert [h.name for h in th.up(2)] == ["hpcps-h1", "hpcps-h2"]  # host 3 removed whole
    assert not Path("/run/netns/hpcps-h3").exists() and not Path("/sys/class/net/hpcps-v3").exists()
    th.down()
    assert sleeper.wait(10) == -9                                   # killed by down
    assert leftovers() == []
    th.down()                                                       # nothing to do: no error
    assert leftovers() == []


def test_rsh_agent_enters_the_named_host(_hosts_session):
    hs = th.up(3)
    for key in (hs[1].addr, hs[1].name):
        p = subprocess.run([str(th.AGENT), key, "hostname;", "ip", "-o", "-4", "addr", "show", "eth0"],
                           capture_output=True, text=True, timeout=10)
        assert p.returncode == 0, p.stderr
        assert p.stdout.startswith("hpcps-h2\n") and f"{hs[1].addr}/24" in p.stdout
    p = subprocess.run([str(th.AGENT), "10.213.7.99", "hostname"], capture_output=True, text=True)
    assert p.returncode == 255 and "no test host" in p.stderr

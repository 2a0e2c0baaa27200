"""Credentials out of everything hcp-tune writes or prints (``hcp_tune.redact``), the
config loader's handling of URLs as users type them, and a sweep's running markers: a
password never reaches a marker, and a dead sweep's marker goes when the next sweep starts."""
import json
import os
import subprocess
import sys

import pytest

from hcp_tune import config
from hcp_tune.store import housekeeping
from hcp_tune.store.folder import ResultStore
from hcp_tune.errors import ConfigError
from hcp_tune.redact import redact


@pytest.mark.parametrize("text, shown", [
    ("postgresql://hcp:s3cret@db/hcp", "postgresql://hcp@db/hcp"),
    ("postgresql://hcp:s3cret@db:5432/hcp?sslmode=require",
     "postgresql://hcp@db:5432/hcp?sslmode=require"),
    ("postgresql://hcp@db/hcp?password=s3cret&sslmode=require",
     "postgresql://hcp@db/hcp?sslmode=require"),
    ("postgresql://hcp@db/hcp?sslmode=require&password=s3cret",
     "postgresql://hcp@db/hcp?sslmode=require"),
    ("search.storage='postgresql://u:s3cret@h/d' cp=2", "search.storage='postgresql://u@h/d' cp=2"),
    ("host=db user=hcp password=s3cret dbname=hcp",
     "host=db user=hcp password=<hidden> dbname=hcp"),
])
def test_a_password_is_removed_and_the_rest_kept(text, shown):
    assert redact(text) == shown


@pytest.mark.parametrize("text", [
    "postgresql://hcp@db/hcp?sslmode=require",  # no password: unchanged
    "postgresql://db:5432/hcp?user=a@b",  # a port, then an '@' in the query: no password
    "cannot use the database: refused; check the URL",  # prose with ';' and ':'
])
def test_text_without_a_password_is_unchanged(text):
    assert redact(text) == text


def test_a_url_with_a_query_string_loads_as_typed():
    url = "postgresql://hcp@db/hcp?sslmode=require&connect_timeout=3"
    cfg = config.load(["cp=2", "seq=1024", "model=tiny", "cluster=local",
                       f"search.storage={url}"])
    assert cfg.search.storage == url
    quoted = config.load(["cp=2", "seq=1024", "model=tiny", "cluster=local",
                          f"search.storage='{url}'"])  # quoted by hand: the same URL
    assert quoted.search.storage == url


def test_a_malformed_override_quotes_only_itself_and_no_password():
    with pytest.raises(ConfigError) as e:
        config.load(["cp=2", "seq=1024", "search.storage=postgresql://u:s3cret@h/d", "x=a=b"])
    line = str(e.value)
    assert line.startswith("malformed override 'x=a=b': ")
    assert "cp=2" not in line and "seq=1024" not in line and "s3cret" not in line
    assert "x='a=b'" in line  # how to quote it


def _dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True).stdout)


def test_a_marker_keeps_no_password_and_a_new_sweep_removes_dead_markers(tmp_path, monkeypatch):
    store = ResultStore(tmp_path)
    (tmp_path / "sweeps").mkdir()
    host = os.uname().nodename
    dead = tmp_path / "sweeps" / f"{host}-1-dead.running"  # a sweep killed with SIGKILL
    dead.write_text(json.dumps({"host": host, "pid": _dead_pid(), "argv": []}))
    reused = tmp_path / "sweeps" / f"{host}-2-reused.running"  # its pid now another process's
    reused.write_text(json.dumps({"host": host, "pid": os.getpid(), "started": -1, "argv": []}))
    other = tmp_path / "sweeps" / "elsewhere-3-x.running"  # another host: cannot be checked
    other.write_text(json.dumps({"host": "elsewhere", "pid": 3, "argv": []}))
    monkeypatch.setattr(sys, "argv",
                        ["hcp_tune", "sweep", "search.storage=postgresql://u:s3cret@h/d"])
    marker = housekeeping.mark_sweep(store)
    left = sorted(p.name for p in (tmp_path / "sweeps").iterdir())
    assert left == sorted([marker.name, other.name])
    mark = json.loads(marker.read_text())
    assert mark["argv"][-1] == "search.storage=postgresql://u@h/d"
    assert set(housekeeping.running_sweeps(store)) == {f"{other} (pid 3 on elsewhere)",
                                                       f"{marker} (pid {os.getpid()} on {host})"}

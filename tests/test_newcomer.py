"""A newcomer's first steps in a fresh clone (tests/clone.py), without the browser:
`make lab` with arguments, at the repository root."""
from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from clone import environment, fresh_clone


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_make_lab_passes_its_arguments_and_serves_the_repository_root(tmp_path):
    """`make lab ARGS="--no-browser --ip ... --port ..."` (what a remote server needs) reaches
    jupyter lab, whose file browser is at the repository root (figures/ and, once a notebook ran,
    outputs/ beside notebooks/) and opens in notebooks/. Before, ARGS were ignored and the server
    served notebooks/ only."""
    clone = fresh_clone(tmp_path / "clone")
    port, token = _free_port(), secrets.token_hex(16)
    env = environment(clone, JUPYTER_CONFIG_DIR=str(tmp_path / "jupyter-config"),
                      JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "ws"))
    log = open(tmp_path / "lab.log", "w")
    p = subprocess.Popen(["make", "lab", f"ARGS=--no-browser --ip=127.0.0.1 --port={port} "
                          f"--IdentityProvider.token={token} --LabApp.news_url= "
                          "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
                         cwd=clone, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url, deadline = f"http://127.0.0.1:{port}", time.time() + 240      # setup.sh's checks first
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/contents?token={token}", timeout=2) as r:
                    names = {item["name"] for item in json.load(r)["content"]}
                    break
            except OSError:
                pass
            assert p.poll() is None and time.time() < deadline, (tmp_path / "lab.log").read_text()[-3000:]
            time.sleep(0.5)
        assert {"notebooks", "figures", "README.md", "Makefile"} <= names, names

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args, **kwargs):
                return None
        try:
            urllib.request.build_opener(NoRedirect).open(f"{url}/?token={token}", timeout=10)
            where = None
        except urllib.error.HTTPError as e:
            where = e.headers.get("Location")
        assert where is not None and where.split("?")[0].endswith("/lab/tree/notebooks"), where
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        log.close()

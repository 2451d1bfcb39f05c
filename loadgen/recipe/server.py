"""A variant's server for one run: start it, wait (bounded) for its health check, stop it.

`ours` is `python -m server.cli start --port 0 FLAGS` (its ready line names the URL; with a `cwd`,
the server package of the tree in that folder; kept servers side by side on one GPU get an even
share of its memory, loadgen/recipe/memory.py); `command` is the recipe's command line with a
free port in place of {port} and the variant's flags appended as `--key value`; `url` is a
running server, only health-checked; `inprocess` has no server (the run itself is `loadgen
bench`). Every process starts in its own process group, and stopping kills the whole group
(SIGTERM, then SIGKILL after a grace period), so a server's children (engine process, workers)
never outlive the recipe.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from loadgen.recipe.memory import memory_flags
from loadgen.recipe.schema import PORT_PLACEHOLDER, FlagValue, Recipe, Variant
from loadgen.run.affinity import placed_on

log = logging.getLogger(__name__)

STOP_GRACE_S = 40.0  # our server lets running requests finish for up to 30 s on SIGTERM
POLL_S = 0.25
_READY = re.compile(r"server: ready at (http://\S+)")


class ServerStartError(RuntimeError):
    """A server that exited or never became healthy; the message names the command."""


def flag_args(flags: dict[str, FlagValue]) -> list[str]:
    """{key: value} as command-line flags: `--key value`, a bare `--key` for true, nothing for false."""
    args: list[str] = []
    for key, value in flags.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is not False:
            args += [flag, str(value)]
    return args


def server_command(recipe: Recipe, variant: Variant, port: int | None) -> list[str]:
    """The argv that starts the variant's server (empty for url and inprocess)."""
    kind, flags = recipe.server.kind, flag_args(recipe.server_flags(variant))
    if kind == "ours":
        flags += flag_args(memory_flags(recipe, variant))
        return [sys.executable, "-m", "server.cli", "start", "--port", "0", *flags]
    if kind == "command":
        assert recipe.server.command is not None  # validate(): server.kind command requires it
        return shlex.split(recipe.server.command.replace(PORT_PLACEHOLDER, str(port))) + flags
    return []


class RunningServer:
    """A started (or, for kind url, reached) server; `url` is its base URL."""

    def __init__(self, recipe: Recipe, variant: Variant, log_path: Path) -> None:
        self.recipe, self.variant, self.log_path = recipe, variant, log_path
        self.process: subprocess.Popen | None = None
        self.url = recipe.server.url or ""
        self.command: list[str] = []

    def start(self) -> str:
        """Start and wait for health within server.startup_timeout_s; ServerStartError otherwise."""
        settings = self.recipe.server
        port = free_port() if settings.kind == "command" else None
        self.command = server_command(self.recipe, self.variant, port)
        if self.command:
            cwd = self.recipe.server_cwd(self.variant)
            log.info("starting the server of %s: %s%s", self.variant.name, shlex.join(self.command),
                     f" (in {cwd})" if cwd else "")
            env = {**os.environ, **self.recipe.server_env(self.variant)}
            if cwd and settings.kind == "ours":
                # that tree's packages first, ahead of any install of this one (-m alone relies on
                # the working directory leading sys.path, which PYTHONSAFEPATH turns off)
                env["PYTHONPATH"] = os.pathsep.join(filter(None, (os.path.abspath(cwd), env.get("PYTHONPATH"))))
                env.pop("PYTHONSAFEPATH", None)
            with open(self.log_path, "wb") as sink:
                try:
                    with placed_on(settings.cpu_set()):
                        self.process = subprocess.Popen(self.command, stdout=sink, stderr=subprocess.STDOUT,
                                                        env=env, cwd=cwd, start_new_session=True)
                except OSError as exc:
                    raise ServerStartError(f"server.command: cannot start {shlex.join(self.command)}: "
                                           f"{exc.strerror or exc}") from None
            if port is not None:
                self.url = f"http://127.0.0.1:{port}"
        try:
            self._wait_healthy(time.monotonic() + settings.startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self.url

    def _wait_healthy(self, deadline: float) -> None:
        settings = self.recipe.server
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise ServerStartError(f"the server exited with code {self.process.returncode} before it was "
                                       f"healthy: {self._what()}{self._log_tail()}")
            if not self.url and self.log_path.exists():
                match = _READY.search(self.log_path.read_text(errors="replace"))
                self.url = match.group(1) if match else ""
            if self.url and healthy(self.url + settings.health_path):
                return
            time.sleep(POLL_S)
        raise ServerStartError(f"the server was not healthy within server.startup_timeout_s = "
                               f"{settings.startup_timeout_s:g} s: {self._what()}{self._log_tail()}")

    def _what(self) -> str:
        if self.command:
            return shlex.join(self.command)
        return f"GET {self.url}{self.recipe.server.health_path}"

    def _log_tail(self) -> str:
        if not self.process or not self.log_path.exists():
            return ""
        lines = self.log_path.read_text(errors="replace").strip().splitlines()[-5:]
        return ("\n  server log (" + str(self.log_path) + "):\n    " + "\n    ".join(lines)) if lines else ""

    def stop(self) -> None:
        """Stop the server's whole process group; returns once it is gone."""
        if self.process is None or self.process.poll() is not None:
            self.process = None
            return
        log.info("stopping the server of %s (pid %d)", self.variant.name, self.process.pid)
        stop_group(self.process, STOP_GRACE_S)
        self.process = None


def stop_group(process: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM the process group, SIGKILL it after `grace_s`, and reap the leader."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    # children that outlived the leader (same group) get the last word
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def free_port() -> int:
    """A loopback TCP port free right now (for a command line's {port})."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]

"""The command line on a real terminal, driven through tmux: `kvstash top` refreshes the master's
rates and per-segment usage every second; large `kvstash put` and `get`, and `kvstash bench
client`, draw progress on a terminal and stay quiet when standard error is not one. Every
captured screen is printed into the test log.

Exits 77 without tmux."""
import os
import shutil
import subprocess
import sys
import tempfile
import time

from kvs_harness import Server

CLI = os.environ.get("KVS_CLI_PATH", "kvstash")
SOCK = f"kvs-test-{os.getpid()}"


def tmux(*args, check=True):
    return subprocess.run(["tmux", "-L", SOCK, *args], capture_output=True, text=True,
                          check=check)


def screen():
    return tmux("capture-pane", "-p", "-t", "t").stdout


def show(title, text):
    print(f"----- screen: {title} -----")
    print("\n".join(line.rstrip() for line in text.rstrip().splitlines()))
    print("-----")


def wait_for(pred, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        text = screen()
        if pred(text):
            return text
        if time.monotonic() > deadline:
            show(f"timed out waiting for {what}", text)
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def run_in_pane(cmd, marker, timeout=60.0):
    """Types `cmd` into the pane's shell; returns the screen once it printed its exit code."""
    tmux("send-keys", "-t", "t", "clear", "Enter")
    tmux("send-keys", "-t", "t", f"{cmd}; echo {marker}=$?", "Enter")
    text = wait_for(lambda s: f"{marker}=" in s.replace(f"echo {marker}=", ""), marker, timeout)
    return text


def srv_segment(top_screen):
    """The first word of the line under the SEGMENT header: the segment's name."""
    lines = top_screen.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("SEGMENT") and i + 1 < len(lines):
            return lines[i + 1].split()[0]
    raise AssertionError("no segment line:\n" + top_screen)


def main():
    if shutil.which("tmux") is None:
        print("SKIP: tmux not found (Debian package tmux)")
        return 77
    tmp = tempfile.mkdtemp(prefix="kvs-term-")
    srv = Server(segment="512MiB")
    try:
        big = os.path.join(tmp, "big")
        with open(big, "wb") as f:
            f.write(os.urandom(96 << 20))
        env_cli = f"{CLI} --master {srv.master}"
        # A plain shell in a 200x50 terminal; KVS_PROGRESS unset so the tty decides.
        tmux("new-session", "-d", "-s", "t", "-x", "200", "-y", "50",
             f"env -u KVS_PROGRESS PS1='$ ' bash --norc --noprofile")
        tmux("set-option", "-t", "t", "history-limit", "5000")

        # put and get of a 96 MiB object: progress to 100% and "done" on the terminal.
        text = run_in_pane(f"{env_cli} put big {big}", "PUT")
        show("kvstash put (96 MiB)", text)
        assert "PUT=0" in text, text
        assert "put big: 100% 96.00 MiB of 96.00 MiB" in text and ", done" in text, text
        out = os.path.join(tmp, "out")
        text = run_in_pane(f"{env_cli} get big {out}", "GET")
        show("kvstash get (96 MiB)", text)
        assert "GET=0" in text, text
        assert "get big: reading: 100%" in text and "get big: writing: 100%" in text, text
        with open(big, "rb") as a, open(out, "rb") as b:
            assert a.read() == b.read(), "get wrote other bytes"

        # Not a terminal: standard error stays empty.
        err = os.path.join(tmp, "err")
        text = run_in_pane(f"{env_cli} put big2 {big} 2>{err} && {env_cli} get big2 {out} "
                           f"2>>{err}", "QUIET")
        assert "QUIET=0" in text, text
        with open(err) as f:
            quiet = f.read()
        print(f"stderr when not a terminal: {quiet!r}")
        assert quiet == "", quiet

        # bench client: a rounds line on the terminal, nothing on stderr otherwise.
        text = run_in_pane(f"{env_cli} bench client --keys 4 --size 1MiB --reps 3", "BENCH")
        show("kvstash bench client", text)
        assert "BENCH=0" in text, text
        assert "bench client: rounds: 100% 3 of 3" in text, text
        text = run_in_pane(f"{env_cli} bench client --keys 4 --size 1MiB --reps 2 2>{err} "
                           f">/dev/null", "BENCHQ")
        assert "BENCHQ=0" in text, text
        with open(err) as f:
            assert f.read() == ""

        # top: refreshed every second; the puts made meanwhile show in its counts and rates.
        tmux("send-keys", "-t", "t", "clear", "Enter")
        tmux("send-keys", "-t", "t", f"{env_cli} top", "Enter")
        first = wait_for(lambda s: "kvstash top: master" in s and "SEGMENT" in s, "top")
        show("kvstash top (2 objects)", first)
        assert "2 objects" in first, first
        small = os.path.join(tmp, "small")
        with open(small, "wb") as f:
            f.write(os.urandom(1 << 20))
        for i in range(5):
            subprocess.run([CLI, "--master", srv.master, "put", f"k{i}", small], check=True)
        # Every screen until one shows the 7 objects: the frames that counted the puts show
        # a put rate above zero (each frame's rates are the change since the last).
        deadline, screens = time.monotonic() + 10, []
        while not screens or "7 objects" not in screens[-1]:
            assert time.monotonic() < deadline, screens[-1] if screens else "no screen"
            screens.append(screen())
            time.sleep(0.1)
        later = screens[-1]
        show("kvstash top (after 5 puts)", later)
        rates = [l for s_ in screens for l in s_.splitlines() if l.startswith("puts/s")]
        assert any(not l.startswith("puts/s 0.0 ") for l in rates), rates
        # 2 x 96 MiB + 5 x 1 MiB on the one segment, whose line names it with its use.
        assert "used 197.0" in later, later
        seg = [l for l in later.splitlines() if l.startswith(srv_segment(later))]
        assert len(seg) == 1 and "197.0" in seg[0] and "512.00 MiB" in seg[0], later
        tmux("send-keys", "-t", "t", "C-c", "")
        print("terminal: top refreshes, progress shows on a terminal and not elsewhere")
        return 0
    finally:
        tmux("kill-server", check=False)
        srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

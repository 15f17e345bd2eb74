"""What the server's check suites share (serve_checks.py, door_checks.py): a record of
checks that prints each as it goes and a summary at the end, and the torchattn_serve
process they start, read and stop."""

import signal
import subprocess


class Checks:
    """check(ok, what) prints "[tag] ok|FAIL what" and keeps the failures; finish() prints
    the summary and returns the exit status (1 if any failed)."""

    def __init__(self, tag):
        self.tag = tag
        self.failures = []

    def __call__(self, ok, what):
        print(f"[{self.tag}] {'ok  ' if ok else 'FAIL'} {what}", flush=True)
        if not ok:
            self.failures.append(what)

    def finish(self):
        if self.failures:
            print(f"[{self.tag}] {len(self.failures)} checks failed:\n  " + "\n  ".join(self.failures))
            return 1
        print(f"[{self.tag}] all checks passed")
        return 0


class ServerProcess:
    """torchattn_serve started as argv (with --port 0), its stderr in `log` (an open file):
    the line it prints when listening (line), its port, and its /proc status."""

    def __init__(self, argv, log, tag):
        self.log = log
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline()
        if "listening on http://" not in line:
            raise RuntimeError(f"the server did not start: {line!r} (log: {self.log.name})")
        self.port = int(line.split("http://")[1].split(",")[0].split(":")[1])
        self.line = line
        print(f"[{tag}] {line.strip()}", flush=True)

    def status_mib(self, field):
        """A field of the server's /proc status (VmRSS, VmHWM) in MiB; 0 if absent."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def stop(self, sig=signal.SIGTERM, timeout=60):
        """Sends `sig` and returns the exit status (None if it had to be killed)."""
        self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = None
        self.log.close()
        return code

"""Stopping on request: SIGTERM (torchrun, SLURM, Kubernetes before a kill) and SIGINT (Ctrl-C).

A handler only raises a flag. The training loop finishes the step, sums the flag over all ranks (so every rank stops
after the same step), writes last.pt and raises `Stopped`; train.py exits with 128 + the signal number, as a shell
reports a signal, so a scheduler can tell an interrupted run from a finished one. During an evaluation (or with
the last step of an evaluation period, or of the run) the flag is summed after each evaluation batch, and the run
stops there: that step's checkpoint is written before its evaluation, so the resumed run evaluates it again, exactly
as the uninterrupted one did, and a long evaluation delays a stop by one batch.
"""
import signal


class Stopped(Exception):
    """A signal stopped the run after last.pt was written; `code` = 128 + signal number."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


class StopSignal:
    """Installs the flag-raising handlers. In a single process the previous handler is back after the first signal,
    so a second Ctrl-C stops at once (KeyboardInterrupt). Under torchrun a rank ignores repeats: Ctrl-C reaches it
    from the terminal *and* from torchrun, which forwards signals (and SIGKILLs after its grace period)."""

    def __init__(self, repeat_stops: bool = True):
        self.signum, self.repeat_stops = 0, repeat_stops
        self.previous = {s: signal.signal(s, self.handle) for s in (signal.SIGTERM, signal.SIGINT)}

    def handle(self, signum, frame):
        self.signum = self.signum or signum
        if self.repeat_stops:
            signal.signal(signum, self.previous[signum])

    def name(self) -> str:
        """The signal that arrived here (another rank's, reported as SIGTERM, if none did)."""
        return signal.Signals(self.signum or signal.SIGTERM).name

    def restore(self) -> None:
        """The previous handlers back; but a rank stopped under torchrun keeps ignoring repeats until it exits, or a
        late forwarded signal would kill it mid-teardown (exit -2/-15 instead of 130/143, a traceback)."""
        for s, handler in self.previous.items():
            signal.signal(s, signal.SIG_IGN if self.signum and not self.repeat_stops else handler)


def stopped(name: str, step: int) -> Stopped:
    return Stopped(f"stopped by {name} at step {step}; last.pt written. Resume with the same command plus "
                   f"--set checkpoint.resume=auto", 128 + getattr(signal, name))

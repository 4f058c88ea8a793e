"""How Ctrl-C (SIGINT) ends every command of the project (``python -m specbench``, ``python -m analysis``, the
scripts): exit status 130 and one line on stderr, whenever it comes, never a KeyboardInterrupt traceback.

Standard library only, so that an entry point imports it, and installs its handler, before the imports that take
a second or more (torch, transformers, Hydra, pandas, matplotlib)::

    from specbench.interrupts import Interrupts

    interrupts = Interrupts("prune_draft: interrupted before it started", "prune_draft: interrupted; ...")
    if __name__ == "__main__":
        interrupts.arm()

    import torch  # noqa: E402  (after the interrupt handler, on purpose)
    ...

    if __name__ == "__main__":
        sys.exit(interrupts.run(main))
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time

INTERRUPTED = 130
IMPORTLIB_SOURCES = ("importlib/_bootstrap.py", "importlib/_bootstrap_external.py")
REDELIVERY_S = 0.05  # long enough for the finalizer that swallowed an interrupt to return before the next one


class Interrupts:
    """How Ctrl-C (SIGINT) ends the process: exit status 130 and one line on stderr, whenever it comes.

    Until the command's task starts (a second or more of importing torch, transformers, Hydra or pandas, for
    specbench then composing the config) there is nothing to clean up, so the process ends at once (``stop``),
    printing ``message``. From the task's start (``task_started``) the first SIGINT raises KeyboardInterrupt
    (``unwind``), so a build removes its staging directory, locks are released and the entry point says what was
    saved (``started_message``, or its own line through ``report``); then it ends the process (``leave``). A
    second SIGINT while the first unwinds ends it at once, leaving what a killed process leaves, which the locks
    and staging directories are made to survive. A first SIGINT that lands in a finalizer, where Python would
    ignore its KeyboardInterrupt, is delivered again once the finalizer returns (``ignored``); one that lands inside
    an import is delivered again once the import is done (``unwind``): a module's import may run in C++ (torch's
    ``_c10d_init`` imports Python modules through pybind11), where a KeyboardInterrupt is an exception C++ cannot
    pass on, and the process aborts (status -6, a C++ traceback), as a CI machine slow at importing torch found.

    ``leave`` is ``os._exit``, after flushing: Python's own exit kills the process by SIGINT instead (status -2,
    not 130) once a KeyboardInterrupt has passed through an ``exec`` of source text (dataclasses and namedtuple
    build their methods that way, at import), however it was caught afterwards.

    A process started with SIGINT ignored (a background job of a shell script, ``nohup``) keeps it ignored: the
    shell ignores it in its background jobs so that a Ctrl-C at the terminal stops the foreground command and not
    them, and Python itself installs its KeyboardInterrupt only where SIGINT was not ignored; resetting it here
    would let that Ctrl-C end every benchmark a script left running. Such a job is stopped with SIGTERM. A test
    that interrupts a command starts it with the default disposition (tests/test_interrupts.py)."""

    def __init__(self, message: str = "specbench: interrupted before the run started",
                 started_message: str = "specbench: interrupted"):
        self.enabled = (threading.current_thread() is threading.main_thread()
                        and signal.getsignal(signal.SIGINT) is signal.default_int_handler)
        self.message = message
        self.started_message = started_message
        self.reported = False
        self.unwinding = False  # from the task's start until the entry point returns
        self.redelivering = False
        self.redelivery_due = False  # the SIGINT on its way is ``_redeliver``'s, not the user's
        self.unraisable_hook = sys.unraisablehook

    def install(self, handler) -> None:
        if self.enabled and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, handler)

    def arm(self) -> None:
        """From now until the task starts, SIGINT ends the process at once; during the interpreter's own shutdown
        it is ignored (see ``shutting_down``). Call it before the slow imports, from the entry point only (an
        import of the module by a test must leave the test's SIGINT alone)."""
        self.install(self.stop)
        atexit.register(self.install, signal.SIG_IGN)

    def task_started(self) -> None:
        self.message = self.started_message
        self.install(self.unwind)
        if self.enabled and threading.current_thread() is threading.main_thread():
            self.unwinding = True
            if sys.unraisablehook != self.ignored:  # a sweep starts a task per job
                self.unraisable_hook = sys.unraisablehook
                sys.unraisablehook = self.ignored

    def ignored(self, unraisable) -> None:
        """``unwind``'s KeyboardInterrupt, raised while the main thread ran a finalizer (a ``__del__`` or a
        weakref callback, which a garbage collection runs between any two instructions), is one Python ignores
        (it would print "Exception ignored in" and go on): deliver the interrupt again once the finalizer has
        returned, still as the first one. Any other exception goes to the hook there was before."""
        if not (self.unwinding and issubclass(unraisable.exc_type, KeyboardInterrupt)
                and _raised_by(unraisable.exc_traceback, Interrupts.unwind)):
            self.unraisable_hook(unraisable)
            return
        self.redeliver_later()

    def redeliver_later(self) -> None:
        """The first interrupt, SIGINT again from another thread after a pause (a signal raised here would be
        handled inside the caller, where it cannot be raised). Until then a SIGINT is the user's second Ctrl-C, which
        ends the process at once (``redelivered_or_second``)."""
        self.redelivering = True
        self.redelivery_due = False
        self.install(self.redelivered_or_second)
        threading.Thread(target=self._redeliver, daemon=True).start()

    def _redeliver(self) -> None:
        time.sleep(REDELIVERY_S)
        if self.redelivering:  # not when the user's second Ctrl-C came first: it ended the process
            self.redelivery_due = True
            os.kill(os.getpid(), signal.SIGINT)

    def redelivered_or_second(self, signum, frame) -> None:
        if self.redelivery_due:
            self.redelivery_due = False
            self.unwind(signum, frame)
        else:
            self.stop(signum, frame)

    def report(self, message: str) -> None:
        """Print ``message``, unless a line about this interrupt was printed already."""
        if not self.reported:
            self.reported = True
            # Not print(): a signal handler may run while the main thread is inside a write to sys.stderr.
            os.write(2, f"{message}\n".encode(errors="replace"))

    def stop(self, signum=None, frame=None) -> None:
        self.report(self.message)
        self.leave(in_handler=True)

    def unwind(self, signum, frame) -> None:
        if inside_import(frame):
            self.redeliver_later()
            return
        self.redelivering = False
        self.install(self.stop)
        raise KeyboardInterrupt

    def shutting_down(self) -> None:
        """The entry point returns: SIGINT stops the process at once (is ignored, once an interrupt ends it),
        until the interpreter's own shutdown, from which it is ignored (an ``atexit`` hook, registered by ``arm``:
        the shutdown resets a Python handler to the default one, which kills the process by the signal)."""
        self.unwinding = self.redelivering = False
        self.install(signal.SIG_IGN if self.reported else self.stop)

    def leave(self, in_handler: bool = False) -> None:
        """End the process with INTERRUPTED, what it printed and logged flushed."""
        if not in_handler and "logging" in sys.modules:  # in a handler the main thread may hold a log lock
            sys.modules["logging"].shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # the main thread was inside a write to it
                pass
        os._exit(INTERRUPTED)

    def run(self, main, *args):
        """``main(*args)``, its task started first, and its result returned; an interrupt is ``started_message``
        (unless ``main`` reported its own line) and exit status INTERRUPTED. For entry points whose task starts as
        ``main`` is called, once the slow imports are done (every script, ``python -m analysis``)."""
        self.task_started()
        try:
            return main(*args)
        except KeyboardInterrupt:
            # A progress bar may have left the cursor inside its line: the interrupt's line starts a new one.
            self.report(f"\n{self.message}")
        except Exception as error:
            if not follows_interrupt(error):
                raise
            self.report(f"\n{self.message}")
        except SystemExit:
            if not self.reported:
                raise
        finally:
            self.shutting_down()
        self.leave()


def follows_interrupt(error: BaseException) -> bool:
    """Whether ``error`` was raised while a KeyboardInterrupt unwound: library cleanup code that the interrupt
    cut short can fail in turn (OmegaConf's ``flag_override`` restoring flags on a half-built config raises an
    AttributeError), and that failure is the interrupt's, to be reported as one."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def inside_import(frame) -> bool:
    """Whether ``frame`` runs inside an import: a frame of importlib's bootstrap calls it, directly or not."""
    while frame is not None:
        filename = frame.f_code.co_filename.replace("\\", "/")
        # Frozen into the interpreter, as CPython builds it, or read from its source where a build does not freeze it.
        if filename.startswith("<frozen importlib.") or filename.endswith(IMPORTLIB_SOURCES):
            return True
        frame = frame.f_back
    return False


def _raised_by(traceback, function) -> bool:
    """Whether the innermost frame of ``traceback`` ran ``function``."""
    while traceback is not None and traceback.tb_next is not None:
        traceback = traceback.tb_next
    return traceback is not None and traceback.tb_frame.f_code is function.__code__

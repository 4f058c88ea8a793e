"""run.threads: the thread count a run takes, and what the machine looked like when it began (run/threads.py)."""

from specbench.run import threads as run_threads
from specbench.settings import RunSettings


def quiet_machine(monkeypatch, cores=4.0, other=0.0):
    monkeypatch.setattr(run_threads, "usable_cores", lambda: cores)
    monkeypatch.setattr(run_threads, "other_load", lambda: other)


def test_a_set_thread_count_is_taken_as_it_is(monkeypatch):
    quiet_machine(monkeypatch)
    threads, timing = run_threads.choose_threads(RunSettings.from_config({"threads": 1}), None)
    assert threads == 1 and (timing.threads, timing.usable_cores, timing.other_load_at_start) == (1, 4.0, 0.0)


def test_a_resumed_run_takes_the_threads_its_first_session_used(monkeypatch):
    quiet_machine(monkeypatch)
    threads, _ = run_threads.choose_threads(RunSettings.from_config({"threads": None}), {"threads": 2})
    assert threads == 2


def test_a_new_run_takes_the_cores_other_processes_leave_free(monkeypatch):
    quiet_machine(monkeypatch, cores=4.0, other=1.0)
    threads, timing = run_threads.choose_threads(RunSettings.from_config({"threads": None}), None)
    assert threads == 3 and timing.other_load_at_start == 1.0


def test_the_processes_of_one_tensor_parallel_run_split_the_cores(monkeypatch):
    quiet_machine(monkeypatch, cores=4.0, other=3.0)  # the other ranks are this run, not other load
    threads, timing = run_threads.choose_threads(RunSettings.from_config({"threads": None}), None, processes=2)
    assert threads == 2 and (timing.usable_cores, timing.other_load_at_start) == (2, 0.0)

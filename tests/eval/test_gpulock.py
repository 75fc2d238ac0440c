"""The GPU's lock: checks share the GPU, a timed section holds it alone, a waiting timed section
is not starved, and a holder waits for its own GPU work before letting go. Each ``GpuLock`` here
opens the lock files afresh, so two in one process take turns as two processes do."""

from __future__ import annotations

import threading
import time

import pytest

from kforge.runtime.gpulock import GpuLock

WAIT_S = 10.0


@pytest.fixture
def lock(tmp_path):
    made: list[GpuLock] = []

    def make(sync=lambda: None) -> GpuLock:
        made.append(GpuLock("test-gpu", sync, folder=tmp_path))
        return made[-1]

    yield make
    for each in made:
        each.close()


def in_thread(work) -> threading.Thread:
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread


def queue_timed_section(timer: GpuLock, order: list[str]) -> threading.Thread:
    """A timed section on ``timer``, started in a thread and queued at the turnstile (behind a
    shared holder) when this returns; it adds "timed" to ``order`` once it runs."""
    waiting = threading.Event()

    def time_it() -> None:
        waiting.set()
        with timer.exclusive():
            order.append("timed")

    thread = in_thread(time_it)
    assert waiting.wait(WAIT_S)
    time.sleep(0.2)  # the timed section reaches the turnstile
    return thread


def test_shared_holds_overlap_and_an_exclusive_one_waits_for_them(lock):
    a, b, timer = lock(), lock(), lock()
    timed = threading.Event()

    def time_it() -> None:
        with timer.exclusive():
            timed.set()

    with a.shared(), b.shared():  # two checks at once
        worker = in_thread(time_it)
        assert not timed.wait(0.3)  # the timed section waits for both
    assert timed.wait(WAIT_S)
    worker.join(WAIT_S)


def test_a_holder_counts_its_time_waiting_for_the_lock(lock):
    check, timer = lock(), lock()

    def take_turn() -> None:
        with check.shared():
            pass

    with timer.exclusive():
        assert timer.waited_s < 0.2  # free: taken at once
        waiter = in_thread(take_turn)
        time.sleep(0.3)
    waiter.join(WAIT_S)
    assert 0.25 <= check.waited_s < WAIT_S


def test_a_waiting_timed_section_is_not_starved_by_new_checks(lock):
    first, timer, later = lock(), lock(), lock()
    order: list[str] = []

    def check() -> None:
        with later.shared():
            order.append("later check")

    with first.shared():
        threads = [queue_timed_section(timer, order)]
        threads.append(in_thread(check))
        time.sleep(0.2)
        assert order == []  # the later check waits behind the timed section
    for thread in threads:
        thread.join(WAIT_S)
    assert order == ["timed", "later check"]


def test_exclusive_inside_shared_gives_the_shared_hold_up_and_takes_it_back(lock):
    worker, other = lock(), lock()
    other_in, done = threading.Event(), threading.Event()

    def check() -> None:
        with other.shared():
            other_in.set()
            done.wait(WAIT_S)

    with worker.shared():
        with worker.exclusive():
            thread = in_thread(check)
            assert not other_in.wait(0.3)  # alone while timed
        assert other_in.wait(WAIT_S)  # shared again: the other check runs beside it
        done.set()
    thread.join(WAIT_S)


def test_idle_lets_a_timed_section_in_meanwhile(lock):
    worker, timer = lock(), lock()
    timed = threading.Event()

    def time_it() -> None:
        with timer.exclusive():
            timed.set()

    with worker.shared():
        with worker.idle():
            thread = in_thread(time_it)
            assert timed.wait(WAIT_S)
            thread.join(WAIT_S)


def test_a_holder_waits_for_its_own_gpu_work_before_letting_go(lock):
    events: list[str] = []
    worker = lock(sync=lambda: events.append("synced"))
    with worker.shared():
        events.append("work")
    with worker.exclusive():
        events.append("timed")
    assert events == ["work", "synced", "timed", "synced"]


def test_a_failing_sync_still_lets_go(lock):
    def dead() -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    worker, timer = lock(sync=dead), lock()
    with worker.shared():
        pass
    with timer.exclusive():  # not held by the dead context
        pass


def test_the_lock_files_are_private_and_no_link_is_followed(tmp_path):
    import os

    (tmp_path / "elsewhere").write_text("")
    os.symlink(tmp_path / "elsewhere", tmp_path / "gpu-linked.lock")
    with pytest.raises(OSError):
        GpuLock("linked", folder=tmp_path)
    made = GpuLock("mine", folder=tmp_path)
    made.close()
    assert (tmp_path / "gpu-mine.lock").stat().st_mode & 0o777 == 0o600

"""SIGTERM unwinds a run by raising in the main thread; raised while that thread holds logging's module lock it
would leave the lock held, and every thread that logs would wait forever (a cancelled remote session hung so)."""
import logging
import os
import signal
import threading
import time

import pytest

from parsl_bft.execution.signals import Terminated, sigterm_unwinds

BUDGET_S = 30.0


def test_a_sigterm_that_finds_loggings_lock_held_comes_again_once_it_is_released():
    with sigterm_unwinds():
        logging._lock.acquire()
        try:
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(100):              # the handler runs between these bytecodes: it must not raise
                    pass
            except Terminated:
                pytest.fail("SIGTERM raised while this thread held logging's lock")
            assert logging._lock._is_owned()
        finally:
            logging._lock.release()
        # another thread can log, and the signal comes again and unwinds
        t = threading.Thread(target=logging.getLogger("bft-test").debug, args=("still logging",))
        t.start()
        t.join(BUDGET_S)
        assert not t.is_alive(), "ran out of time: a thread could not log"
        with pytest.raises(Terminated):
            deadline = time.monotonic() + BUDGET_S
            while time.monotonic() < deadline:
                threading.Event().wait(0.01)
            pytest.fail(f"ran out of time: no Terminated within {BUDGET_S} s of the lock's release")

"""interrupts.py and early_signals.py in-process: the handlers' hand-over and a signal whose exception Python
drops (the end-to-end cases, with real signals at spread moments, are in test_unclean_inputs.py)."""

from __future__ import annotations

import gc
import signal
import weakref

import pytest

from graphdiag import early_signals
from graphdiag.errors import Terminated
from graphdiag.interrupts import interrupt_came, raise_if_swallowed, terminate_as_interrupt


class _Thing:
    pass


def _signal_inside_a_weakref_callback(sig: int) -> None:
    """Deliver `sig` while Python runs a weakref callback (where importlib's module-lock callback got one):
    the handler's exception is "ignored", not raised here. raise_signal, not kill: the signal goes to this
    thread, so its C handler has run when raise returns (kill may hand it to another thread of the process,
    an xdist worker's, which may run it only after the callback: a flaky test under load)."""
    thing = _Thing()
    ref = weakref.ref(thing, lambda _r: (signal.raise_signal(sig), [None for _ in range(100)]))
    del thing
    gc.collect()
    assert ref() is None


@pytest.fixture(autouse=True)
def _handlers_kept():
    """Each test's handlers put back (after a SIGTERM, terminate_as_interrupt leaves it ignored: the process is
    ending; this one is not)."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    # Python's own handlers to start from, whatever an earlier test in this worker left (terminate_as_interrupt
    # takes over only Python's and graphdiag's early ones: under another, a Ctrl-C is that handler's)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield before
    for s, h in before.items():
        signal.signal(s, h)
    early_signals._early_replaced.clear()


@pytest.mark.parametrize("sig,exc", [(signal.SIGTERM, Terminated), (signal.SIGINT, KeyboardInterrupt)])
def test_a_signal_dropped_by_a_weakref_callback_is_raised_at_the_next_check_and_prints_nothing(sig, exc, capsys):
    with pytest.raises(exc):
        with terminate_as_interrupt():
            _signal_inside_a_weakref_callback(sig)
            assert isinstance(interrupt_came(), exc)         # it came, though nothing was raised
            raise_if_swallowed()
    assert "Traceback" not in capsys.readouterr().err       # not "Exception ignored in ...": ours, kept


def test_without_a_signal_the_check_passes():
    with terminate_as_interrupt():
        raise_if_swallowed()


def test_the_early_handlers_are_taken_over_with_what_they_replaced_restored_after():
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    early_signals.install_early()
    assert signal.getsignal(signal.SIGTERM) is early_signals._while_loading
    assert signal.getsignal(signal.SIGINT) is early_signals._while_loading
    with terminate_as_interrupt():
        # ours from the first moment: neither of the early ones (which would os._exit) is left
        assert signal.getsignal(signal.SIGTERM) is not early_signals._while_loading
        assert signal.getsignal(signal.SIGINT) is not early_signals._while_loading
        early_signals.release_early()                    # what cli.main calls next: nothing left to give back
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    assert {s: signal.getsignal(s) for s in before} == before

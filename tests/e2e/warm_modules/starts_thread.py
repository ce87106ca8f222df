"""A preload that starts a thread (tests/e2e/warm_test.cc): a template that imports it must not fork."""
import threading

_stop = threading.Event()
threading.Thread(target=_stop.wait, daemon=True).start()

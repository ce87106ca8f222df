"""A preload that keeps a file open (tests/e2e/warm_test.cc): every forked worker would share it."""
import os

_kept = open(os.devnull, "rb")

"""A preload that takes 30 s while the file `slow-imports` exists in the working folder
(tests/e2e/warm_test.cc): a replacement template that is still importing when a round starts."""
import os
import time

if os.path.exists("slow-imports"):
    time.sleep(30)

#!/usr/bin/env bash
# Log-throughput worker: writes LOG_BYTES bytes of 100-byte lines to stdout, as fast as it can.
exec yes "step 000123 loss 0.123456 lr 0.000100 throughput 1234.5 samples/s ........................." |
  head -c "${LOG_BYTES:?}"

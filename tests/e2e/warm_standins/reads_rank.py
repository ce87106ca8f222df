"""A stand-in for a module that keeps a rank-specific variable from its import."""
import os

RANK_AT_IMPORT = os.environ.get("RANK")

"""A stand-in for a module that changes the environment at import."""
import os

os.environ["STANDIN_SET"] = "1"
os.environ.pop("STANDIN_REMOVED", None)

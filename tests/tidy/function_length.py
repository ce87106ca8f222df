#!/usr/bin/env python3
"""No function over 100 lines (issue 42.5), as a ratchet.

Scans every .cc file of the product (base, cli, report, runner, schema, sim) for function
definitions at namespace level, formatted as .clang-format writes them: a line at column 0 that
ends with "{" opens one, the next line that is "}" at column 0 closes it. A function longer than
100 lines (its opening to its closing line) must be listed in long-functions.txt with its
length at most; a listed one that got shorter must have its entry lowered, and one at 100 lines
or fewer must leave the list. So the list only shrinks.

  function_length.py SOURCE_DIR            check (exit 1 with what to do)
  function_length.py SOURCE_DIR --list     print every function over the limit, longest first
"""
import pathlib
import re
import sys

LIMIT = 100
FOLDERS = ["base", "cli", "report", "runner", "schema", "sim"]
# Lines at column 0 ending in "{" that open no function body.
NOT_A_FUNCTION = re.compile(r"^(namespace|class|struct|union|enum|extern|template\s*<[^>]*>\s*(class|struct))\b|=\s*\{+$")
NAME = re.compile(r"([A-Za-z_][A-Za-z_0-9:~]*(?:operator\S*)?)\s*\(")


def functions(path, text):
    """(name, first line, length) of each function defined at namespace level."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line or line[0].isspace() or line.startswith(("}", "#", "//")):
            i += 1
            continue
        # A declaration starts here; it may go on over indented lines until "{" or ";".
        opening = i
        while opening < len(lines) and not lines[opening].rstrip().endswith(("{", ";")) \
                and (opening == i or lines[opening][:1].isspace()):
            opening += 1
        if opening >= len(lines) or not lines[opening].rstrip().endswith("{"):
            i = opening + 1
            continue
        signature = " ".join(l.strip() for l in lines[i:opening + 1])
        if NOT_A_FUNCTION.search(signature) or "(" not in signature:
            i = opening + 1
            continue
        end = opening + 1
        while end < len(lines) and lines[end] != "}":
            end += 1
        names = NAME.findall(signature.split("(")[0] + "(")
        yield (names[-1] if names else signature[:40]), i + 1, end - i + 1
        i = end + 1


def scan(source):
    found = {}
    for folder in FOLDERS:
        for path in sorted((source / folder).rglob("*.cc")):
            rel = path.relative_to(source).as_posix()
            for name, line, length in functions(path, path.read_text(encoding="utf-8", errors="replace")):
                if length > LIMIT:
                    key = f"{rel} {name}"
                    found[key] = max(found.get(key, 0), length)
    return found


def main():
    source = pathlib.Path(sys.argv[1])
    found = scan(source)
    if "--list" in sys.argv:
        for key, length in sorted(found.items(), key=lambda kv: -kv[1]):
            print(f"{length} {key}")
        return 0
    listed = {}
    listing = source / "tests" / "tidy" / "long-functions.txt"
    for raw in listing.read_text().splitlines():
        if raw.strip() and not raw.startswith("#"):
            length, key = raw.split(" ", 1)
            listed[key] = int(length)
    problems = []
    for key, length in sorted(found.items()):
        if key not in listed:
            problems.append(f"{key}: {length} lines (at most {LIMIT}): split it")
        elif length > listed[key]:
            problems.append(f"{key}: {length} lines, longer than the {listed[key]} long-functions.txt allows")
        elif length < listed[key]:
            problems.append(f"{key}: {length} lines now: lower its entry in long-functions.txt to {length}")
    for key, length in sorted(listed.items()):
        if key not in found:
            problems.append(f"{key}: at most {LIMIT} lines now (or gone): remove it from long-functions.txt")
    for problem in problems:
        print(problem)
    print(f"{len(found)} function(s) over {LIMIT} lines, {len(listed)} listed; {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

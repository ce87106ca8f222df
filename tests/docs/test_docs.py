"""The docs are tested: every code block (fenced or indented) of README.md and docs/*.md, and every
ddprun flag the prose names, against the binary.

Each block is preceded by an annotation that says how it is checked, or why it cannot run
on a CI machine:

    <!-- docs-test: check as=ok.toml -->          a whole job file: `ddprun check` exits 0
    <!-- docs-test: check-fails exit=2 -->        a whole job file with mistakes; the next block
    <!-- docs-test: output -->                    is what `ddprun check job.toml` prints for it
    <!-- docs-test: fragment -->                  part of a job file: merged into a small job,
                                                  `ddprun check` exits 0
    <!-- docs-test: session -->                   `$ command` lines, each followed by what it
                                                  prints (exactly, when lines follow); exit 0
    <!-- docs-test: commands -->                  a shell script: run in the repository, exit 0
    <!-- docs-test: python -->                    Python that must compile
    <!-- docs-test: prometheus-config -->         `promtool check config`
    <!-- docs-test: promql -->                    each line a PromQL expression (`promtool check rules`)
    <!-- docs-test: metrics -->                   exposition text (`promtool check metrics`) whose
                                                  every metric name the binary serves
    <!-- docs-test: excerpt: COMMAND -->          lines of what COMMAND prints (run in a copy of
                                                  examples/ and bench/); "..." lines skipped
    <!-- docs-test: not run: REASON -->           why not, where it stands

A block without an annotation fails the test: a new promise needs a test or a reason.

Run by ctest (tests/docs/CMakeLists.txt): test_docs.py DDPRUN SOURCE_DIR.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

DDPRUN = ""
SOURCE = ""
DOCS = []  # (path relative to SOURCE, text)

ANNOTATION = re.compile(r"<!--\s*docs-test:\s*(.*?)\s*-->")
SUBCOMMANDS = ["run", "up", "status", "down", "simulate", "report", "check", "init", "preflight", "schema"]

# Flags the docs name that belong to other programs, each with its program.
FOREIGN_FLAGS = {
    "--client-cert-auth": "etcd",
    "--cpu-bind": "srun",
    "--cpus-per-task": "sbatch",
    "--ntasks-per-node": "sbatch",
    "--kill-on-bad-exit": "srun",
    "--epochs": "the example train.py",
    "--lr": "the example train.py (ddprun passes what follows `--`)",
    "--max_restarts": "torchrun",
    "--monitor_interval": "torchrun",
    "--node_rank": "torchrun",
    "--nproc_per_node": "torchrun",
    "--master_addr": "torchrun",
    "--master_port": "torchrun",
    "--rdzv_conf": "torchrun",
    "--no_python": "torchrun",
    "--log_dir": "torchrun",
    "--redirects": "torchrun",
    "--tee": "torchrun",
    "--preset": "cmake",
    "--gtest_filter": "GoogleTest",
    "--connect-timeout": "ssh (ConnectTimeout) / curl",
}


class Block:
    def __init__(self, path, line, lang, lines, annotation):
        self.path = path
        self.line = line  # of the opening fence, 1-based
        self.lang = lang
        self.lines = lines
        self.annotation = annotation  # "" none

    @property
    def where(self):
        return f"{self.path}:{self.line}"

    @property
    def text(self):
        return "\n".join(self.lines) + "\n"

    def kind(self):
        return self.annotation.split()[0] if self.annotation else ""

    def option(self, name, default=None):
        for word in self.annotation.split()[1:]:
            if word.startswith(name + "="):
                return word[len(name) + 1:]
        return default


def annotation_above(lines, start):
    for j in range(start - 1, -1, -1):
        if not lines[j].strip():
            continue
        match = ANNOTATION.search(lines[j])
        return match.group(1) if match else ""
    return ""


def indented_block_at(lines, i):
    """The end of the indented code block that starts at line i (0-based), or None: 4 spaces
    after a blank line whose paragraph above is not a list item or its continuation."""
    above = lines[i - 1] if i > 0 else "x"
    if not (lines[i].startswith("    ") and lines[i].strip() and (not above.strip() or ANNOTATION.search(above))):
        return None
    j = i - 1
    while j >= 0 and (not lines[j].strip() or ANNOTATION.search(lines[j])):
        j -= 1
    if j >= 0 and re.match(r"^(\s*[-*]|\s*\d+\.|\s{2,})", lines[j]) and not lines[j].startswith("    "):
        return None
    k = i
    while k < len(lines) and (lines[k].startswith("    ") or not lines[k].strip()):
        k += 1
    while k > i and not lines[k - 1].strip():
        k -= 1
    return k


def blocks_of(path, text):
    """Every fenced or indented code block, with the annotation on the last non-blank line above it."""
    out = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        fence = re.match(r"^(\s*)```(\w*)\s*$", lines[i])
        if not fence:
            end = indented_block_at(lines, i)
            if end is not None:
                body = [l[4:] for l in lines[i:end]]
                out.append(Block(path, i + 1, "indented", body, annotation_above(lines, i)))
                i = end
                continue
            i += 1
            continue
        start = i
        body = []
        i += 1
        while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
            body.append(lines[i])
            i += 1
        out.append(Block(path, start + 1, fence.group(2), body, annotation_above(lines, start)))
        i += 1
    return out


def all_blocks():
    return [b for path, text in DOCS for b in blocks_of(path, text)]


def torch_available():
    return subprocess.run(["/usr/bin/python3", "-c", "import torch.distributed"], capture_output=True).returncode == 0


def run(command, cwd, timeout=120, env=None, shell=False):
    full_env = dict(os.environ)
    # The examples' workers run `python3`: the system's, which has Debian's torch.
    full_env["PATH"] = os.pathsep.join([os.path.dirname(DDPRUN), "/usr/bin", full_env.get("PATH", "")])
    full_env.update(env or {})
    return subprocess.run(command, cwd=cwd, env=full_env, shell=shell, capture_output=True, text=True,
                          timeout=timeout, executable="/bin/bash" if shell else None)


BASE_JOB = {
    "": 'version = 1\n',
    "job": '[job]\nname = "demo"\ncommand = ["python3", "train.py"]\n',
    "cluster": '[cluster]\nnodes = ["gpu-01", "gpu-02", "gpu-03", "gpu-04"]\n',
    "restart": '[restart]\nmax_restarts = 3\n',
}


def sections(text):
    """{section name: its text}, "" for the lines before the first header."""
    out = {"": ""}
    name = ""
    for line in text.split("\n"):
        header = re.match(r"^\[([A-Za-z0-9_.]+)\]\s*(#.*)?$", line)
        array = re.match(r"^\[\[([A-Za-z0-9_.]+)\]\]\s*(#.*)?$", line)
        if header:
            name = header.group(1)
            out[name] = ""
        elif array:  # an array of tables: each entry its own part
            name = f"{array.group(1)}#{len(out)}"
            out[name] = ""
        out[name] = out.get(name, "") + line + "\n"
    return out


def diagnostics(result):
    """What `check` said about the file (its error, warning and note lines), not the plan."""
    return "\n".join(l for l in (result.stdout + result.stderr).split("\n")
                     if re.search(r"(error|warning|note|hint):|errors?, \d+ warning", l))


def merged_job(fragment):
    parts = dict(BASE_JOB)
    parts.update({k: v for k, v in sections(fragment).items() if k or v.strip()})
    if parts[""].strip() == "":
        parts[""] = BASE_JOB[""]
    return "".join(parts[k] for k in parts)


class DocsTest(unittest.TestCase):
    maxDiff = None

    def setUp(self):
        self.scratch = tempfile.mkdtemp(prefix="ddprun-docs-")
        # Job files name train.py; `check` says when it is missing, which the docs' outputs do not show.
        for script in ("train.py", "ddp_train.py"):
            with open(os.path.join(self.scratch, script), "w") as f:
                f.write("print('train')\n")

    def tearDown(self):
        shutil.rmtree(self.scratch, ignore_errors=True)

    def write(self, name, text):
        path = os.path.join(self.scratch, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_every_block_says_how_it_is_tested(self):
        blocks = all_blocks()
        self.assertGreaterEqual(len(blocks), 30)
        missing = [b.where + " (" + (b.lines[0] if b.lines else "") + ")" for b in blocks if not b.annotation]
        self.assertEqual(missing, [], "blocks without a `<!-- docs-test: ... -->` line above them")
        known = {"check", "check-fails", "output", "fragment", "session", "commands", "python",
                 "prometheus-config", "promql", "metrics", "not", "excerpt:"}
        unknown = [b.where + ": " + b.annotation for b in blocks if b.kind() not in known]
        self.assertEqual(unknown, [])
        for b in blocks:
            if b.kind() == "not":
                self.assertRegex(b.annotation, r"^not run: \S.{10,}", b.where + ": say why it cannot run")
                # The tests a reason names exist.
                for path in re.findall(r"\b(?:tests|bench|scripts)/[\w./-]+\w", b.annotation):
                    self.assertTrue(os.path.exists(os.path.join(SOURCE, path)), f"{b.where}: no {path}")

    def test_job_files_pass_check(self):
        count = 0
        for b in all_blocks():
            if b.kind() != "check":
                continue
            path = self.write(b.option("as", "job.toml"), b.text)
            result = run([DDPRUN, "check", path], self.scratch)
            self.assertEqual(result.returncode, 0, f"{b.where}: ddprun check\n{diagnostics(result)}")
            count += 1
        self.assertGreaterEqual(count, 2)

    def test_fragments_are_valid_parts_of_a_job_file(self):
        count = 0
        for b in all_blocks():
            if b.kind() != "fragment":
                continue
            job = merged_job(b.text)
            path = self.write("fragment.toml", job)
            result = run([DDPRUN, "check", path], self.scratch)
            said = diagnostics(result)
            self.assertEqual(result.returncode, 0, f"{b.where}: ddprun check of\n{job}\n{said}")
            self.assertNotIn("warning", said, f"{b.where}: ddprun check of\n{job}\n{said}")
            count += 1
        self.assertGreaterEqual(count, 5)

    def test_a_file_with_mistakes_prints_the_errors_shown(self):
        blocks = all_blocks()
        count = 0
        for i, b in enumerate(blocks):
            if b.kind() != "check-fails":
                continue
            self.assertLess(i + 1, len(blocks))
            shown = blocks[i + 1]
            self.assertEqual(shown.kind(), "output", f"{b.where}: the next block is its output")
            self.write("job.toml", b.text)
            result = run([DDPRUN, "check", "job.toml", "--color", "never"], self.scratch)
            self.assertEqual(result.returncode, int(b.option("exit", "2")), b.where)
            self.assertEqual((result.stdout + result.stderr).rstrip("\n"), shown.text.rstrip("\n"), shown.where)
            count += 1
        self.assertGreaterEqual(count, 1)

    def test_sessions_print_what_the_docs_show(self):
        saved = {}
        count = 0
        for b in all_blocks():
            if b.kind() == "check" and b.option("as"):
                saved[b.option("as")] = b.text
        for b in all_blocks():
            if b.kind() != "session":
                continue
            cwd = SOURCE
            if b.option("cwd") == "scratch":
                cwd = self.scratch
                for name, text in saved.items():
                    self.write(name, text)
            commands = []  # (command, expected lines)
            for line in b.lines:
                if line.startswith("$ "):
                    commands.append((line[2:], []))
                else:
                    self.assertTrue(commands, f"{b.where}: output before any `$ ` line")
                    commands[-1][1].append(line)
            for command, expected in commands:
                shown = re.sub(r"\s+#.*$", "", command)
                result = run(shown, cwd, shell=True)
                self.assertEqual(result.returncode, int(b.option("exit", "0")),
                                 f"{b.where}: {shown}\n{result.stdout}{result.stderr}")
                if shown.endswith("--json"):
                    json.loads(result.stdout)
                if expected:
                    printed = result.stdout
                    if b.option("shown-dir"):
                        printed = printed.replace(os.path.realpath(cwd), b.option("shown-dir")).replace(cwd, b.option("shown-dir"))
                    self.assertEqual(printed.rstrip("\n"), "\n".join(expected).rstrip("\n"),
                                     f"{b.where}: {shown}")
                count += 1
        self.assertGreaterEqual(count, 3)

    def test_command_blocks_run(self):
        # In a copy of examples/ and bench/: a real run writes its logs beside its job file.
        for folder in ("examples", "bench"):
            shutil.copytree(os.path.join(SOURCE, folder), os.path.join(self.scratch, folder))
        count = 0
        for b in all_blocks():
            if b.kind() != "commands":
                continue
            if b.option("needs") == "torch" and not torch_available():
                if "torch" in os.environ.get("DDPRUN_REQUIRE", "").split(","):
                    self.fail(f"{b.where}: /usr/bin/python3 has no torch (DDPRUN_REQUIRE names torch)")
                continue
            # Background agents are waited for, each of their exit codes counted. `job.toml=FILE`
            # runs a form written for "your job" on a real file.
            text = b.text
            for word in b.annotation.split()[1:]:
                if "=" in word and not word.startswith(("needs=", "timeout=", "exit=")):
                    placeholder, real = word.split("=", 1)
                    text = text.replace(placeholder, real)
            script = "set -e\n" + text + "for j in $(jobs -p); do wait $j; done\n"
            result = run(script, self.scratch, timeout=int(b.option("timeout", "300")), shell=True)
            self.assertEqual(result.returncode, int(b.option("exit", "0")),
                             f"{b.where}:\n{b.text}\n{result.stdout[-4000:]}{result.stderr[-4000:]}")
            count += 1
        self.assertGreaterEqual(count, 2)

    def test_inline_commands_run(self):
        """Every `ddprun ...` the prose shows that runs as written here (its files are in examples/
        or the scratch folder, no placeholder) exits as a user would expect: 0, or 2 with the
        `ddprun init` pointer when it is typed as torchrun or python."""
        shutil.copytree(os.path.join(SOURCE, "examples"), os.path.join(self.scratch, "examples"))
        shutil.copytree(os.path.join(SOURCE, "bench"), os.path.join(self.scratch, "bench"))
        spans = sorted({span for _, text in DOCS for span in re.findall(r"`(ddprun [^`\n]+)`", text)})
        ran = []
        for span in spans:
            words = span.split()
            if len(words) < 2 or (words[1] in ("check", "init", "--simulate") and len(words) == 2):
                continue  # the subcommand named, not a command line
            if any(re.search(r"[<>\[\]|]|\.\.\.|^[A-Z]+$|job\.toml|^logs", w) for w in words[1:]):
                continue  # a form with placeholders: its flags are checked by the flag test
            runnable = words[1] in ("check", "init", "schema", "--simulate", "--version") or words[1].endswith(".py") \
                or words[1].startswith("--nproc")
            paths = [w for w in words[1:] if "/" in w or w.endswith((".toml", ".py"))]
            if not runnable or not all(os.path.exists(os.path.join(self.scratch, p)) for p in paths if
                                       not p.endswith((".html", ".json", ".svg"))):
                continue
            habit = words[1].endswith(".py") or words[1].startswith("--nproc")
            result = run(span, self.scratch, timeout=300, shell=True)
            said = (result.stdout + result.stderr)[-3000:]
            if habit:
                self.assertEqual(result.returncode, 2, f"{span}\n{said}")
                self.assertIn("`ddprun init --script", said, span)
            else:
                self.assertEqual(result.returncode, 0, f"{span}\n{said}")
            ran.append(span)
        self.assertGreaterEqual(len(ran), 10, ran)
        print(f"\n{len(ran)} inline commands ran: " + "; ".join(ran), file=sys.stderr)

    def test_excerpts_are_what_the_commands_print(self):
        for folder in ("examples", "bench"):
            shutil.copytree(os.path.join(SOURCE, folder), os.path.join(self.scratch, folder))
        count = 0
        outputs = {}
        for b in all_blocks():
            if b.kind() != "excerpt:":
                continue
            command = b.annotation[len("excerpt:"):].strip()
            if command not in outputs:
                result = run(command, self.scratch, timeout=300, shell=True)
                outputs[command] = [l.strip() for l in result.stdout.split("\n")]
            printed = outputs[command]
            for line in b.lines:
                shown = line.strip()
                if not shown or "..." in shown:
                    continue
                self.assertIn(shown, printed, f"{b.where}: `{command}` does not print this line")
                count += 1
        self.assertGreaterEqual(count, 10)

    def test_python_compiles(self):
        for b in all_blocks():
            if b.kind() == "python":
                compile(b.text, b.where, "exec")

    def test_prometheus_blocks(self):
        promtool = shutil.which("promtool")
        if not promtool:
            if "prometheus" in os.environ.get("DDPRUN_REQUIRE", ""):
                self.fail("promtool is not installed (DDPRUN_REQUIRE names prometheus)")
            self.skipTest("promtool is not installed")
        with open(DDPRUN, "rb") as f:
            binary = f.read()
        count = 0
        for b in all_blocks():
            if b.kind() == "prometheus-config":
                path = self.write("prometheus.yml", b.text)
                result = run([promtool, "check", "config", "--syntax-only", path], self.scratch)
                self.assertEqual(result.returncode, 0, f"{b.where}: {result.stdout}{result.stderr}")
            elif b.kind() == "promql":
                rules = "groups:\n  - name: docs\n    rules:\n"
                for i, line in enumerate(l for l in b.lines if l.strip()):
                    rules += f"      - record: docs:expr{i}\n        expr: {json.dumps(line.strip())}\n"
                path = self.write("rules.yml", rules)
                result = run([promtool, "check", "rules", path], self.scratch)
                self.assertEqual(result.returncode, 0, f"{b.where}: {result.stdout}{result.stderr}")
            elif b.kind() == "metrics":
                path = self.write("metrics.prom", b.text)
                result = run(f"{promtool} check metrics < {path}", self.scratch, shell=True)
                # An excerpt leaves out the HELP and TYPE lines; anything else is a mistake.
                problems = [l for l in (result.stdout + result.stderr).split("\n")
                            if l.strip() and not l.endswith("no help text")]
                self.assertEqual(problems, [], b.where)
                for line in b.lines:
                    name = re.match(r"^([a-z_]+)", line)
                    if name:
                        self.assertIn(name.group(1).encode(), binary, f"{b.where}: ddprun serves no {name.group(1)}")
            else:
                continue
            count += 1
        self.assertGreaterEqual(count, 3)

    def test_the_runner_map_names_every_header(self):
        # runner/README.md is the map at runner/'s door: every header of its three layers is on
        # it, in its own layer's section, and nothing that is gone.
        text = dict(DOCS)["runner/README.md"]
        parts = re.split(r"^## (core|host|io):", text, flags=re.M)
        sections = {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}
        self.assertEqual(sorted(sections), ["core", "host", "io"])
        for layer, section in sections.items():
            folder = os.path.join(SOURCE, "runner", layer)
            headers = sorted(n for n in os.listdir(folder) if n.endswith(".h"))
            named = sorted(set(re.findall(r"[a-z_0-9]+\.h", section)))
            self.assertEqual(named, headers, f"runner/README.md, section {layer}")

    def test_every_flag_the_docs_name_is_the_binarys(self):
        helps = {}
        for sub in [""] + SUBCOMMANDS:
            result = run([DDPRUN] + ([sub] if sub else []) + ["--help"], SOURCE)
            helps[sub] = result.stdout + result.stderr
        every = set(re.findall(r"--[a-z][a-z0-9_-]+", "".join(helps.values())))
        wrong = []
        checked = 0
        for path, text in DOCS:
            for span in re.findall(r"`([^`\n]+)`", text):
                if span.startswith("ddprun "):
                    words = span.split()
                    sub = words[1] if len(words) > 1 and words[1] in SUBCOMMANDS else "run"
                    if "--simulate" in words:
                        sub = "simulate"
                    own = span.split(" -- ")[0]
                    known = set(re.findall(r"--[a-z][a-z0-9_-]+", helps[sub] + helps[""]))
                    flags = re.findall(r"(?<![\w-])--[a-z][a-z0-9_-]+", own)
                    if any(FOREIGN_FLAGS.get(flag) == "torchrun" for flag in flags):
                        # Typed from torchrun habit: ddprun answers with the init command.
                        result = run(span, self.scratch, shell=True)
                        checked += 1
                        if result.returncode != 2 or "`ddprun init --script" not in result.stderr + result.stdout:
                            wrong.append(f"{path}: `{span}` prints no `ddprun init` command: {result.stderr}")
                        continue
                    for flag in flags:
                        checked += 1
                        if flag not in known:
                            wrong.append(f"{path}: `{span}`: ddprun {sub} has no {flag}")
                elif re.match(r"--[a-z][a-z0-9_-]+", span):
                    flag = re.match(r"--[a-z][a-z0-9_-]+", span).group(0)
                    checked += 1
                    if flag not in every and flag not in FOREIGN_FLAGS:
                        wrong.append(f"{path}: `{span}`: no ddprun command has {flag}")
        self.assertEqual(wrong, [])
        self.assertGreaterEqual(checked, 50)


def main():
    global DDPRUN, SOURCE, DOCS
    DDPRUN = os.path.abspath(sys.argv.pop(1))
    SOURCE = os.path.abspath(sys.argv.pop(1))
    names = ["README.md", "runner/README.md"] + sorted(
        "docs/" + n for n in os.listdir(os.path.join(SOURCE, "docs")) if n.endswith(".md"))
    for name in names:
        with open(os.path.join(SOURCE, name)) as f:
            DOCS.append((name, f.read()))
    unittest.main()


if __name__ == "__main__":
    main()

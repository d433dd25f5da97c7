#!/usr/bin/env python3
"""The repository's structural rules, checked over product code (docs/STYLE.md):

  size      no product source file over 800 lines, no function body over 120 lines
  getenv    no getenv in product code: options come from the config, at the edge
  layering  no file under client/ includes a cohort/server header
  format    product code is formatted by the repository's .clang-format (where clang-format
            is not installed: a message, and exit 77, which CTest reports as skipped)

Product code is every .cc/.h/.cu/.cuh file outside tests/, bench/, build folders and test sources
(*_test.cc, test_*.cc, *_fuzz.cc). Prints one line per violation and exits 1 if there is any.
Usage: check_hygiene.py [--root DIR] [--only size,getenv,layering,format]
"""

import argparse
import os
import re
import shutil
import subprocess
import sys

MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 120
SOURCE_SUFFIXES = (".cc", ".h", ".cu", ".cuh")
SKIP_DIRS = {"tests", "bench", "examples", "deploy", ".git", ".ci"}


def product_files(root):
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        top = rel.split(os.sep)[0]
        if rel != "." and (top in SKIP_DIRS or top.startswith("build") or top.startswith(".")):
            dirnames[:] = []
            continue
        for f in filenames:
            if not f.endswith(SOURCE_SUFFIXES):
                continue
            if re.search(r"(_test\.(cc|cu|h)|^test_.*\.cc|_fuzz\.cc|test_util\.h|test_plugin\.cc)$", f):
                continue
            out.append(os.path.normpath(os.path.join(rel, f)))
    return sorted(out)


def strip_comments_and_strings(text):
    """Blanks comments and string/char literals, keeping newlines so line numbers hold."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c == 'R' and text.startswith('R"', i):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = ")" + m.group(1) + '"'
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c in "\"'":
            # A digit separator (1'000) is not a character literal.
            if c == "'" and i > 0 and text[i - 1].isalnum() and i + 1 < n and text[i + 1].isalnum():
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + (c if j < n else ""))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


CONTAINER = re.compile(r"\s*(template\s*<[^{]*>\s*)?(inline\s+)?(namespace|class|struct|union|enum|extern)\b")
CONTROL = re.compile(r"^\s*(if|for|while|switch|catch|else|do|try)\b")


def long_functions(path, text):
    """Outermost function bodies (free functions, methods in class bodies, namespace-scope
    lambdas) longer than MAX_FUNCTION_LINES, as (first line, lines)."""
    code = strip_comments_and_strings(text)
    stack = []  # per open brace: "container", "function" or "other", and its line
    found = []
    head_start = 0
    line = 1
    for i, c in enumerate(code):
        if c == "\n":
            line += 1
        elif c in ";":
            head_start = i + 1
        elif c == "{":
            head = code[head_start:i]
            in_container = all(kind == "container" for kind, _ in stack)
            head = re.sub(r"^\s*#.*$", "", head, flags=re.M)  # preprocessor lines
            if CONTAINER.match(head):
                kind = "container"
            elif in_container and ")" in head and not CONTROL.match(head) and not head.rstrip().endswith("="):
                kind = "function"
            else:
                kind = "other"
            stack.append((kind, line))
            head_start = i + 1
        elif c == "}":
            if stack:
                kind, start = stack.pop()
                if kind == "function" and line - start + 1 > MAX_FUNCTION_LINES:
                    found.append((start, line - start + 1))
            head_start = i + 1
    return found


def check_size(root, files):
    bad = []
    for f in files:
        with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        lines = text.count("\n")
        if lines > MAX_FILE_LINES:
            bad.append(f"size: {f} has {lines} lines (at most {MAX_FILE_LINES})")
        for start, n in long_functions(f, text):
            bad.append(f"size: {f}:{start}: a function of {n} lines (at most {MAX_FUNCTION_LINES})")
    return bad


def check_getenv(root, files):
    bad = []
    for f in files:
        with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
            code = strip_comments_and_strings(fh.read())
        for no, text in enumerate(code.splitlines(), 1):
            if re.search(r"\b(secure_)?getenv\b", text):
                bad.append(f"getenv: {f}:{no}: product code reads the environment; take an option instead")
    return bad


def check_layering(root, files):
    bad = []
    for f in files:
        if not f.startswith("client" + os.sep):
            continue
        with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
            for no, text in enumerate(fh, 1):
                if re.match(r'\s*#\s*include\s*[<"]cohort/server/', text):
                    bad.append(f"layering: {f}:{no}: client/ includes a server header (client sits below server)")
    return bad


class NotChecked(Exception):
    pass


def check_format(root, files):
    exe = shutil.which("clang-format") or shutil.which("clang-format-14")
    if not exe:
        raise NotChecked("format: clang-format is not installed (Debian: clang-format), not checked")
    if not os.path.exists(os.path.join(root, ".clang-format")):
        return ["format: no .clang-format at the repository root"]
    bad = []
    for k in range(0, len(files), 50):
        batch = files[k:k + 50]
        r = subprocess.run([exe, "--dry-run", "--Werror", "--style=file", *batch], cwd=root,
                           capture_output=True, text=True)
        if r.returncode != 0:
            names = sorted({m.group(1) for m in re.finditer(r"^(\S+?):\d+:\d+: error", r.stderr, re.M)})
            bad.extend(f"format: {n} is not formatted (clang-format -i --style=file {n})" for n in names)
            if not names:
                bad.append("format: clang-format failed: " + r.stderr.strip()[:300])
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    ap.add_argument("--only", default="size,getenv,layering,format")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    files = product_files(root)
    if not files:
        print("no product source files found under " + root, file=sys.stderr)
        return 1
    checks = {"size": check_size, "getenv": check_getenv, "layering": check_layering, "format": check_format}
    bad = []
    skipped = []
    for name in args.only.split(","):
        try:
            bad += checks[name](root, files)
        except NotChecked as e:
            skipped.append(str(e))
    for b in bad:
        print(b)
    for s in skipped:
        print(s, file=sys.stderr)
    print(f"{len(files)} product files checked ({args.only}): {len(bad)} violation(s)", file=sys.stderr)
    if bad:
        return 1
    return 77 if skipped else 0


if __name__ == "__main__":
    sys.exit(main())

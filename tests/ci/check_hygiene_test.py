#!/usr/bin/env python3
"""check_hygiene.py finds what it is there to find: a temporary repository with one violation of
each rule must fail with a line naming each, and the same tree without them must pass."""

import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def write(root, path, text):
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w") as f:
        f.write(text)


def run(root, only):
    r = subprocess.run([sys.executable, os.path.join(HERE, "check_hygiene.py"), "--root", root, "--only", only],
                       capture_output=True, text=True)
    return r.returncode, r.stdout


def main():
    failures = []
    with tempfile.TemporaryDirectory() as root:
        body = "\n".join(f"  x += {i};" for i in range(130))
        write(root, "core/long.cc", "namespace a {\nint f(int x) {\n" + body + "\n  return x;\n}\n}  // namespace a\n")
        write(root, "core/big.h", "// big\n" * 801)
        write(root, "core/env.cc", '#include <cstdlib>\nconst char* v() { return std::getenv("HOME"); }\n')
        write(root, "client/up.cc", '#include "cohort/server/server.h"\n')
        # Not product code: tests, benchmarks and strings/comments that mention getenv.
        write(root, "tests/t.cc", 'const char* v() { return getenv("X"); }\n')
        write(root, "core/ok.cc", '// getenv is named in a comment\nconst char* s = "getenv";\n')
        code, out = run(root, "size,getenv,layering")
        expect = ["core/long.cc:2: a function of 133 lines", "core/big.h has 801 lines", "getenv: core/env.cc:2",
                  "layering: client/up.cc:1"]
        if code != 1:
            failures.append(f"violations: exit {code}, expected 1")
        for e in expect:
            if e not in out:
                failures.append(f"not reported: {e!r} in:\n{out}")
        if "tests/t.cc" in out or "core/ok.cc" in out:
            failures.append("reported a file that is not product code or a mention in a comment/string:\n" + out)
        for path in ["core/long.cc", "core/big.h", "core/env.cc", "client/up.cc"]:
            os.remove(os.path.join(root, path))
        code, out = run(root, "size,getenv,layering")
        if code != 0:
            failures.append(f"clean tree: exit {code}, output:\n{out}")
    for f in failures:
        print("FAIL: " + f)
    print(f"check_hygiene self-test: {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

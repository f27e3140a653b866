"""The README's first Python example (section "## Using it"), copied out of README.md and run as a
user would on a machine without a GPU: it must pick the CPU and run the Triton kernel interpreted at
its small shapes, every verdict passing."""

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def first_example() -> str:
    section = (REPO / "README.md").read_text().split("\n## Using it\n", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_first_readme_example_runs_as_copied_on_a_cpu(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(first_example())
    # no GPU visible, TRITON_INTERPRET unset: the example itself must choose the CPU and set it
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"CUDA_VISIBLE_DEVICES": "",
                                                                              "PYTHONPATH": path}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "None", lines  # impl.unsupported(x): it runs here
    assert re.match(r"err_out=\S+ \(tol 1e-02\) err_state=\S+ \(tol 1e-02\) err_steps=\S+ \(tol \S+, \d+ steps\)$",
                    lines[1]), lines  # a passing verdict: no problems after it
    # frozen verify (one step: nothing is stored) and replay (its ring's L + 1 steps), both passing
    verdict = r"err_out=\S+ \(tol 1e-02\) err_state=\S+ \(tol 1e-02\) err_steps=\S+ \(tol \S+, \d+ steps\)"
    assert re.fullmatch(f"{verdict} {verdict}", lines[2]), lines
    assert re.findall(r"(\d+) steps", lines[2]) == ["1", "9"], lines

"""A Codex-shaped session: Codex CLI 0.169's two coding tools (`exec_command`, a function, and
`apply_patch`, a free-form custom tool) over a simulated workspace, and a scripted run of
them, for the demo and tests of the Responses protocol.
"""

from __future__ import annotations

import shlex
from typing import Any

from tokentrail.sim.harness import Workspace

CODEX_TOOLS: list[dict[str, Any]] = [
    {
        "name": "exec_command",
        "description": "Runs a command in a PTY, returning output or a session ID.",
        "input_schema": {
            "type": "object",
            "properties": {
                "cmd": {"type": "string", "description": "Shell command to execute."},
                "workdir": {"type": "string"},
                "yield_time_ms": {"type": "number"},
            },
            "required": ["cmd"],
            "additionalProperties": False,
        },
    },
    {
        "name": "apply_patch",
        "type": "custom",
        "description": "Use the `apply_patch` tool to edit files. This is a FREEFORM tool.",
    },
]

CALC = "def add(a, b):\n    return a+b\n"
TEST = "from calc import add\nassert add(2, 3) == 5\nprint('ok')\n"
BAD_PATCH = (
    "*** Begin Patch\n*** Update File: calc.py\n@@\n-    return a +  b\n+    return a + b\n"
    "*** End Patch\n"
)
GOOD_PATCH = (
    "*** Begin Patch\n*** Update File: calc.py\n@@\n-    return a+b\n+    return a + b  \n"
    "*** End Patch\n"
)


def _call(name: str, **arguments: str) -> dict[str, Any]:
    return {"type": "tool_use", "name": name, "input": arguments}


# Reply by reply: read, two commands in parallel, a patch that does not apply, one that does,
# the test, the answer; then a resumed turn's command and answer.
CODEX_SCRIPT: list[list[dict[str, Any]]] = [
    [
        {"type": "thinking", "thinking": "Read calc.py before changing it."},
        {"type": "text", "text": "Looking at the code."},
        _call("exec_command", cmd="cat calc.py"),
    ],
    [_call("exec_command", cmd="ls"), _call("exec_command", cmd="cat test_calc.py")],
    [
        {"type": "thinking", "thinking": "Add spaces around +."},
        _call("apply_patch", input=BAD_PATCH),
    ],
    [
        {"type": "text", "text": "The context was wrong; retrying."},
        _call("apply_patch", input=GOOD_PATCH),
    ],
    [_call("exec_command", cmd="python3 test_calc.py")],
    [{"type": "text", "text": "calc.py now spaces its sum and the test passes."}],
    [_call("exec_command", cmd="cat calc.py")],
    [{"type": "text", "text": "calc.py is as it should be."}],
]
CODEX_FILES = {"calc.py": CALC, "test_calc.py": TEST}


class CodexWorkspace(Workspace):
    """`exec_command` (cat, ls, python3 as a passing run) and `apply_patch` (Add File and
    Update File hunks, applied exactly or refused) over in-memory files."""

    def _run(self, name: str, args: dict[str, Any]) -> tuple[str, bool]:
        if name == "exec_command":
            return self._exec(str(args.get("cmd", "")))
        if name == "apply_patch":
            return self._patch(str(args.get("input", "")))
        return f"unsupported call: {name}", True

    def _exec(self, cmd: str) -> tuple[str, bool]:
        words = shlex.split(cmd)
        if words[:1] == ["ls"]:
            return "\n".join(sorted(self.files)) + "\n", False
        if words[:1] == ["cat"] and len(words) == 2:
            if words[1] not in self.files:
                return f"cat: {words[1]}: No such file or directory\n", True
            return self.files[words[1]], False
        if words[:1] == ["python3"]:
            return "ok\n", False
        return f"Process exited with code 127\n{words[:1]}: command not found\n", True

    def _patch(self, patch: str) -> tuple[str, bool]:
        lines = patch.split("\n")
        if lines[:1] != ["*** Begin Patch"]:
            return "apply_patch verification failed: missing *** Begin Patch", True
        changed: dict[str, str] = {}
        path: str | None = None
        old: list[str] = []
        new: list[str] = []
        for line in [*lines[1:], "*** End Patch"]:
            if line.startswith(("*** Update File: ", "*** Add File: ", "*** End Patch")):
                if path is not None:
                    result = self._hunk(path, old, new, changed)
                    if result is not None:
                        return result, True
                path = line.split(": ", 1)[1] if ": " in line else None
                old, new = [], []
                if line.startswith("*** Add File: ") and path is not None:
                    changed[path] = ""
            elif line.startswith("-"):
                old.append(line[1:])
            elif line.startswith("+"):
                new.append(line[1:])
        self.files.update(changed)
        names = "\n".join(f"M {p}" for p in changed)
        return f"Success. Updated the following files:\n{names}\n", False

    def _hunk(
        self, path: str, old: list[str], new: list[str], changed: dict[str, str]
    ) -> str | None:
        text = changed.get(path, self.files.get(path))
        if text is None:
            return f"apply_patch verification failed: no file {path}"
        before, after = "\n".join(old), "\n".join(new)
        if old and before not in text:
            return f"apply_patch verification failed: Failed to find expected lines in {path}"
        changed[path] = text.replace(before, after, 1) if old else text + after + "\n"
        return None

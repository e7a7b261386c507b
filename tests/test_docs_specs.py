"""docs/specs.md, followed literally in a temporary copy of the repository.

The guide's fenced blocks carry an info string saying what to do with them:

- ```` ```LANG file=PATH ````: create PATH (relative to the repository root) with the block's text;
- ```` ```LANG edit=PATH old ```` then ```` ```LANG edit=PATH new ````: the old text must occur exactly
  once in PATH; it is replaced by the new text (what a person does in an editor);
- ```` ```bash run ````: run with bash from the repository root; it must exit 0;
- ```` ```bash gpu ````: the same, only in the GPU test (pytest -m gpu);
- ```` ```text expect ````: every non-empty line must occur in the output of the previous command;
- any other block (plain ```` ```bash ````, ...) is shown to the reader and not executed.

The copy runs with PYTHONPATH pointing at it (so its edited specs are the ones loaded), a fresh
GDNJIT_CACHE_DIR, and ``gdnjit`` / ``python`` commands on PATH that run this interpreter on the copy.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "specs.md"
FENCE = re.compile(r"^```(.*)$")


def parse_blocks(text: str) -> list[dict]:
    """Fenced blocks in order: {lang, attrs (key=value), flags (bare words), text, line}."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        words = m.group(1).split()
        start, body = i + 1, []
        i += 1
        while i < len(lines) and lines[i] != "```":
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise AssertionError(f"docs/specs.md:{start}: unterminated code block")
        i += 1
        attrs = dict(w.split("=", 1) for w in words[1:] if "=" in w)
        flags = {w for w in words[1:] if "=" not in w}
        blocks.append(dict(lang=words[0] if words else "", attrs=attrs, flags=flags,
                           text="\n".join(body) + "\n", line=start))
    return blocks


BLOCKS = parse_blocks(GUIDE.read_text())


def _copy_repo(dst: Path) -> Path:
    ignore = shutil.ignore_patterns(".git", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", "*.egg-info",
                                    ".hypothesis", "build", "dist", ".venv", "venv", "node_modules", "shared")
    shutil.copytree(ROOT, dst, ignore=ignore)
    return dst


def _env(tmp: Path, repo: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GDNJIT_")}
    bindir = tmp / "bin"
    bindir.mkdir()
    # `gdnjit` and `python` in the guide's commands: this interpreter, on the copy (PYTHONPATH)
    exe = shlex.quote(sys.executable)
    for name, target in (("gdnjit", f"{exe} -m gdnjit.cli"), ("python", exe)):
        shim = bindir / name
        shim.write_text(f"#!/bin/sh\nexec {target} \"$@\"\n")
        shim.chmod(shim.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    env.update(PYTHONPATH=str(repo), GDNJIT_CACHE_DIR=str(tmp / "cache"), PATH=f"{bindir}{os.pathsep}{env['PATH']}",
               PYTHONDONTWRITEBYTECODE="1")
    return env


def follow_guide(tmp: Path, gpu: bool) -> dict:
    """Apply every block of the guide in order; returns what happened (for the assertions)."""
    repo = _copy_repo(tmp / "repo")
    env = _env(tmp, repo)
    done = {"files": [], "edits": [], "commands": [], "outputs": {}}
    last_out, last_cmd, pending_old = None, None, None
    for blk in BLOCKS:
        where = f"docs/specs.md:{blk['line']}"
        attrs, flags, text = blk["attrs"], blk["flags"], blk["text"]
        if "file" in attrs:
            path = repo / attrs["file"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            done["files"].append(attrs["file"])
        elif "edit" in attrs:
            path = repo / attrs["edit"]
            if "old" in flags:
                assert pending_old is None, f"{where}: two 'old' blocks in a row"
                pending_old = (attrs["edit"], text)
            else:
                assert "new" in flags and pending_old is not None and pending_old[0] == attrs["edit"], \
                    f"{where}: a 'new' block must follow an 'old' block for the same file"
                content = path.read_text()
                count = content.count(pending_old[1])
                assert count == 1, f"{where}: the text to replace occurs {count} times in {attrs['edit']}, expected once"
                path.write_text(content.replace(pending_old[1], text))
                done["edits"].append((attrs["edit"], pending_old[1], text))
                pending_old = None
        elif blk["lang"] == "bash" and ("run" in flags or ("gpu" in flags and gpu)):
            res = subprocess.run(["bash", "-e", "-c", text], cwd=repo, env=env, capture_output=True, text=True,
                                 timeout=900)
            last_out, last_cmd = res.stdout + res.stderr, text.strip()
            assert res.returncode == 0, f"{where}: `{last_cmd}` exited {res.returncode}:\n{last_out}"
            done["commands"].append(last_cmd)
            done["outputs"][last_cmd] = last_out
        elif blk["lang"] == "bash" and "gpu" in flags:
            last_out = last_cmd = None  # not run here: its expect block is skipped too
        elif blk["lang"] == "text" and "expect" in flags:
            if last_cmd is None:
                continue
            for line in text.splitlines():
                if line.strip():
                    assert line.strip() in last_out, \
                        f"{where}: expected {line.strip()!r} in the output of `{last_cmd}`:\n{last_out}"
    assert pending_old is None, "an 'old' edit block without its 'new' block"
    done["repo"], done["cache"] = repo, tmp / "cache"
    return done


def sidecars(cache: Path) -> list[dict]:
    out = []
    for p in cache.rglob("*.json"):
        meta = json.loads(p.read_text())
        if isinstance(meta, dict) and "fields" in meta:
            out.append(meta)
    return out


def test_guide_has_the_required_steps():
    runs = [b["text"] for b in BLOCKS if b["lang"] == "bash" and "run" in b["flags"]]
    files = [b["attrs"]["file"] for b in BLOCKS if "file" in b["attrs"]]
    edits = [b["attrs"]["edit"] for b in BLOCKS if "edit" in b["attrs"]]
    assert any(f.endswith(".yaml") for f in files), "a new shapes file"
    assert edits.count("gdnjit/specs/gdn.yaml") >= 4, "the tunable value and the rule: two old/new pairs"
    for needle in ("gdnjit spec validate", "gdnjit spec show gdn --B", "--dry-run"):
        assert any(needle in r for r in runs), needle
    assert any(r.startswith("gdnjit warm") and "--dry-run" not in r for r in runs), "a real warm"
    # part E: a new op is a spec, a template and an op module, validated, shown, rendered, warmed and called
    for f in ("gdnjit/specs/scale_rows.yaml", "gdnjit/templates/scale_rows.cu.j2", "gdnjit/scale_rows.py"):
        assert f in files, f
    for needle in ("gdnjit spec validate scale_rows", "gdnjit render scale_rows", "--shapes my_shapes/scale.yaml",
                   "check_scale_cpu.py"):
        assert any(needle in r for r in runs), needle
    # every block the tests act on is tagged correctly; untagged yaml/python blocks would be silently skipped
    for b in BLOCKS:
        if b["lang"] in ("yaml", "python"):
            assert "file" in b["attrs"] or "edit" in b["attrs"], f"docs/specs.md:{b['line']}: untagged {b['lang']} block"


def test_guide_followed_literally(tmp_path):
    before = (ROOT / "gdnjit/specs/gdn.yaml").read_text()
    done = follow_guide(tmp_path, gpu=False)

    # the spec edits changed the copy, never the repository itself
    assert (ROOT / "gdnjit/specs/gdn.yaml").read_text() == before
    assert (done["repo"] / "gdnjit/specs/gdn.yaml").read_text() != before

    # every variant the final dry run listed was compiled by the warm, and the sidecars say so
    warm = [c for c in done["commands"] if c.startswith("gdnjit warm") and "--dry-run" not in c]
    dry = [c for c in done["commands"] if c.startswith("gdnjit warm") and "--dry-run" in c]
    assert warm and dry
    n_planned = int(re.search(r"(\d+) variants for", done["outputs"][dry[-1]]).group(1))
    metas = [m for m in sidecars(done["cache"]) if m["fields"]["spec"] == "gdn"]
    assert len(metas) == n_planned
    # the new shape set: every compiled variant is the new model's (K=128, V=256) on sm_90
    assert {(m["fields"]["params"]["K"], m["fields"]["params"]["V"], m["fields"]["arch"]) for m in metas} == \
        {(128, 256, "sm_90")}
    assert {m["fields"]["params"]["T"] for m in metas} == {1, 2, 3, 4}
    # the new tunable value was compiled, by the new rule's params only, without spills
    new = [m for m in metas if m["fields"]["tunables"]["tile_v"] == 256]
    assert new, "no compiled variant uses tile_v=256"
    for m in new:
        p = m["fields"]["params"]
        assert (p["T"], p["state_dtype"], p["layout"]) == (1, "bf16", "klast")
        assert m["fields"]["values"]["num_warps"] == 16 and "tile_v=256" in m["variant"]
        assert m["spill_bytes"] == 0
    assert all(m["spill_bytes"] == 0 for m in metas)


@pytest.mark.gpu
def test_guide_followed_literally_with_gpu_steps(tmp_path):
    done = follow_guide(tmp_path, gpu=True)
    gpu_cmds = [b["text"].strip() for b in BLOCKS if b["lang"] == "bash" and "gpu" in b["flags"]]
    assert gpu_cmds and all(c in done["commands"] for c in gpu_cmds)

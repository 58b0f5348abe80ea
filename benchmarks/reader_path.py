"""The reader's path of MAGRPO's step: which functions of the library run from ``train()`` to the
first ``optimizer.step()``, and how many lines a reader opens to follow them (issue 41, part 2).

Method: a profile hook records every Python function of ``adapters/`` and
``collab_env/policy.py`` called while a tiny MAGRPO run (tiny random chat model, 2 agents,
1 turn, 2 generations, one training item) goes from ``MAGRPOTrainer.train`` to its first
``optimizer.step()``; each function counts from its ``def`` (decorators included) to its last
line. "Files opened" are the files those functions live in.

    .venv/bin/python benchmarks/reader_path.py [--json benchmarks/results/reader_path.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WATCHED = (ROOT / "adapters", ROOT / "collab_env" / "policy.py")


class _Done(Exception):
    """Raised by the patched optimizer step: the path ends there."""


def _watched(filename: str) -> bool:
    p = Path(filename).resolve()
    return any(p == w or w in p.parents for w in WATCHED)


def measure() -> dict[str, Any]:
    import torch

    from collab_env.adapters.magrpo import MAGRPOConfig, MAGRPOTrainer
    from collab_env.tasks.cooperative import formatters, length_ratio_rows, reward_func
    from collab_env.testing.tiny_model import build_tiny_chat_model, load_tiny_chat_model

    def stop(*a: Any, **k: Any) -> None:
        raise _Done

    # patched before the trainer is built: its learning-rate schedule wraps the bound step
    original = {cls: cls.step for cls in (torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD)}
    for cls in original:
        cls.step = stop  # type: ignore[method-assign]
    work = Path(tempfile.mkdtemp(prefix="reader-path-"))
    model, tok = load_tiny_chat_model(build_tiny_chat_model(work / "tiny"))
    args = MAGRPOConfig(num_agents=2, num_generations=2, num_turns=1, max_new_tokens=4, eval_interval=0,
                        logging_steps=1, learning_rate=1e-2, output_dir=str(work / "out"), plot=False)
    trainer = MAGRPOTrainer(agent_model=model, tokenizer=tok, num_agents=2, formatters=formatters,
                            reward_func=reward_func, train_dataset=length_ratio_rows("train")[:1], args=args)
    seen: dict[tuple[str, int], Any] = {}

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and _watched(frame.f_code.co_filename):
            code = frame.f_code
            seen.setdefault((code.co_filename, code.co_firstlineno), code)

    sys.setprofile(hook)
    try:
        trainer.train()
    except _Done:
        pass
    finally:
        sys.setprofile(None)
        for cls, step in original.items():
            cls.step = step  # type: ignore[method-assign]
    functions = []
    for (filename, first), code in sorted(seen.items()):
        if code.co_name in ("<module>", "<genexpr>", "<listcomp>", "<dictcomp>", "<setcomp>", "<lambda>"):
            continue
        last = max((line for _, _, line in code.co_lines() if line is not None), default=first)
        functions.append({"file": str(Path(filename).resolve().relative_to(ROOT)), "function": code.co_qualname,
                          "first": first, "lines": last - first + 1})
    # a nested function's lines are inside its parent's: count each line once
    spans: dict[str, set[int]] = {}
    for f in functions:
        spans.setdefault(f["file"], set()).update(range(f["first"], f["first"] + f["lines"]))
    files = sorted(spans)
    file_lines = {f: len((ROOT / f).read_text().splitlines()) for f in files}
    on_path = {f: len(s) for f, s in spans.items()}
    learner = "adapters/magrpo.py"
    return {
        "files_opened": len(files),
        "lines_of_those_files": sum(file_lines.values()),
        "functions_on_path": len(functions),
        "lines_on_path": sum(on_path.values()),
        "outside_learner": sum(v for f, v in on_path.items() if f != learner),
        "per_file": {f: {"file_lines": file_lines[f], "on_path": on_path[f]} for f in files},
        "functions": functions,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, help="also write the full result here")
    a = p.parse_args()
    r = measure()
    print("| file | lines | on the path |\n|---|---|---|")
    for f, v in r["per_file"].items():
        print(f"| {f} | {v['file_lines']} | {v['on_path']} |")
    print(f"\nfiles opened {r['files_opened']}, lines of those files {r['lines_of_those_files']}, "
          f"functions on the path {r['functions_on_path']}, lines on the path {r['lines_on_path']}, "
          f"outside adapters/magrpo.py {r['outside_learner']}")
    if a.json:
        a.json.write_text(json.dumps(r, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""The judge validity check (collab_env.eval.judge_check) on the judges at hand: the table a judged
column must clear before it is reported.

Judges: the embedded SmolLM2-135M-Instruct as the ``accuracy`` judge (log-prob verdicts,
``P(true)``), the judge double of the exploit audit
(:class:`~collab_env.testing.judge_injection.FenceReadingJudge`, which never reads the
conversation inside the rubric's fences) and the rule-reading judge double
(:class:`~collab_env.testing.judge_conversations.ReferenceReadingJudge`, which does what the
rubric asks by rule: the check's positive control). ``--model PATH`` adds a real model as the
judge's backend (the GPU form).

Writes ``benchmarks/results/judge_validity.{json,md}`` with the command, the wall time and the
machine's load over the run (timings are secondary here: the verdicts are what matter)::

    nice -n 10 .venv/bin/python -m benchmarks.judge_validity --items 40

``--write-cards`` (no judging) turns the embedded judge's row of that file into the leaderboard's
validity card (``collab_env/leaderboard/judge_cards.json``, read by
:func:`collab_env.leaderboard.board.judge_card`) for the tracks whose judge is the embedded model
with ``judge_prefill``: the row's verdicts are log-prob verdicts, which a reply prefix does not
change (the prefix is for generated replies only), so the card holds for it::

    .venv/bin/python -m benchmarks.judge_validity --write-cards
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._machine import LoadMeter  # noqa: E402
from collab_env.eval.judge_check import MAX_ECE, MIN_AUC, check_judge, judged_conversations, validity_table  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "judge_validity"


def judges(a: argparse.Namespace) -> list[tuple[str, object]]:
    from collab_env.agents.judges import LLMJudge
    from collab_env.testing.judge_conversations import ReferenceReadingJudge
    from collab_env.testing.judge_injection import FenceReadingJudge

    out: list[tuple[str, object]] = []
    if not a.skip_embedded:
        from collab_env.agents.embedded import EmbeddedPolicy

        out.append(("embedded SmolLM2-135M-Instruct (log-prob verdict)",
                    LLMJudge.preset("accuracy", EmbeddedPolicy(device="cpu"))))
    if a.model:
        from collab_env.agents.hf import HFPolicy

        out.append((f"{Path(a.model).name} (log-prob verdict)",
                    LLMJudge.preset("accuracy", HFPolicy(a.model, device=a.device))))
    out.append(("judge double: FenceReadingJudge", LLMJudge.preset("accuracy", FenceReadingJudge())))
    out.append(("judge double: ReferenceReadingJudge (positive control)",
                LLMJudge.preset("accuracy", ReferenceReadingJudge())))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--items", type=int, default=40, help="rule-labelled conversations (the four kinds cycle)")
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--min-auc", type=float, default=MIN_AUC)
    p.add_argument("--max-ece", type=float, default=MAX_ECE)
    p.add_argument("--model", default=None, help="also judge with this model folder (HF backend)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--skip-embedded", action="store_true")
    p.add_argument("--out", default=str(OUT), help="output prefix: <out>.json and <out>.md")
    p.add_argument("--write-cards", action="store_true",
                   help="write the leaderboard's judge validity cards from <out>.json, judging nothing")
    a = p.parse_args(argv)
    if a.write_cards:
        return write_cards(Path(f"{a.out}.json"))
    command = "python -m benchmarks.judge_validity " + " ".join(shlex.quote(x) for x in (argv or sys.argv[1:]))
    meter = LoadMeter().start()
    t0 = time.perf_counter()
    convs = judged_conversations(a.items)
    rows = []
    for label, judge in judges(a):
        v = check_judge(judge, convs, min_auc=a.min_auc, max_ece=a.max_ece, batch=a.batch)
        print(f"{label}: AUC {v.auc:.3f}, calibration error {v.ece:.3f}, agreement {v.agreement:.3f} "
              f"({v.seconds:.0f} s): {'passes' if v.passed else 'FAILS: ' + v.reason}", flush=True)
        rows.append({**v.to_dict(), "judge": label})
    wall = time.perf_counter() - t0
    load = meter.stop()
    doc = {"benchmark": "judge_validity", "command": command,
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "bar": {"min_auc": a.min_auc, "max_ece": a.max_ece},
           "conversations": {"suite": "hidden-facts", "items": len(convs), "correct": sum(c.correct for c in convs)},
           "rows": rows, "wall_seconds": round(wall, 1),
           "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load": load.to_dict(),
                       "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.json").write_text(json.dumps(doc, indent=1) + "\n")
    md = ["# Judge validity: can the judge tell a right final answer from a wrong one?", "",
          f"Command: `{command}`  ",
          f"Wall time: {wall:.0f} s; machine: {load.describe()}.  ",
          f"{len(convs)} rule-labelled hidden-facts conversations ({doc['conversations']['correct']} correct by the "
          "env's rule; kinds ask-correct, ask-wrong, direct-correct, direct-wrong), judged with the `accuracy` "
          "rubric. AUC: P(a correct conversation scores above a wrong one); calibration error: expected "
          "calibration error of P(correct) over 10 bins (collab_env.eval.judge_check). "
          f"The bar: AUC >= {a.min_auc} and calibration error <= {a.max_ece}; a judge below it raises "
          "JudgeValidityError wherever judged columns would be reported.", "",
          validity_table([{**r} for r in rows])]
    Path(f"{out}.md").write_text("\n".join(md))
    print(f"wrote {out}.json/.md ({wall:.0f} s)")
    return 0


#: The judge specs (a track's judge mapping without its reward) that each measured row stands for.
CARD_SPECS = {"embedded SmolLM2-135M-Instruct (log-prob verdict)": [{"backend": "embedded",
                                                                      "options": {"judge_prefill": True}},
                                                                     {"backend": "embedded"}]}


def write_cards(results: Path) -> int:
    """The leaderboard's judge validity cards from the measured rows of ``results``."""
    from collab_env.leaderboard.board import JUDGE_CARDS_FILE

    doc = json.loads(results.read_text())
    cards = []
    for row in doc["rows"]:
        for spec in CARD_SPECS.get(row["judge"], []):
            verdict = "passes" if row["passed"] else f"fails: {row['reason']}"
            cards.append({"spec": spec, "passed": row["passed"], "auc": row["auc"], "ece": row["ece"],
                          "items": row["items"], "min_auc": row["min_auc"], "max_ece": row["max_ece"],
                          "summary": f"validity check {verdict} (AUC {row['auc']:.3f}, calibration error "
                                     f"{row['ece']:.3f} on {row['items']} rule-labelled conversations; bar AUC >= "
                                     f"{row['min_auc']}, calibration error <= {row['max_ece']}; {doc['date'][:10]})",
                          "source": str(results.relative_to(ROOT))})
    JUDGE_CARDS_FILE.write_text(json.dumps({"cards": cards}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(cards)} card(s) to {JUDGE_CARDS_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Training sets from CollabLLM conversations: RL prompts, SFT conversations, DPO pairs.

The input is rows in the CollabLLM schema (see :mod:`collab_env.tasks.collabllm`): one row per
recorded conversation prefix (``prompt``) with one recorded assistant reply (``completion``) and
its multiturn-aware reward (``score``). Several rows share a ``conv_id`` (the turns of one
conversation, and several candidate replies per turn). Three modes turn them into training data,
like the verl recipe's ``recipe/collabllm/process_dataset.py`` (modes ``rl`` and ``sft``) and the
collabllm package's ``MultiturnDataset.to_sft_dataset`` / ``to_dpo_dataset``.

The hidden goal (``single_turn_prompt``) and the reference answer (``single_turn_completion``)
never go into a prompt, a message list or a response that a model is trained on: prompts and
conversations are built only from the row's ``prompt`` messages, its ``completion`` and the
optional ``system_prompt``. In RL rows the hidden goal lives in
``extra_info["interaction_kwargs"]`` (for the user simulator) and the reference answer in
``reward_model["ground_truth"]`` (for the reward), as in the verl recipe.

Mode ``"rl"`` (:func:`~collab_env.tasks.collabllm_modes.build_rl_dataset`): one row per distinct conversation prefix
    ==================== ==============================================================
    column               value
    ==================== ==============================================================
    ``data_source``      ``"collabllm"`` (what verl's reward manager routes on)
    ``agent_name``       ``"collabllm_agent"`` (verl's agent loop for the recipe)
    ``prompt``           what the policy sees: the optional system prompt, then the row's
                         ``prompt`` messages (ending with the user turn to answer)
    ``ability``          ``"math"``, ``"writing"``, ``"code"`` by dataset family, else
                         ``"general"`` (or ``ability=``)
    ``reward_model``     ``{"style": "rule", "ground_truth": single_turn_completion}``
    ``extra_info``       every other column of the row (``completion``, ``conv_id``,
                         ``turn_id``, ``score``, ``single_turn_completion``,
                         ``single_turn_metadata``, ``rewards``, ``sessions`` normalised to a
                         list of message lists, and for the ``-large`` layout
                         ``session_details``, the per-session judge details...), plus
                         ``index`` (the source row number),
                         ``prompt`` (the policy prompt again, as the recipe's reward function
                         reads it) and ``interaction_kwargs`` = ``{"name": "collabllm",
                         "single_turn_prompt": <hidden goal>, "task_desc": ...}``
    ``index``            the source row number (int)
    ==================== ==============================================================

Mode ``"sft"`` (:func:`~collab_env.tasks.collabllm_modes.build_sft_dataset`): one row per ``conv_id``
    ==================== ==============================================================
    ``messages``         the optional system prompt, the selected row's ``prompt``, then
                         ``{"role": "assistant", "content": completion}``
    ``trainable``        one bool per message: ``True`` for assistant messages (every one
                         with ``train_on="assistant"``, only the last with
                         ``train_on="completion"``); system and user messages are context
    ``conv_id``, ``turn_id``, ``score``  of the selected row
    ==================== ==============================================================

Mode ``"dpo"`` (:func:`~collab_env.tasks.collabllm_modes.build_dpo_dataset`): preference pairs of
replies to the same prefix
    ==================== ==============================================================
    ``prompt``           the optional system prompt, then the shared ``prompt`` messages
    ``chosen``           the higher-scored reply: ``[{"role": "assistant", "content"}]``
                         (TRL's conversational format), or the text with
                         ``response_format="text"`` (the collabllm package's format)
    ``rejected``         the lower-scored reply, same format
    ``score_chosen``, ``score_rejected``  their ``score`` values
    ``conv_id``, ``turn_id``  of the group
    ==================== ==============================================================

Selection rules, and where they follow which reference
    * SFT, ``select="latest"`` (default; the verl recipe and the collabllm package agree): per
      ``conv_id`` the row with the largest ``turn_id`` (the longest conversation), then the
      highest ``score``. ``select="score"``: the highest ``score``, then the largest
      ``turn_id``. Ties are broken by input order: the first row wins (as the package's strict
      ``>`` scan does).
    * SFT ``min_score``: applied to the *selected* row, kept when ``score >= min_score`` (the
      package's ``lower_bound`` rule); a conversation whose selected row scores lower is
      dropped, not replaced by another row. The recipe has no threshold.
    * DPO groups: rows with the same ``conv_id`` **and** the same ``prompt`` messages are
      replies to one prefix and are compared on ``score``. The package groups by ``(conv_id,
      turn_id)``; grouping on the prompt itself never pairs replies to different prefixes when
      data disagree. ``pairing="best_worst"`` (default, the package's rule): one pair, the first
      row with the highest score against the first row with the lowest. ``pairing="all"``: every
      two rows with different scores, in input order.
    * DPO gap: a pair is kept when ``score_chosen - score_rejected >= min_gap`` (a gap exactly
      equal to ``min_gap`` is **kept**, as in the package, which drops only ``gap <
      min_gap``), compared with an absolute tolerance of ``1e-9`` so that decimal scores such as
      ``0.3 - 0.1`` against ``min_gap=0.2`` behave as written. Unlike the package, a pair also
      needs a positive gap (equal scores state no preference, even with ``min_gap=0``) and two
      different reply texts.
    * RL dedup: rows with the same policy prompt **and** the same hidden goal are kept once (the
      first). The recipe dedups on the prompt alone, which would drop a different task whose
      opening message happens to be the same ("Can you help me with a math problem?").
    * RL ``task_desc``: ``task_desc=`` > the row's ``task_desc`` column > the dataset family's
      default (:data:`~collab_env.tasks.collabllm.TASK_DESCRIPTIONS`) > the recipe's generic
      description. The recipe's CLI sets one value for every row.
    * RL ``reward_model.ground_truth`` is ``single_turn_completion`` (required). The recipe
      falls back to ``completion`` when it is empty; a recorded reply is not a reference answer,
      so there is no fallback here. The recipe's duplicate columns ``ground_truth`` and
      ``raw_prompt`` are left out (verl builds ``raw_prompt`` itself), and ``index`` is the
      source row number instead of a random UUID, so outputs are reproducible.
    * System prompt: none by default. The recipe and the package prepend their collaborative
      prompt to every row; pass ``system_prompt=`` (e.g.
      :data:`collab_env.tasks.collabllm.DEFAULT_SYSTEM_PROMPT`, the envs' default) to do the same. It **replaces**
      the system messages of the row's ``prompt``, as ``CollabLLMConfig.system_prompt`` does.
    * SFT column name: ``messages`` (TRL's conversational format and verl's default
      ``data.multiturn.messages_key``); the recipe names it ``prompt`` and sets
      ``messages_key=prompt`` in its SFT script.

Splits and files
    :func:`process_collabllm_dataset` shuffles with ``seed`` and holds out ``validation_size``
    rows (a fraction, rounded up as ``datasets`` does, or a count), with
    ``Dataset.train_test_split`` as the recipe does (default 0.1 and seed 42). With
    ``output_dir`` it writes ``<mode>_train.parquet`` and ``<mode>_validation.parquet``, the
    recipe's file names, so its training scripts find them.

Two sets of rules
    The rules above are this library's (``rules="collab_env"``, the default of the Python API).
    ``rules="recipe"`` (the default of ``collab-env data`` for modes ``rl`` and ``sft``) writes
    exactly the rows of the verl recipe's ``process_dataset.py``: the system prompt on every row
    (default :data:`collab_env.tasks.collabllm.DEFAULT_SYSTEM_PROMPT`, this library's wording),
    dedup on the prompt alone, ``ground_truth`` falling back to ``completion``, the recipe's
    ``task_desc`` on every row, its columns (:data:`RECIPE_RL_COLUMNS`, :data:`RECIPE_SFT_COLUMNS`:
    the SFT conversation in ``prompt``) and its SFT order (by ``conv_id``). Two deliberate
    differences remain: ``index`` is the source row number (the recipe draws a random UUID, so its
    files differ on every run), and ``extra_info`` also holds ``index`` and the normalised
    ``sessions`` (with ``session_details`` for the ``-large`` layout).

Command line (the recipe's, with only the program name changed)::

    collab-env data --dataset collabllm/collabllm-multiturn-math-hard-large \\
        --local_dir $HOME/data/collabllm-math-hard-large --dataset_type rl

``--dataset`` is a hub id, a local dataset folder or a local file; ``--num_proc`` sets the
workers that read the files; ``--hdfs_dir`` is refused (copy the folder with your HDFS tool).
``python -m collab_env.tasks.collabllm_data`` is the same command.

Reading RL rows back
    :func:`~collab_env.tasks.collabllm.load_collabllm_dataset` (and so every ``collabllm-*`` env
    and ``leaderboard run --data-files``) reads a file of RL rows back into the schema, so the
    validation split a trainer holds out is the split an evaluation plays.
"""

from __future__ import annotations

import argparse
import inspect
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from collab_env.errors import CollabEnvError, ConfigError, DataSchemaError, did_you_mean
from collab_env.tasks.collabllm_load import load_collabllm_dataset
from collab_env.tasks.collabllm_modes import (
    MODES,
    RECIPE_TASK_DESC,
    RULES,
    build_dpo_dataset,
    build_rl_dataset,
    build_sft_dataset,
)

if TYPE_CHECKING:  # datasets is imported lazily, inside the functions
    import datasets

__all__ = [
    "RECIPE_LOCAL_DIR",
    "train_validation_split",
    "process_collabllm_dataset",
    "main",
]

_DEFAULT_DATASET = "collabllm/collabllm-multiturn-math-hard"
#: The recipe's ``--local_dir`` default.
RECIPE_LOCAL_DIR = "~/data/collabllm-math-hard"


# ---------------------------------------------------------------------------------------------
# Splits, files, entry point
# ---------------------------------------------------------------------------------------------
def train_validation_split(
    ds: datasets.Dataset, validation_size: float | int = 0.1, seed: int = 42
) -> datasets.DatasetDict:
    """Shuffle ``ds`` with ``seed`` and hold out a validation split (deterministic).

    Args:
        ds: A ``datasets.Dataset``.
        validation_size: A fraction in ``[0, 1)`` (rounded up to whole rows, as
            ``Dataset.train_test_split`` does) or a row count ``>= 0``. ``0``: an empty
            validation split.
        seed: Shuffle seed (the verl recipe's default is 42).

    Returns:
        A ``datasets.DatasetDict`` with ``"train"`` and ``"validation"``.

    Raises:
        ConfigError: ``validation_size`` is invalid or leaves no training row.
    """
    import datasets

    n = len(ds)
    if isinstance(validation_size, bool) or not isinstance(validation_size, (int, float)):
        raise ConfigError(f"validation_size must be a fraction in [0, 1) or a row count, got {validation_size!r}.")
    if isinstance(validation_size, float) and not validation_size.is_integer():  # a fraction
        if not 0 < validation_size < 1:
            raise ConfigError(f"validation_size as a fraction must be in [0, 1), got {validation_size!r}.")
        n_val = math.ceil(validation_size * n)
    else:
        n_val = int(validation_size)
        if n_val < 0:
            raise ConfigError(f"validation_size must be >= 0, got {validation_size!r}.")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed must be an int, got {seed!r}.")
    if n_val == 0:
        return datasets.DatasetDict({"train": ds.shuffle(seed=seed), "validation": ds.select([])})
    if n_val >= n:
        raise ConfigError(
            f"validation_size={validation_size!r} holds out {n_val} of {n} row(s) and leaves none to "
            "train on; pass a smaller validation_size (0 for no validation split) or more rows."
        )
    split = ds.train_test_split(test_size=n_val, seed=seed, shuffle=True)
    return datasets.DatasetDict({"train": split["train"], "validation": split["test"]})


_BUILDERS: dict[str, Callable[..., Any]] = {"rl": build_rl_dataset, "sft": build_sft_dataset, "dpo": build_dpo_dataset}
_EMPTY_HINTS = {
    "rl": "the input has no row",
    "sft": "no conversation passed min_score; lower it",
    "dpo": "no group of replies to the same prefix has two replies whose scores differ by at least "
           "min_gap; lower min_gap, or check that rows share conv_id and prompt",
}


def process_collabllm_dataset(
    data: Any = _DEFAULT_DATASET,
    mode: Literal["rl", "sft", "dpo"] = "rl",
    *,
    data_files: Any = None,
    split: str | None = "train",
    output_dir: str | os.PathLike[str] | None = None,
    validation_size: float | int = 0.1,
    seed: int = 42,
    rules: Literal["collab_env", "recipe"] = "collab_env",
    num_proc: int | None = None,
    prompts: Any = None,
    **options: Any,
) -> datasets.DatasetDict:
    """Build the ``mode`` dataset, split it, and optionally write the parquet files.

    Args:
        data: A ``datasets.Dataset``, a list of dict rows, or a hub id / local dataset
            directory / local data file read with
            :func:`~collab_env.tasks.collabllm.load_collabllm_dataset` (with ``data_files`` the id
            only names the dataset family).
        mode: ``"rl"``, ``"sft"`` or ``"dpo"``; see the module docstring.
        data_files: Local parquet/json/jsonl file(s) in the CollabLLM schema (works offline).
        split: Split to read when loading; ``None``: every split, concatenated in name order
            (what the recipe reads).
        rules: ``"collab_env"`` or ``"recipe"`` (the verl recipe's ``process_dataset.py`` rules,
            modes ``"rl"`` and ``"sft"``; see
            :func:`~collab_env.tasks.collabllm_modes.build_rl_dataset` and
            :func:`~collab_env.tasks.collabllm_modes.build_sft_dataset`). The recipe has no mode
            ``"dpo"``.
        num_proc: Worker processes for reading the files (``datasets.load_dataset``); the row
            rules are one linear pass in this process. ``None``/``1``: one process.
        prompts: The reference's own system prompt on every row, read at run time
            (``"collabllm"``: the installed package's ``system_prompt.txt``; a verl checkout
            path: the ``SYSTEM_PROMPT`` of its ``recipe/collabllm/process_dataset.py``, the very
            text the recipe writes; see :mod:`collab_env.agents.reference_prompts`). Excludes a
            ``system_prompt`` of one's own.
        output_dir: When given, write ``<mode>_train.parquet`` and ``<mode>_validation.parquet``
            there (created if needed).
        validation_size: Fraction or row count held out; see :func:`train_validation_split`.
        seed: Shuffle seed of the split.
        **options: Keywords of the mode's builder
            (:func:`~collab_env.tasks.collabllm_modes.build_rl_dataset`,
            :func:`~collab_env.tasks.collabllm_modes.build_sft_dataset`,
            :func:`~collab_env.tasks.collabllm_modes.build_dpo_dataset`); another mode's keyword
            is an error.

    Returns:
        A ``datasets.DatasetDict`` with ``"train"`` and ``"validation"``.

    Raises:
        ConfigError: Unknown mode or option, invalid value.
        DatasetUnavailableError: The rows cannot be loaded.
        DataSchemaError: Malformed rows, or the mode produced no row (the message says why).
    """
    if mode not in MODES:
        raise ConfigError(f"mode must be one of {tuple(MODES)}, got {mode!r}.")
    if rules not in RULES:
        raise ConfigError(f"rules must be one of {RULES}, got {rules!r}.")
    if rules == "recipe" and mode == "dpo":
        raise ConfigError("the verl recipe has no mode 'dpo'; build DPO pairs with rules='collab_env' "
                          "(collab-env data --dataset_type dpo --rules collab_env).")
    if num_proc is not None and (isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1):
        raise ConfigError(f"num_proc must be an int >= 1 or None, got {num_proc!r}.")
    if prompts is not None and prompts != "collab_env":
        if options.get("system_prompt") is not None:
            raise ConfigError(f"prompts={prompts!r} puts the reference's system prompt on every row; "
                              "system_prompt= puts another one. Pass one of the two.")
        from collab_env.agents.reference_prompts import resolve_prompts

        prompt_set = resolve_prompts(prompts, "collab-env data")
        assert prompt_set is not None  # prompts names a reference set, not our own wording
        options["system_prompt"] = prompt_set.template("assistant_system", fields=(), who="collab-env data").text
    builder = _BUILDERS[mode]
    if mode != "dpo":
        options["rules"] = rules
    valid = [p for p in inspect.signature(builder).parameters if p != "data"]
    for key in options:
        if key not in valid:
            raise ConfigError(
                f"mode {mode!r} takes no option {key!r}.{did_you_mean(key, valid)} Valid options: {valid}."
            )
    if isinstance(data, (str, os.PathLike)):
        name = os.fspath(data)
        if mode == "rl":
            options.setdefault("dataset", name)
        if data_files is None and os.path.isfile(os.path.expanduser(name)):  # --dataset FILE, as the recipe takes
            data_files = os.path.expanduser(name)
        data = load_collabllm_dataset(name, data_files, split, num_proc=num_proc)
    elif data_files is not None:
        raise ConfigError("data_files= is for loading files; pass either rows or data_files, not both.")

    built = builder(data, **options)
    if len(built) == 0:
        raise DataSchemaError(f"collabllm data: mode {mode!r} produced no row: {_EMPTY_HINTS[mode]}.")
    splits = train_validation_split(built, validation_size, seed)
    if output_dir is not None:
        out = os.path.expanduser(os.fspath(output_dir))
        os.makedirs(out, exist_ok=True)
        for name, part in splits.items():
            part.to_parquet(os.path.join(out, f"{mode}_{name}.parquet"))
    return splits


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------
def _size(text: str) -> float | int:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a fraction or a row count, got {text!r}") from exc
    return int(value) if value.is_integer() and value >= 1 else value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="collab-env data",
        description="Build RL, SFT or DPO datasets (parquet train/validation splits) from CollabLLM "
                    "conversations. Takes the verl recipe's process_dataset.py command line as it is and, "
                    "by default, writes the rows it writes (--rules recipe); --rules collab_env applies "
                    "this library's stricter rules. See the collab_env.tasks.collabllm_data docstring.",
    )
    p.add_argument("--dataset", default=_DEFAULT_DATASET,
                   help="hub id, local dataset directory or local data file; with --data_files only the "
                        "family name (default: %(default)s)")
    p.add_argument("--data_files", nargs="+", default=None,
                   help="local parquet/json/jsonl file(s) in the CollabLLM schema (offline)")
    p.add_argument("--split", default=None,
                   help="split to read (default: recipe rules every split, concatenated, as the recipe does "
                        "(a test split included: a warning says so); collab_env rules 'train')")
    p.add_argument("--mode", "--dataset_type", dest="mode", choices=MODES, default="rl")
    p.add_argument("--rules", choices=RULES, default=None,
                   help="row rules: recipe (the verl recipe's, default for rl and sft) or collab_env "
                        "(dedup on prompt and hidden goal, no completion fallback, no system prompt unless "
                        "--system_prompt, SFT in a messages column; the only rules of --dataset_type dpo)")
    p.add_argument("--output_dir", "--local_dir", dest="output_dir", default=RECIPE_LOCAL_DIR,
                   help="where <mode>_train.parquet and <mode>_validation.parquet are written (default: "
                        "%(default)s, the recipe's)")
    p.add_argument("--hdfs_dir", default=None,
                   help="the recipe's HDFS copy: not done here (an error); copy --local_dir with your HDFS tool")
    p.add_argument("--validation_size", type=_size, default=0.1,
                   help="fraction (<1) or row count held out (default: 0.1)")
    p.add_argument("--seed", type=int, default=42, help="split seed (default: 42)")
    p.add_argument("--num_proc", type=int, default=None,
                   help="worker processes for reading the files (the row rules are one linear pass)")
    p.add_argument("--prompts", default=None,
                   help="the reference's own system prompt on every row: 'collabllm' (the installed collabllm "
                        "package's) or the path of a verl checkout (its process_dataset.py SYSTEM_PROMPT)")
    p.add_argument("--system_prompt", default=None,
                   help="system prompt put first in every prompt (recipe rules: default the collabllm envs' "
                        "own, collab_env.tasks.collabllm.DEFAULT_SYSTEM_PROMPT)")
    g = p.add_argument_group("rl")
    g.add_argument("--task_desc", default=None,
                   help=f"task description for the user simulator (recipe rules: every row, default "
                        f"{RECIPE_TASK_DESC!r}; collab_env rules: the row's, else the dataset family's)")
    g.add_argument("--ability", default=None, help="the ability column (collab_env rules)")
    g.add_argument("--no_dedup", dest="dedup", action="store_false", default=None,
                   help="keep rows with the same prompt (and, collab_env rules, hidden goal)")
    g = p.add_argument_group("sft (collab_env rules)")
    g.add_argument("--select", choices=("latest", "score"), default=None)
    g.add_argument("--min_score", type=float, default=None)
    g.add_argument("--train_on", choices=("assistant", "completion"), default=None)
    g = p.add_argument_group("dpo (collab_env rules)")
    g.add_argument("--min_gap", type=float, default=None)
    g.add_argument("--pairing", choices=("best_worst", "all"), default=None)
    g.add_argument("--response_format", choices=("messages", "text"), default=None)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point (``collab-env data``); returns the exit status.

    Only the mode options given on the command line are passed on, so an option of another
    mode (``--min_gap`` with ``--mode rl``) is reported as an error.

    Args:
        argv: Arguments without the program name (default: ``sys.argv[1:]``).

    Returns:
        0 on success, 1 when the data or the options are rejected (the reason on stderr).
    """
    args = _parser().parse_args(argv)
    if args.hdfs_dir is not None:
        print(f"error: --hdfs_dir is the recipe's copy to HDFS, which collab-env data does not do; write to "
              f"--local_dir, then copy that folder to {args.hdfs_dir} with your HDFS tool (hdfs dfs -put).",
              file=sys.stderr)
        return 1
    rules: Literal["collab_env", "recipe"] = args.rules or ("collab_env" if args.mode == "dpo" else "recipe")
    split = args.split if args.split is not None else (None if rules == "recipe" else "train")
    common = ("dataset", "data_files", "split", "mode", "output_dir", "validation_size", "seed", "rules",
              "hdfs_dir", "num_proc", "prompts")
    options = {k: v for k, v in vars(args).items() if k not in common and v is not None}
    try:
        splits = process_collabllm_dataset(
            args.dataset, args.mode, data_files=args.data_files, split=split,
            output_dir=args.output_dir, validation_size=args.validation_size, seed=args.seed, rules=rules,
            num_proc=args.num_proc, prompts=args.prompts, **options,
        )
    except CollabEnvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    out = os.path.expanduser(args.output_dir)
    for name, part in splits.items():
        print(f"wrote {os.path.join(out, f'{args.mode}_{name}.parquet')} ({len(part)} rows, {rules} rules)")
    if args.mode == "rl" and rules == "recipe":
        fallback = sum(not r["extra_info"].get("single_turn_completion") and r["ground_truth"] == (
            r["extra_info"].get("completion") or "") for part in splits.values() for r in part)
        if fallback:
            print(f"note: {fallback} row(s) have no single_turn_completion: their ground_truth is the recorded "
                  "completion (the recipe's fallback), a reply, not a checked answer", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

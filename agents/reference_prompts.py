"""The reference's own prompt templates, read at run time (``prompts=`` of the prompt users).

Our user simulator, judges, Proactive policy and the ``collabllm-*`` envs' assistant system
prompt use our own wording by default. A researcher reproducing CollabLLM can ask for the
reference's exact templates instead; this module is the one place that finds, reads and fills
them. **No reference text is stored in this repository**: the templates are read from the
reference's own files when asked for, and only their file names and placeholder names appear
here.

The values of ``prompts=`` (:func:`resolve_prompts`)
    * ``None`` or ``"collab_env"`` (the default): our own wording; nothing is read.
    * ``"collabllm"``: the templates of the installed ``collabllm`` package (PyPI ``collabllm``;
      it installs with ``pip install --no-deps collabllm``), its ``collabllm/prompts/*.txt``.
      The package is located with :func:`importlib.util.find_spec` and never imported (its
      ``__init__`` imports litellm and sets up logging).
    * a path to the recipe in any layout a user has (:data:`RECIPE_LAYOUTS`): a verl checkout
      as merged (September 2025: the simulator template in ``verl/interactions/``), a verl
      checkout after the move (October 2025 on: everything in ``recipe/collabllm/``, also where
      verl's ``recipe/`` submodule puts it since January 2026), the verl-recipe repository root
      (``collabllm/``; ``legacy/collabllm/`` in its first weeks), or the recipe folder itself:
      the prompt constants of its Python files, read with :mod:`ast` and never executed. A path
      holding the collabllm package's ``prompts/*.txt`` (a clone of the package's repository, or
      the installed package folder) reads the package's files. A path in no known layout is a
      :class:`~collab_env.errors.ConfigError` that lists every path looked for.
    * a list or tuple of the above: the sources in that order (see below).
    * a :class:`PromptSet` (what :func:`resolve_prompts` returns), used as it is.

Which template each component reads (:data:`COLLABLLM_FILES`, :data:`VERL_CONSTANTS`)
    ==================  ================================  ==================================================
    component           collabllm package (prompts/)       the recipe folder (``recipe/collabllm``...)
    ==================  ================================  ==================================================
    assistant_system    ``system_prompt.txt``              ``process_dataset.py`` ``SYSTEM_PROMPT``
    user_simulator      ``user_simulator.txt``             ``collabllm_interation.py``
                                                           ``USER_PROMPT_TEMPLATE`` (before the move:
                                                           ``verl/interactions/collabllm_interation.py``)
    proactive           ``proact_instruction.txt``         (none)
    extract             ``extract_multiturn_completion``   (none)
                        ``.txt``
    accuracy            (none)                             ``metrics/accuracy.py`` ``ACCURACY_PROMPT``
    interactivity       (none)                             ``metrics/interactivity.py``
                                                           ``INTERACTIVITY_PROMPT``
    extract_document    (none)                             ``metrics/bleu_score.py``
                                                           ``EXTRACT_MULTITURN_COMPLETION_PROMPT``
    ==================  ================================  ==================================================

    A component the chosen source has no template for is a :class:`~collab_env.errors.ConfigError`
    that names what the source holds and where the template is (never our wording in its place).
    Sources combine: ``prompts=("collabllm", PATH)`` reads each component from the first source
    that has a template for it (the package's user simulator, the checkout's metric rubrics).

Placeholders
    The templates are ``str.format`` templates (``{{ }}`` for literal braces). Each component
    says which placeholders it can fill (:meth:`PromptSet.template`); a template with any other
    placeholder is a ``ConfigError`` naming the file and the placeholder, at construction, not
    a partly filled prompt at run time. The transcript placeholder (``chat_history``) is filled
    the way the reference renders it (:func:`reference_chat_history`).
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collab_env.agents.replies import strip_think
from collab_env.errors import ConfigError, MissingDependencyError
from collab_env.types import Conversation, Message

__all__ = [
    "OWN_WORDING",
    "COLLABLLM",
    "INSTALL_HINT",
    "COLLABLLM_FILES",
    "VERL_CONSTANTS",
    "RECIPE_LAYOUTS",
    "PRE_MOVE_FILES",
    "recipe_candidates",
    "PromptTemplate",
    "PromptSet",
    "resolve_prompts",
    "describe_prompts",
    "check_prompts_value",
    "reference_chat_history",
]

#: ``prompts=`` value of our own wording (the default, like ``None``).
OWN_WORDING = "collab_env"
#: ``prompts=`` value of the installed collabllm package's templates.
COLLABLLM = "collabllm"
#: How to install the package the ``"collabllm"`` prompt set reads.
INSTALL_HINT = "pip install --no-deps collabllm"

#: Component -> file name in the collabllm package's ``prompts/`` folder (collabllm 0.0.8).
COLLABLLM_FILES: Mapping[str, str] = {
    "assistant_system": "system_prompt.txt",
    "user_simulator": "user_simulator.txt",
    "proactive": "proact_instruction.txt",
    "extract": "extract_multiturn_completion.txt",
}

#: Component -> (file in the recipe folder, name of its string constant).
VERL_CONSTANTS: Mapping[str, tuple[str, str]] = {
    "assistant_system": ("process_dataset.py", "SYSTEM_PROMPT"),
    "user_simulator": ("collabllm_interation.py", "USER_PROMPT_TEMPLATE"),
    "accuracy": ("metrics/accuracy.py", "ACCURACY_PROMPT"),
    "interactivity": ("metrics/interactivity.py", "INTERACTIVITY_PROMPT"),
    "extract_document": ("metrics/bleu_score.py", "EXTRACT_MULTITURN_COMPLETION_PROMPT"),
}

#: Where the recipe folder is under the path a user passes, per layout (checked on
#: github.com/volcengine/verl and github.com/verl-project/verl-recipe, 2026-12-06), in the
#: order they are tried: (folder under the path, the layout).
RECIPE_LAYOUTS: tuple[tuple[str, str], ...] = (
    (".", "the recipe folder itself"),
    ("recipe/collabllm", "a verl checkout (recipe merged 2025-09-25, files moved in 2025-10-09; "
                         "since 2026-01-06 verl's recipe/ submodule, the verl-recipe repository)"),
    ("collabllm", "the verl-recipe repository root (2026-01-05 on)"),
    ("legacy/collabllm", "the verl-recipe repository, 2025-11-27 to 2026-01-05"),
)

#: Recipe files verl kept outside the recipe folder as merged (verl 25d78fa, 2025-09-25) until
#: they moved into it (verl cf619d6, 2025-10-09): file in the recipe folder -> its old path
#: from the checkout root.
PRE_MOVE_FILES: Mapping[str, str] = {
    "collabllm_interation.py": "verl/interactions/collabllm_interation.py",
}


def recipe_candidates(root: Path, rel: str) -> list[Path]:
    """Every path where the recipe file ``rel`` (relative to the recipe folder, e.g.
    ``metrics/accuracy.py``) may be under ``root``, in the order :class:`PromptSet` tries them:
    each of :data:`RECIPE_LAYOUTS`, then the file's pre-move home (:data:`PRE_MOVE_FILES`) from
    ``root`` as a verl checkout and, when ``root`` is a September 2025 checkout's
    ``recipe/collabllm``, from that checkout's root."""
    paths = [(root / folder / rel) if folder != "." else root / rel for folder, _ in RECIPE_LAYOUTS]
    old = PRE_MOVE_FILES.get(rel)
    if old is not None:
        paths.append(root / old)
        if root.name == "collabllm" and root.parent.name == "recipe":
            paths.append(root.parent.parent / old)
    return paths


# ---------------------------------------------------------------------------------------------
# One template
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PromptTemplate:
    """One reference template, as read from its file.

    Args:
        component: Our name of the component it serves (``"user_simulator"``...).
        text: The template text (a ``str.format`` template).
        origin: Where it was read: the file, and for a Python file the constant
            (``.../accuracy.py:ACCURACY_PROMPT``).
        fields: Its placeholder names, each once, in order of appearance.
    """

    component: str
    text: str
    origin: str
    fields: tuple[str, ...]

    def fill(self, **values: Any) -> str:
        """The template with its placeholders filled from ``values`` (extra values are ignored:
        a component passes everything it has).

        Raises:
            ConfigError: A placeholder has no value (the message names the file and it).
        """
        missing = [f for f in self.fields if f not in values]
        if missing:
            raise ConfigError(
                f"{self.origin}: the {self.component} template's placeholder {{{missing[0]}}} has no "
                f"value here (placeholders {list(self.fields)}, values for {sorted(values)}); this "
                "prompt set does not fit this component."
            )
        return self.text.format(**{f: values[f] for f in self.fields})


def _placeholders(text: str, origin: str) -> tuple[str, ...]:
    try:
        names = [f for _, f, _, _ in string.Formatter().parse(text) if f is not None]
    except ValueError as exc:
        raise ConfigError(f"{origin}: not a valid str.format template ({exc}).") from exc
    bad = [f for f in names if not f.isidentifier()]
    if bad:
        raise ConfigError(f"{origin}: the placeholder {{{bad[0]}}} is not a plain name; the "
                          "template cannot be filled.")
    return tuple(dict.fromkeys(names))


# ---------------------------------------------------------------------------------------------
# A prompt set: where the templates are read from
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PromptSet:
    """A source of reference templates: the collabllm package or a verl checkout.

    Build it with :func:`resolve_prompts`. Every :meth:`template` call reads the file again
    (components read theirs once, at construction).

    Args:
        source: ``"collabllm"`` or ``"verl"``.
        root: The package's ``prompts/`` folder, or the checkout's root.
        version: The package's installed version, when its metadata says (``None`` otherwise).
        more: Further sources, asked in order for a component this one has no template for.
    """

    source: str
    root: Path
    version: str | None = None
    more: tuple[PromptSet, ...] = ()

    def describe(self) -> str:
        """One line naming the set, e.g. ``collabllm 0.0.8 from /.../collabllm/prompts``."""
        if self.source == COLLABLLM:
            own = f"collabllm {self.version or '(version unknown)'} from {self.root}"
        else:
            own = f"verl recipe checkout {self.root}"
        return " + ".join([own, *(m.describe() for m in self.more)])

    def own_components(self) -> tuple[str, ...]:
        """The components this source itself (not :attr:`more`) has a template for."""
        return tuple(COLLABLLM_FILES if self.source == COLLABLLM else VERL_CONSTANTS)

    def components(self) -> tuple[str, ...]:
        """The components this set has a template for."""
        return tuple(dict.fromkeys([*self.own_components(), *(c for m in self.more for c in m.components())]))

    def template(self, component: str, *, fields: Iterable[str], who: str) -> PromptTemplate:
        """The template of ``component``, checked against the placeholders ``who`` can fill.

        Args:
            component: A key of :data:`COLLABLLM_FILES` / :data:`VERL_CONSTANTS`.
            fields: The placeholders the caller can fill.
            who: The caller, for messages (``"LLMUserSimulator"``...).

        Raises:
            ConfigError: The source has no template for the component, its file or constant is
                missing or not a string, or the template has a placeholder ``who`` cannot fill.
        """
        if component not in self.own_components():
            for m in self.more:
                if component in m.components():
                    return m.template(component, fields=fields, who=who)
            raise self._unavailable(component, who)
        if self.source == COLLABLLM:
            text, origin = self._read_file(component, who)
        else:
            text, origin = self._read_constant(component, who)
        names = _placeholders(text, origin)
        allowed = set(fields)
        unknown = [f for f in names if f not in allowed]
        if unknown:
            raise ConfigError(
                f"{origin}: {who} cannot fill the placeholder {{{unknown[0]}}} of the "
                f"{component} template (it fills {sorted(allowed) or 'none'}); a partly filled "
                "prompt would not be the reference's. Check the package or checkout version, or "
                "use prompts=None (our own wording)."
            )
        return PromptTemplate(component, text, origin, names)

    def _unavailable(self, component: str, who: str) -> ConfigError:
        held = ", ".join(self.components())
        where = []
        if component in COLLABLLM_FILES:
            where.append(f"prompts='collabllm' (the package's prompts/{COLLABLLM_FILES[component]})")
        if component in VERL_CONSTANTS:
            rel, const = VERL_CONSTANTS[component]
            where.append(f"prompts=PATH, the recipe (a verl checkout's recipe/collabllm/{rel} or the "
                         f"verl-recipe repository's collabllm/{rel}, {const})")
        hint = (" The reference's template is read with " + " or ".join(where) + ".") if where else (
            " No reference source known to collab_env has one.")
        return ConfigError(
            f"{who}: the prompt set {self.describe()} has no {component} template (it holds: "
            f"{held}).{hint} Or use prompts=None (our own wording)."
        )

    def _read_file(self, component: str, who: str) -> tuple[str, str]:
        name = COLLABLLM_FILES.get(component)
        if name is None:
            raise self._unavailable(component, who)
        path = self.root / name
        if not path.is_file():
            raise ConfigError(
                f"{who}: {self.describe()} has no {name} (expected at {path}); collab_env knows "
                f"the layout of collabllm 0.0.8. Reinstall it with: {INSTALL_HINT}"
            )
        return path.read_text(encoding="utf-8"), str(path)

    def _read_constant(self, component: str, who: str) -> tuple[str, str]:
        if component not in VERL_CONSTANTS:
            raise self._unavailable(component, who)
        rel, const = VERL_CONSTANTS[component]
        tried = recipe_candidates(self.root, rel)
        path = next((p for p in tried if p.is_file()), None)
        if path is None:
            raise ConfigError(
                f"{who}: {self.root} holds no {rel} of the CollabLLM recipe (the {component} "
                f"template is its constant {const}); looked for "
                + ", ".join(str(p) for p in tried) + ". " + _layout_hint(self.root)
            )
        origin = f"{path}:{const}"
        return string_constant(path, const, origin), origin


def _layout_hint(root: Path) -> str:
    """What to pass instead, for a path in none of :data:`RECIPE_LAYOUTS`."""
    recipe = root / "recipe"
    if (root / "verl").is_dir() and recipe.is_dir() and not any(recipe.iterdir()):
        return (f"{recipe} is empty: verl's recipes are a git submodule since 2026-01-06; run "
                f"`git -C {root} submodule update --init recipe`, or pass a verl-recipe checkout.")
    layouts = "; ".join(f"{desc}: {folder}/" if folder != "." else desc for folder, desc in RECIPE_LAYOUTS)
    return (f"Pass the root of one of the recipe's layouts ({layouts}), 'collabllm' for the "
            "installed package, or prompts=None for our own wording.")


def string_constant(path: Path, name: str, origin: str) -> str:
    """The string assigned to the module-level name ``name`` in the Python file ``path``, read
    from its syntax tree (the file is never executed). Adjacent literals and ``+`` of string
    literals are joined.

    Raises:
        ConfigError: The file does not parse, or has no such string constant.
    """
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, ValueError, OSError) as exc:
        raise ConfigError(f"{origin}: cannot read the file as Python ({exc}).") from exc
    for node in tree.body:
        targets: Sequence[ast.expr] = ()
        value = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = (node.target,), node.value
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            text = _literal_str(value)
            if text is None:
                raise ConfigError(f"{origin}: {name} is not a string literal; collab_env reads "
                                  "it without running the file.")
            return text
    raise ConfigError(f"{origin}: the file assigns no {name} at module level (a different verl "
                      "version?).")


def _literal_str(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _literal_str(node.left), _literal_str(node.right)
        if left is not None and right is not None:
            return left + right
    return None


# ---------------------------------------------------------------------------------------------
# Finding the sources
# ---------------------------------------------------------------------------------------------
def _collabllm_set(who: str) -> PromptSet:
    try:
        spec = importlib.util.find_spec(COLLABLLM)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or ()) if spec is not None else []
    if not locations:
        raise MissingDependencyError(
            f"{who}: prompts='collabllm' reads the CollabLLM reference templates from the "
            "installed collabllm package (its collabllm/prompts/*.txt), which is not installed. "
            f"Install it with: {INSTALL_HINT} (or pass prompts=PATH to the recipe: a verl or verl-recipe checkout, or "
            "prompts=None for our own wording)."
        )
    for loc in locations:
        folder = Path(loc) / "prompts"
        if folder.is_dir():
            return PromptSet(COLLABLLM, folder, _installed_version(Path(loc)))
    raise ConfigError(
        f"{who}: the collabllm package at {locations[0]} has no prompts/ folder (collab_env knows "
        f"the layout of collabllm 0.0.8). Reinstall it with: {INSTALL_HINT}"
    )


def _installed_version(package_dir: Path) -> str | None:
    """The version in the dist-info next to the package folder (the copy actually found)."""
    try:
        for dist in importlib.metadata.distributions(path=[str(package_dir.parent)]):
            meta = dist.metadata  # PackageMetadata: no .get() in its protocol (3.10)
            if (meta["Name"] if "Name" in meta else "").lower() == COLLABLLM:
                return dist.version
    except Exception:  # broken metadata must not hide the templates
        return None
    return None


def check_prompts_value(prompts: Any, who: str) -> None:
    """Raise :class:`~collab_env.errors.ConfigError` unless ``prompts`` is a valid value of
    ``prompts=`` (see the module docstring); reads nothing."""
    if isinstance(prompts, (list, tuple)):
        if not prompts:
            raise ConfigError(f"{who}: prompts=[] names no source; use None for our own wording.")
        for p in prompts:
            if p is None or p == OWN_WORDING or isinstance(p, (list, tuple)):
                raise ConfigError(f"{who}: a list of prompt sources holds 'collabllm' and paths "
                                  f"only, got {p!r} in {prompts!r}.")
            check_prompts_value(p, who)
        return
    if prompts is None or isinstance(prompts, PromptSet) or prompts in (OWN_WORDING, COLLABLLM):
        return
    if isinstance(prompts, (str, os.PathLike)):
        path = Path(os.fspath(prompts)).expanduser()
        if path.is_dir():
            return
        raise ConfigError(
            f"{who}: prompts={prompts!r} is neither 'collab_env' (our wording, the default), "
            "'collabllm' (the installed package's templates) nor an existing folder (the recipe: "
            "a verl or verl-recipe checkout, or the recipe folder)."
        )
    raise ConfigError(f"{who}: prompts must be None, 'collab_env', 'collabllm' or a path, got "
                      f"{type(prompts).__name__}.")


def resolve_prompts(prompts: Any, who: str = "prompts") -> PromptSet | None:
    """The prompt set ``prompts`` names, or ``None`` for our own wording.

    Args:
        prompts: ``None`` / ``"collab_env"``, ``"collabllm"``, a path to a verl checkout, a list
            of those sources, or a :class:`PromptSet`.
        who: The caller, for messages.

    Raises:
        MissingDependencyError: ``"collabllm"`` and the package is not installed (the message
            says ``pip install --no-deps collabllm``).
        ConfigError: Any other invalid value.
    """
    check_prompts_value(prompts, who)
    if isinstance(prompts, (list, tuple)):
        sets = [resolve_prompts(p, who) for p in prompts]
        first = sets[0]
        assert first is not None  # check_prompts_value refused None in a list
        return PromptSet(first.source, first.root, first.version,
                         (*first.more, *(s for s in sets[1:] if s is not None)))
    if prompts is None or prompts == OWN_WORDING:
        return None
    if isinstance(prompts, PromptSet):
        return prompts
    if prompts == COLLABLLM:
        return _collabllm_set(who)
    root = Path(os.fspath(prompts)).expanduser().resolve()
    package = _package_prompts_folder(root)
    if package is not None:
        return PromptSet(COLLABLLM, package, _installed_version(package.parent))
    tried = [p for rel, _ in VERL_CONSTANTS.values() for p in recipe_candidates(root, rel)]
    if not any(p.is_file() for p in tried):
        folders = list(dict.fromkeys(str(p.parent) for p in tried))
        raise ConfigError(
            f"{who}: prompts={os.fspath(prompts)!r} is in no layout of the CollabLLM recipe collab_env "
            f"knows: looked for its files ({', '.join(rel for rel, _ in VERL_CONSTANTS.values())}) in "
            f"{', '.join(folders)}, and for the collabllm package's prompts/*.txt in {root / 'prompts'}, "
            f"{root / COLLABLLM / 'prompts'}. {_layout_hint(root)}"
        )
    return PromptSet("verl", root)


def _package_prompts_folder(root: Path) -> Path | None:
    """The collabllm package's ``prompts/`` folder when ``root`` is the package folder or a
    clone of the package's repository (``collabllm/prompts/``), else ``None``."""
    for folder in (root / "prompts", root / COLLABLLM / "prompts"):
        if any((folder / name).is_file() for name in COLLABLLM_FILES.values()):
            return folder
    return None


def describe_prompts(prompts: PromptSet | None) -> str:
    """The line env cards and infos show: ``collab_env (own wording)`` or the set's
    :meth:`PromptSet.describe`."""
    return f"{OWN_WORDING} (own wording)" if prompts is None else prompts.describe()


def reference_chat_history(conversation: Conversation | Sequence[Message], *, me: str | None = None) -> str:
    """A conversation as the reference fills ``{chat_history}``: one line per message,
    ``**User**: text`` / ``**Assistant**: text``, system messages left out, an empty string
    when nothing was said yet.

    Messages with a restricted audience (a hidden goal) are left out too. With ``me`` (the
    player whose view this is) that player's messages are the ``User`` lines and everybody
    else's the ``Assistant`` lines; otherwise the chat role decides. ``<think>`` blocks are
    removed (:func:`~collab_env.agents.replies.strip_think`: no simulated user or judge reads a
    player's private reasoning).
    """
    lines = []
    for m in conversation:
        if m.role == "system" or (m.audience is not None and me is None):
            continue
        if me is not None:
            label = "User" if m.author == me else "Assistant"
        else:
            label = "User" if m.role == "user" else "Assistant"
        lines.append(f"**{label}**: {strip_think(m.content) if '<think>' in m.content else m.content}")
    return "\n".join(lines)

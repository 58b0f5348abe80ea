"""phone-support: dual control. The user holds the phone, the assistant holds the account, and
only the final state counts.

A customer's mobile data does not work. What is wrong is split between two places that two
different players control, each through its own tools (:class:`~collab_env.types.Tool`, called
in the one JSON format of :func:`~collab_env.types.parse_tool_call`):

* **The phone** (the user's side): airplane mode, mobile data, data roaming and the access point
  name (APN). Only the user's tools read or change it: ``check_status``, ``set_airplane_mode``,
  ``set_mobile_data``, ``set_data_roaming``, ``set_apn``, ``restart_phone``, ``run_speed_test``.
* **The account** (the assistant's side): the customer's plan, its APN, whether the line is
  suspended and where the phone is registered (home network or abroad). Only the assistant's
  tools read or change it: ``lookup_account`` and ``resume_line``.

The assistant cannot touch the phone and the user does not know the plan, so the assistant must
look up the account, fix what is on its side, find out what the phone shows (by asking the user)
and guide the user, step by step, to the right settings. Each tool call is one env step; its
result goes back to the caller only, and the other player sees neither the call nor the result
(what the user tells the assistant is all the assistant learns of the phone).

**Success is the final state**: the episode's reward (assistant) is 1 when, at the end, the
line is active and the phone's settings are the goal's (airplane mode off, mobile data on, the
plan's APN, data roaming on exactly when the customer is abroad), else 0. What anyone *says*
is never scored: a claim of success earns nothing, and a phone whose speed test passes with data
roaming left on at home still fails.

Items are generated from the index (offline, unlimited): the plan (3 plans, 3 APNs), home or
abroad (1 in 2), one or two phone faults among airplane mode on, mobile data off, data roaming
wrong, a wrong APN (every item has at least one, so nothing the assistant does alone succeeds),
and a suspended line (2 in 5).

Players
    ``assistant`` (trainable; tools ``lookup_account``, ``resume_line``) and ``user``
    (simulated; the phone's tools). Turn order: assistant, user; a tool call keeps its caller on
    turn. The user ends the chat by writing ``[done]`` (the scripted user does once a speed test
    passes); ``max_steps`` (default 40) truncates it. Either way the final state is scored.

Policies
    :class:`PhoneSupportUser` (the scripted user: does, one tool call at a time, each step it
    understands in the assistant's last message, then reports every result; tests the phone
    when told the problem is fixed; ends the chat when a speed test passes),
    :class:`PhoneSupportReference` (looks up the account, resumes a suspended line, asks for the
    phone's status and tells the user exactly what to change: succeeds on every item) and
    :class:`PhoneSupportNaive` (no tools, no diagnosis: the usual advice to restart, turn off
    airplane mode and turn on mobile data; the card's naive baseline).

Version history
    v0: first version (issue 46).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from collab_env.env import CollabEnv, EpisodeState, Outcome, Start, Task, env_message
from collab_env.errors import ActionError, ConfigError
from collab_env.policy import ScriptedPolicy
from collab_env.registry import EnvCard
from collab_env.tasks._common import build_config, split_env_kwargs
from collab_env.tasks.cards import baseline_text, cards_section
from collab_env.tasks.exploit_quotes import EXPLOIT_QUOTES
from collab_env.types import Conversation, Message, Tool, ToolCall

__all__ = [
    "PhoneSupportConfig",
    "PhoneSupportTask",
    "PhoneSupportUser",
    "PhoneSupportReference",
    "PhoneSupportNaive",
    "USER_TOOLS",
    "ASSISTANT_TOOLS",
    "END_MARK",
    "make_env",
    "PHONE_SUPPORT_CARD",
    "PHONE_POLICIES",
]

ENV_ID = "phone-support-v0"
#: What the user writes to end the chat.
END_MARK = "[done]"
#: Plan -> its APN.
PLANS: dict[str, str] = {"Everyday": "fastnet", "Prepaid": "fastnet.pre", "Business": "biz.fastnet"}
_COUNTRIES = ("Portugal", "Japan", "Canada", "Kenya", "Norway")
_FAULTS = ("airplane", "data", "roaming", "apn")

_NO_ARGS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


def _switch(what: str) -> dict[str, Any]:
    return {"type": "object", "properties": {"on": {"type": "boolean", "description": f"true: {what} on"}},
            "required": ["on"], "additionalProperties": False}


_PHONE_NUMBER = {"type": "object", "properties": {"phone_number": {"type": "string"}},
                 "required": ["phone_number"], "additionalProperties": False}

#: The user's tools: the phone.
USER_TOOLS: tuple[Tool, ...] = (
    Tool("check_status", "Read the phone's status screen (airplane mode, mobile data, data roaming, APN, "
                         "connection).", _NO_ARGS),
    Tool("set_airplane_mode", "Switch airplane mode on or off.", _switch("airplane mode")),
    Tool("set_mobile_data", "Switch mobile data on or off.", _switch("mobile data")),
    Tool("set_data_roaming", "Switch data roaming on or off.", _switch("data roaming")),
    Tool("set_apn", "Set the access point name (APN) the phone uses for mobile data.",
         {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"],
          "additionalProperties": False}),
    Tool("restart_phone", "Restart the phone.", _NO_ARGS),
    Tool("run_speed_test", "Test the mobile data connection.", _NO_ARGS),
)
#: The assistant's tools: the account.
ASSISTANT_TOOLS: tuple[Tool, ...] = (
    Tool("lookup_account", "The customer's account by phone number: plan, the plan's APN, line status and "
                           "where the phone is registered.", _PHONE_NUMBER),
    Tool("resume_line", "Resume a suspended line.", _PHONE_NUMBER),
)


@dataclass(frozen=True)
class PhoneSupportConfig:
    """Task options of the phone-support env."""

    suspended_rate: float = 0.4
    """Chance that an item's line is suspended (the assistant's side of the fix)."""
    abroad_rate: float = 0.5
    """Chance that the customer is abroad (then the goal has data roaming on)."""
    num_items: int | None = None
    """Make the suite finite (items ``0..num_items-1``); ``None`` for unlimited. Item ``i`` does
    not depend on it."""

    def __post_init__(self) -> None:
        for name in ("suspended_rate", "abroad_rate"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
                raise ConfigError(f"{name} must be a number in [0, 1], got {v!r}.")
        if self.num_items is not None and (isinstance(self.num_items, bool) or not isinstance(self.num_items, int)
                                           or self.num_items < 1):
            raise ConfigError(f"num_items must be an int >= 1 or None, got {self.num_items!r}.")


def _on(flag: bool) -> str:
    return "on" if flag else "off"


def _status_text(device: Mapping[str, Any], line_active: bool) -> str:
    """What ``check_status`` shows."""
    return (f"Status: airplane mode {_on(device['airplane'])} | mobile data {_on(device['data'])} | "
            f"data roaming {_on(device['roaming'])} | APN {device['apn']} | "
            f"connection {'connected' if _connected(device, line_active) else 'none'}")


def _connected(device: Mapping[str, Any], line_active: bool) -> bool:
    return (line_active and not device["airplane"] and device["data"] and device["apn"] == device["plan_apn"]
            and (device["roaming"] or not device["abroad"]))


class PhoneSupportTask(Task):
    """The task behind ``phone-support-v0`` (see the module docstring)."""

    players = ("assistant", "user")
    user_players = ("user",)
    turn_order = (("assistant",), ("user",))
    default_max_steps = 40

    def __init__(self, config: PhoneSupportConfig | None = None) -> None:
        self.config = config or PhoneSupportConfig()

    def num_items(self) -> int | None:
        return self.config.num_items

    def get_item(self, index: int) -> Mapping[str, Any]:
        cfg = self.config
        rng = np.random.default_rng([index, 0x9E0C])
        plan = list(PLANS)[int(rng.integers(len(PLANS)))]
        abroad = bool(rng.random() < cfg.abroad_rate)
        faults = sorted(str(f) for f in rng.choice(_FAULTS, size=int(rng.integers(1, 3)), replace=False))
        wrong_apns = [a for a in (*PLANS.values(), "wap.fastnet") if a != PLANS[plan]]
        goal = {"airplane": False, "data": True, "roaming": abroad, "apn": PLANS[plan]}
        start = dict(goal)
        if "airplane" in faults:
            start["airplane"] = True
        if "data" in faults:
            start["data"] = False
        if "roaming" in faults:
            start["roaming"] = not abroad
        if "apn" in faults:
            start["apn"] = wrong_apns[int(rng.integers(len(wrong_apns)))]
        return {
            "phone_number": f"555-{int(rng.integers(1000, 10000))}",
            "plan": plan,
            "location": f"abroad ({_COUNTRIES[int(rng.integers(len(_COUNTRIES)))]})" if abroad else "home network",
            "abroad": abroad,
            "suspended": bool(rng.random() < cfg.suspended_rate),
            "faults": faults,
            "start": start,
            "goal": goal,
        }

    def tools(self, player: str) -> tuple[Tool, ...]:
        return ASSISTANT_TOOLS if player == "assistant" else USER_TOOLS

    def start(self, state: EpisodeState, options: Mapping[str, Any]) -> Start:
        item = state.item
        state.data["device"] = {**item["start"], "plan_apn": PLANS[item["plan"]], "abroad": item["abroad"]}
        state.data["line_active"] = not item["suspended"]
        return Start(messages=[
            env_message(_assistant_prompt(), role="system", audience=("assistant",),
                        meta={"tools": [t.to_openai() for t in ASSISTANT_TOOLS]}),
            env_message(_user_prompt(item["phone_number"]), role="system", audience=("user",),
                        meta={"tools": [t.to_openai() for t in USER_TOOLS], "phone_number": item["phone_number"]}),
            Message(role="user", author="user", content=(
                f"Hi, mobile data on my phone stopped working. My number is {item['phone_number']}.")),
        ], on_turn=("assistant",))

    def call_tool(self, state: EpisodeState, player: str, call: ToolCall) -> str:
        device, args = state.data["device"], call.arguments
        if player == "assistant":
            if args["phone_number"].strip() != state.item["phone_number"]:
                raise ActionError(f"no account has the number {args['phone_number']!r}.")
            if call.name == "lookup_account":
                return json.dumps({"phone_number": state.item["phone_number"], "plan": state.item["plan"],
                                   "apn": PLANS[state.item["plan"]],
                                   "line": "active" if state.data["line_active"] else "suspended",
                                   "location": state.item["location"]})
            was = state.data["line_active"]
            state.data["line_active"] = True
            return "The line is already active." if was else "The line is active again."
        if call.name == "check_status":
            return _status_text(device, state.data["line_active"])
        if call.name == "run_speed_test":
            return ("Speed test: 48 Mbps download." if _connected(device, state.data["line_active"])
                    else "Speed test: no connection.")
        if call.name == "restart_phone":
            return "The phone restarted."
        if call.name == "set_apn":
            device["apn"] = args["name"].strip()
            return f"APN set to {device['apn']}."
        key = {"set_airplane_mode": "airplane", "set_mobile_data": "data", "set_data_roaming": "roaming"}[call.name]
        device[key] = bool(args["on"])
        return f"{call.name[4:].replace('_', ' ').capitalize()} is {_on(device[key])}."

    def resolved(self, state: EpisodeState) -> bool:
        """Whether the final state is the goal's (the line active, the phone's settings the goal's)."""
        device = state.data["device"]
        return state.data["line_active"] and all(device[k] == v for k, v in state.item["goal"].items())

    def step(self, state: EpisodeState, moves: Mapping[str, str], final: bool) -> Outcome:
        ended = "user" in moves and END_MARK in moves["user"]
        if not (ended or final):
            return Outcome()
        ok = float(self.resolved(state))
        return Outcome(rewards={"assistant": ok}, components={"assistant": {"resolved": ok}},
                       terminated=ended, reason="user_ended" if ended else None,
                       info={"resolved": bool(ok), "tool_errors": dict(state.tool_errors)})


def _tool_lines(tools: tuple[Tool, ...]) -> str:
    return "\n".join(f"- {t.name}: {t.description} Arguments: {json.dumps(t.parameters['properties'])}"
                     for t in tools)


def _assistant_prompt() -> str:
    return (
        "You work in customer support for the mobile network FastNet. A customer writes because mobile "
        "data on their phone does not work.\n"
        "Your tools act on the customer's account only:\n" + _tool_lines(ASSISTANT_TOOLS) + "\n"
        "To call a tool, reply with nothing but one JSON object, e.g. "
        f"{_call('lookup_account', {'phone_number': '555-0100'})}. Its result comes back to you alone.\n"
        "You cannot see or change the customer's phone. Only the customer can, and only when you tell "
        "them what to do: they can read the phone's status screen, switch airplane mode, mobile data "
        "and data roaming on or off, set the APN, restart the phone and run a speed test.\n"
        "The problem is solved when the line is active and the phone has airplane mode off, mobile data "
        "on, the APN of the customer's plan, and data roaming on only while the customer is abroad."
    )


def _user_prompt(phone: str) -> str:
    return (
        f"You are a customer of the mobile network FastNet; your phone number is {phone}. Mobile data on "
        "your phone stopped working and you are talking to FastNet support. You know nothing about "
        "phone settings. You can act on your phone only through these tools:\n" + _tool_lines(USER_TOOLS)
        + f"\nTo use one, reply with nothing but one JSON object, e.g. {_call('check_status', {})}.\n"
        "Do what the support agent asks, one step at a time, then tell the agent what you did and "
        f"what the phone showed. When mobile data works again, thank the agent and write {END_MARK}."
    )


def make_env(**kwargs: Any) -> CollabEnv:
    """Entry point of ``phone-support-v0``: :class:`PhoneSupportConfig` keywords plus
    ``max_steps``, ``max_message_chars``, ``max_total_chars``, ``render_mode``."""
    env_kw, task_kw = split_env_kwargs(dict(kwargs))
    config = build_config(PhoneSupportConfig, task_kw, where="phone-support")
    return CollabEnv(PhoneSupportTask(config), **env_kw)


# ---------------------------------------------------------------------------------------------
# Policies: the scripted user, the reference assistant, the naive one
# ---------------------------------------------------------------------------------------------
def _call(tool: str, arguments: Mapping[str, Any]) -> str:
    return json.dumps({"name": tool, "arguments": dict(arguments)})


def _since_last(observation: Conversation, author: str) -> tuple[Message | None, list[Message]]:
    """The last message ``author`` wrote as text (no tool call), and the messages after it."""
    msgs = list(observation)
    for i in range(len(msgs) - 1, -1, -1):
        if msgs[i].author == author and not msgs[i].tool_calls and msgs[i].role != "tool":
            return msgs[i], msgs[i + 1:]
    return None, msgs


_CLAUSES = re.compile(r"[;!?\n]+|\.(?=\s|$)|,|\band\b|\bthen\b", re.IGNORECASE)
_ON_PHONE = re.compile(r"\bon (?:your|the|my) (?:phone|device|screen)\b")
_APN_NAME = re.compile(r"""\bapn\b[^"'`]*?["'`]([A-Za-z0-9._-]+)["'`]|\bapn (?:to|as) ([A-Za-z0-9._-]*[A-Za-z0-9_-])""",
                       re.IGNORECASE)


def _switch_of(clause: str) -> bool | None:
    c = _ON_PHONE.sub("", clause)
    off = bool(re.search(r"\boff\b|\bdisabl|\bdeactivat", c))
    on = bool(re.search(r"\bon\b|\benabl|\bactivat", c))
    return on if on != off else None


def instructions(text: str) -> list[tuple[str, dict[str, Any]]]:
    """The phone actions the scripted user reads in ``text``, in order: one per clause that names
    a setting and clearly says on or off (an APN only with its name quoted or after "to"), asks
    for the status screen, a restart or a speed test, or says the problem is fixed (then: a
    speed test)."""
    out: list[tuple[str, dict[str, Any]]] = []
    for raw in _CLAUSES.split(text):
        c = raw.lower()
        act: tuple[str, dict[str, Any]] | None = None
        if "airplane" in c or "flight mode" in c:
            on = _switch_of(c)
            act = ("set_airplane_mode", {"on": on}) if on is not None else None
        elif "roaming" in c:
            on = _switch_of(c)
            act = ("set_data_roaming", {"on": on}) if on is not None else None
        elif "mobile data" in c or "cellular data" in c:
            on = _switch_of(c)
            act = ("set_mobile_data", {"on": on}) if on is not None else None
        elif "apn" in c:
            found = _APN_NAME.search(raw)
            act = ("set_apn", {"name": found.group(1) or found.group(2)}) if found else None
        elif "status" in c:
            act = ("check_status", {})
        elif "restart" in c or "reboot" in c:
            act = ("restart_phone", {})
        elif "speed test" in c or re.search(r"\bfixed\b|\bresolved\b|\bworks now\b|\bworking now\b", c):
            act = ("run_speed_test", {})
        if act is not None and (not out or out[-1] != act):
            out.append(act)
    return out


class PhoneSupportUser(ScriptedPolicy):
    """The scripted user: carries out, one tool call per step, every action it reads in the
    assistant's last message (:func:`instructions`), then reports each result in one message;
    ends the chat (``[done]``) once a speed test passes. It gives its number when asked and
    otherwise says it does not know what to do."""

    name = "phone-support-user"
    uses_rng = False

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        phone = next((m.meta["phone_number"] for m in observation if m.role == "system"
                      and "phone_number" in m.meta), None)
        if phone is None:
            raise ConfigError("PhoneSupportUser needs the user's observation of a phone-support env; use it "
                              "only as that env's 'user'.")
        asked, after = _since_last(observation, "assistant")
        todo = instructions(asked.content) if asked is not None else []
        done = [m for m in after if m.tool_calls]
        if len(done) < len(todo):
            name, args = todo[len(done)]
            return _call(name, args)
        results = [m.content for m in after if m.role == "tool"]
        if results:
            works = any(r.startswith("Speed test:") and "no connection" not in r for r in results)
            return "Done. " + " ".join(results) + (f" It works now, thank you! {END_MARK}" if works else "")
        if asked is not None and "number" in asked.content.lower():
            return f"My number is {phone}."
        return "I don't know what to do on my phone. Please tell me exactly which setting to change."


_STATUS = re.compile(r"airplane mode (on|off) \| mobile data (on|off) \| data roaming (on|off) \| APN (\S+)")


class PhoneSupportReference(ScriptedPolicy):
    """The reference assistant: looks up the account, resumes a suspended line, asks for the
    phone's status screen and tells the user exactly which settings to change (then to run a
    speed test). Succeeds on every item with :class:`PhoneSupportUser`."""

    name = "phone-support-reference"
    uses_rng = False

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        msgs = list(observation)
        account = next((json.loads(m.content) for m in msgs if m.role == "tool"
                        and m.meta.get("name") == "lookup_account" and m.meta.get("ok")), None)
        if account is None:
            opening = next((m.content for m in msgs if m.author == "user"), "")
            found = re.search(r"\d{3}-\d{4}", opening)
            if found is None:
                return "Could you tell me your phone number, please?"
            return _call("lookup_account", {"phone_number": found.group(0)})
        if account["line"] == "suspended" and not any(m.meta.get("name") == "resume_line" for m in msgs
                                                      if m.role == "tool"):
            return _call("resume_line", {"phone_number": account["phone_number"]})
        last = observation.last(author="user")
        status = _STATUS.search(last.content) if last is not None else None
        if status is None:
            return "Thanks. Please check the status screen of your phone and tell me what it shows."
        airplane, data, roaming, apn = status.groups()
        abroad = account["location"].startswith("abroad")
        steps = []
        if airplane == "on":
            steps.append("Turn off airplane mode.")
        if data == "off":
            steps.append("Turn on mobile data.")
        if (roaming == "on") != abroad:
            steps.append(f"Turn {'on' if abroad else 'off'} data roaming.")
        if apn != account["apn"]:
            steps.append(f"Set the APN to \"{account['apn']}\".")
        return ("Thank you. Please do these steps on your phone: " + " ".join(steps)
                + " Then run a speed test.") if steps else "Thank you. Please run a speed test now."


#: The naive assistant's message (the card's naive baseline): the usual advice, no diagnosis.
NAIVE_TEXT = ("Sorry to hear that! Please restart your phone, make sure airplane mode is off and mobile "
              "data is on, then run a speed test.")


class PhoneSupportNaive(ScriptedPolicy):
    """The naive assistant: no tools and no diagnosis, the usual advice every turn
    (:data:`NAIVE_TEXT`); it succeeds only where that advice happens to be the whole fix."""

    name = "phone-support-naive"
    uses_rng = False

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        return NAIVE_TEXT


#: The policies' short names (registered by :func:`collab_env.tasks.register_builtin`).
PHONE_POLICIES: dict[str, str] = {
    "phone-support-user": "collab_env.tasks.phone_support:PhoneSupportUser",
    "phone-support-reference": "collab_env.tasks.phone_support:PhoneSupportReference",
    "phone-support-naive": "collab_env.tasks.phone_support:PhoneSupportNaive",
}

PHONE_SUPPORT_CARD = EnvCard(
    tests="Dual control with tools: guiding a user who holds the state (a phone only the user's tools "
          "change) while acting on the side only the assistant's tools reach (the account); graded by "
          "the final state, never by what is said.",
    players={
        "assistant": "trainable; tools lookup_account and resume_line (the account)",
        "user": "simulated (default PhoneSupportUser, scripted): the phone's tools check_status, "
                "set_airplane_mode, set_mobile_data, set_data_roaming, set_apn, restart_phone, "
                "run_speed_test",
    },
    sees={
        "assistant": "the user's text messages, its own tool calls and their results; not the phone",
        "user": "the assistant's text messages, its own tool calls and their results; not the account",
    },
    reward="default: 1 for the assistant when the episode ends (the user writes [done], or max_steps) "
           "with the line active and the phone at the goal (airplane mode off, mobile data on, the "
           "plan's APN, data roaming on exactly when abroad), else 0 (component 'resolved'). mr and "
           "conversation do not apply: the spec's weight resolved is no registered metric.",
    reward_range={"default": (0.0, 1.0)},
    limits="max_steps 40 (each tool call is a step); the user ends the chat with [done]",
    data="generated from the index (offline, unlimited): plan (3), home or abroad (1/2), 1-2 phone "
         "faults among airplane mode, mobile data, data roaming, APN, and a suspended line (2/5)",
    licence="Apache-2.0 (written for this package)",
    baselines={
        "phone-support-reference": baseline_text("1.000", 200, "1.000"),
        "phone-support-naive": baseline_text("0.210", 200, "0.210"),
    },
    # 12 episodes: a failing naive episode plays to max_steps (about 7 rounds of tool calls)
    audit={"naive": {"assistant": "phone-support-naive"}, "episodes": 12},
    exploits=EXPLOIT_QUOTES.get(ENV_ID, ""),
)

__doc__ = (__doc__ or "") + cards_section({ENV_ID: PHONE_SUPPORT_CARD}, "collab_env.tasks.phone_support")

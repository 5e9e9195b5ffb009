"""The workload of ``bench/router.py``: agentic, multi-turn sessions over shared system prompts.

What users of long-context serving send: a few long system prompts (an agent's instructions and
tool definitions), each shared by several users; every user runs a multi-turn session whose
history grows well beyond the system prompt (each turn pastes a document or a tool's output
beside a question, and the model's real answer is part of the next turn's prompt); the sessions
of all users interleaved in a random order, as concurrent users' turns arrive at a server.

A request's text is ``system prompt + earlier turns (each: question, document, answer) + the new
turn (question, document)``; the answer is what the server generated (``answer_tokens`` tokens,
``ignore_eos``), appended as the server returned it, so the next turn's prompt is re-tokenized
from text as a client's is (where the tokenizer does not round-trip a generated token, that part
of the history misses for every policy alike). Every text starts with the phase's tag, so no
phase hits another's cache. Pure and deterministic: the same seed gives the same texts (up to
the answers) and the same order.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

# Prose words (the tiny model's tokenizer corpus: about 5 characters per token) and the shapes
# of tool output (identifiers, numbers, key=value: 1-2 characters per token).
_PROSE = (
    "the hierarchical cache keeps key value pages of long prompts in device memory host "
    "and a storage tier request that shares prefix with an earlier one reuses its cached "
    "instead computing them again multi turn chats agents documents system prompt benefit "
    "most move from to when fills up background pool")
WORDS = tuple(_PROSE.split())
TOOLS = ("search_docs", "read_file", "run_query", "list_tickets", "get_metrics", "call_api")
STATUS = ("ok", "failed", "pending", "retry", "skipped")


@dataclass(frozen=True)
class Workload:
    systems: int = 8  # distinct system prompts
    users_per_system: int = 3  # sessions sharing each system prompt
    turns: int = 6  # turns per session
    system_words: int = 200  # prose words of a system prompt, beside its tool definitions
    question_words: int = 12
    document_lines: tuple[int, int] = (6, 14)  # lines of a pasted document / tool output
    answer_tokens: int = 32  # generated per request (the answer joins the history)
    seed: int = 7

    @property
    def sessions(self) -> int:
        return self.systems * self.users_per_system

    def describe(self) -> dict[str, Any]:
        return {**asdict(self), "sessions": self.sessions,
                "requests": self.sessions * self.turns,
                "order": "sessions interleaved uniformly at random (seeded)"}

    def order(self) -> list[tuple[int, int]]:
        """(session, turn) pairs: each step picks one of the sessions with turns left, with
        probability proportional to its turns left (a uniformly random interleaving of the
        sessions' turn sequences: concurrent users at their own pace). Same every phase."""
        rng = random.Random(self.seed)
        left = {s: self.turns for s in range(self.sessions)}
        out: list[tuple[int, int]] = []
        while left:
            sessions = sorted(left)
            s = rng.choices(sessions, weights=[left[k] for k in sessions])[0]
            out.append((s, self.turns - left[s]))
            left[s] -= 1
            if not left[s]:
                del left[s]
        return out

    def system_prompt(self, tag: str, system: int) -> str:
        rng = random.Random(f"{self.seed}/system/{system}")
        prose = " ".join(rng.choice(WORDS) for _ in range(self.system_words))
        tools = "\n".join(
            f"- {name}(query: str, limit: int = {rng.randrange(5, 50)}) -> "
            + " ".join(rng.choice(WORDS) for _ in range(12))
            for name in TOOLS)
        return f"[{tag}] You are agent {system}. {prose}\nTools:\n{tools}\n"

    def user_turn(self, session: int, turn: int) -> str:
        """The new part of a turn: a question and a pasted document or tool output."""
        rng = random.Random(f"{self.seed}/turn/{session}/{turn}")
        question = " ".join(rng.choice(WORDS) for _ in range(self.question_words))
        tool = rng.choice(TOOLS)
        lines = []
        for _ in range(rng.randint(*self.document_lines)):
            if rng.random() < 0.5:
                lines.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 16))))
            else:
                lines.append(f"id={rng.randrange(10**6)} user{session} "
                             f"status={rng.choice(STATUS)} took={rng.randrange(1000)}ms")
        return (f"\nUser {session}: {question}?\n<{tool} output>\n" + "\n".join(lines)
                + f"\n</{tool} output>\nAssistant:")


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of ``a`` and ``b`` (binary search over slices)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def ideal_hits(requests: list[tuple[str, str, str]]) -> float:
    """The character hit ratio an unbounded prefix cache on every pod would give for the
    requests as routed: ``(pod, prompt, prompt + answer)`` in arrival order; a request hits the
    longest prefix it shares with anything its pod has already seen (prompt and answer). What
    the engines' caches cannot exceed for that routing (up to the page granularity and the
    tokenizer), so it tells a routing's cost apart from the engines' own misses."""
    seen: dict[str, list[str]] = {}
    hit = total = 0
    for pod, prompt, after in requests:
        hit += max((common_prefix(prompt, c) for c in seen.get(pod, [])), default=0)
        total += len(prompt)
        seen.setdefault(pod, []).append(after)
    return round(hit / total, 4) if total else 0.0


def model_routing(w: Workload, pods: int, policy: str, answer_words: int = 24) -> float:
    """``ideal_hits`` for the workload routed to ``pods`` pods by ``policy`` (``round_robin``:
    the n-th request to pod n mod pods, as smg's round robin; ``sticky``: every turn of a
    session on the pod its first turn went to, the first turn to the pod that holds the longest
    prefix of it, else the pod with fewest sessions: the best a prefix router can do), with
    random answers of ``answer_words`` words (about the bench's 32 tokens). A model, not a
    measurement: it shows what routing alone can change when no pod's cache evicts."""
    history: dict[int, str] = {}
    home: dict[int, int] = {}
    seen: dict[int, list[str]] = {p: [] for p in range(pods)}
    requests: list[tuple[str, str, str]] = []
    for n, (session, turn) in enumerate(w.order()):
        if turn == 0:
            history[session] = w.system_prompt("model", session // w.users_per_system)
        text = history[session] + w.user_turn(session, turn)
        if policy == "round_robin":
            pod = n % pods
        else:
            if session not in home:
                home[session] = max(range(pods), key=lambda p: (
                    max((common_prefix(text, c) for c in seen[p]), default=0),
                    -sum(h == p for h in home.values())))
            pod = home[session]
        rng = random.Random(f"{w.seed}/answer/{session}/{turn}")
        history[session] = text + " " + " ".join(
            rng.choice(WORDS) for _ in range(answer_words))
        seen[pod].append(history[session])
        requests.append((str(pod), text, history[session]))
    return ideal_hits(requests)


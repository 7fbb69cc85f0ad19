"""Turn an :class:`~hoprl.domain.Episode` into the token-level form the trainer uses.

The conversation is the episode's initial messages followed, per step, by the assistant segment
(``Step.text``) and, when there is one, the injected information as a user message. It is
rendered with the tokenizer's chat template:

- prompt = the initial messages with the generation prompt (e.g. ``<|im_start|>assistant\\n``);
- completion = everything after, up to the end of the rendered conversation;
- mask = 1 exactly on the tokens of assistant content (what the policy generated), 0 on injected
  user turns and on the template tokens around and between turns (``<|im_end|>``, role headers).

Assistant content is tokenized on its own and the text between two assistant contents in one
piece, so the mask-1 tokens decode to exactly the generated text. (A real rollout's token ids
may tokenize the same text differently; without ids from the server this is the canonical form.)

The chat is the *linear record* of the episode: after an EVO-RAG backtrack the policy saw a
shorter context than this, but every generated segment is here, in order.

Templates must render a conversation as a prefix of the rendering of any longer conversation
(true of ChatML, Llama and most templates); one that rewrites earlier turns raises ``ValueError``.
"""

from __future__ import annotations

from typing import Any

from hoprl.domain import Episode, TokenTrajectory


def episode_messages(episode: Episode) -> list[dict[str, str]]:
    """The episode as chat messages (the linear record; see the module docstring)."""
    messages = [dict(m) for m in episode.prompt]
    for step in episode.steps:
        messages.append({"role": "assistant", "content": step.text})
        if step.information:
            messages.append({"role": "user", "content": step.information})
    return messages


def _render(tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool) -> str:
    return str(
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    )


def _pieces(tokenizer: Any, messages: list[dict[str, str]], n_prompt: int) -> list[tuple[str, int]]:
    """The completion as ``(text, mask)`` pieces: assistant contents (1) and all else (0)."""
    emitted = _render(tokenizer, messages[:n_prompt], True)
    pieces: list[tuple[str, int]] = []
    for i in range(n_prompt, len(messages)):
        target = _render(tokenizer, messages[: i + 1], False)
        if not target.startswith(emitted):
            raise ValueError(
                f"the chat template rewrites earlier turns (message {i}); token masks need a "
                "template whose renderings extend each other"
            )
        delta = target[len(emitted) :]
        content = messages[i]["content"]
        if messages[i]["role"] == "assistant":
            at = delta.find(content)
            if at < 0:
                raise ValueError(f"the chat template altered assistant content of message {i}")
            pieces += [(delta[:at], 0), (content, 1), (delta[at + len(content) :], 0)]
        else:
            pieces.append((delta, 0))
        emitted = target
        if i + 1 < len(messages) and messages[i + 1]["role"] == "assistant":
            with_prompt = _render(tokenizer, messages[: i + 1], True)
            pieces.append((with_prompt[len(emitted) :], 0))
            emitted = with_prompt
    return pieces


def to_token_trajectory(episode: Episode, tokenizer: Any) -> TokenTrajectory:
    """Token ids and mask of ``episode`` under ``tokenizer``'s chat template.

    Example::

        traj = to_token_trajectory(episode, AutoTokenizer.from_pretrained(model))
        generated = [t for t, m in zip(traj.completion_ids, traj.mask) if m]
    """
    messages = episode_messages(episode)
    n_prompt = len(episode.prompt)
    if n_prompt == 0:
        raise ValueError("episode.prompt is empty: the runner records the initial messages there")

    def encode(text: str) -> list[int]:
        # The rendered template already holds BOS and role tokens: add nothing.
        return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    prompt_ids = encode(_render(tokenizer, messages[:n_prompt], True))
    completion_ids: list[int] = []
    mask: list[int] = []
    pending = ""  # neighbouring mask-0 pieces are tokenized together, as one text
    for text, m in _pieces(tokenizer, messages, n_prompt):
        if m == 0:
            pending += text
            continue
        ids = encode(pending)
        completion_ids += ids
        mask += [0] * len(ids)
        pending = ""
        ids = encode(text)
        completion_ids += ids
        mask += [1] * len(ids)
    ids = encode(pending)
    completion_ids += ids
    mask += [0] * len(ids)
    return TokenTrajectory(prompt_ids=prompt_ids, completion_ids=completion_ids, mask=mask)

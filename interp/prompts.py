"""Your own prompts as the Batches every analysis takes: text, a tokenizer, clean / corrupted pairs.

    pairs = [PromptPair("When Mary and John went to the store, John gave a drink to",
                        "When Mary and John went to the store, Mary gave a drink to",
                        answer=" Mary", wrong_answer=" John",
                        roles={"IO": "Mary", "S1": ["John", 0], "S2": ["John", 1], "END": -1})]
    prompts = tokenize_pairs(tokenizer, pairs)       # or read_prompts("pairs.jsonl"), ioi_pairs(64, seed=0)
    interchange(model, prompts.clean, prompts.corrupt, sites, metrics=["logit_diff"])

The metric. Every analysis reads the clean answer y at the answer position (the last loss_mask
position: the prompt's last token) and the corrupted answer y' (the corrupt batch's target there):
here y = `answer` and y' = `wrong_answer`, so interchange's / attribute's "logit_diff" and the
circuits' default metric are logit(answer) - logit(wrong_answer) at the prompt's last token, and
restoration is that of p(answer). Each answer is one token: a string that tokenizes to exactly
one token (" Mary", with its leading space for GPT-2's tokenizer) or a token id.

Alignment. A site at a role patches the role's position in the corrupted run from the role's
position in the clean run; a site at every position, or at an int position, patches position t
from position t. Without `corrupted_roles` the corrupted prompt's roles are the clean prompt's
token positions, so its clean and corrupted prompts must tokenize to the same number of tokens
(refused, naming the pair, when they do not). With `corrupted_roles` (the same role names, found
in the corrupted prompt: names of other token lengths, names in another order) the two prompts
may differ in length; then role sites and positional circuits (graphs with role position groups:
interp.analysis.circuits.positional) align them by role, and the analyses that patch position t
from position t refuse such a pair in one line (interp.analysis.interventions.sites.check_aligned,
a circuit over every position). Pairs of different lengths share a batch by padding:
"right" (default) pads after the prompt, where a causal model's outputs at the prompt's own
positions do not see it, so every number equals the unpadded run's; "left" pads before, which
the models here see (they take no attention mask: the pad tokens are context, and GPT-2's
positions shift), so use it only with prompts of one length or when that is wanted.
`lengths` holds each clean prompt's token count, `corrupt_lengths` each corrupted one's.

Roles name positions of the clean prompt (`roles`) and of the corrupted one (`corrupted_roles`,
default the clean prompt's token positions), each one token per pair: a substring ("Mary": its
first occurrence), [substring, k] (its k-th occurrence, from 0), [start, end] (a character span
of the prompt) - each the last token that overlaps the text, the one that has read all of it -
or an int token position of the prompt (negative from its end: -1 is the last token). Substring and span roles need the tokenizer's character offsets
(a fast transformers tokenizer, a `tokenizers.Tokenizer`, or a callable returning (ids, offsets)).

The rest of the Batch: targets are the next token inside the prompt and the answer (clean) /
wrong answer (corrupted) at its last token, the pad id elsewhere; loss_mask is True at the last
token only; text has no ground-truth latent state, so `states` is [N, T] int64 filled with
NO_STATE (-1): a probe fit to it fails loudly rather than learning a constant.

Prompt files (`read_prompts`, `interp patch / circuit --prompts FILE`): JSONL, one pair per line,
or JSON holding a list of pairs; each pair an object with the fields of PromptPair: "clean",
"corrupted" (strings), "answer", "wrong_answer" (string or token id), optional "roles" (an object
of the role forms above) and "corrupted_roles" (the same names, found in the corrupted prompt).

Tokenizers (`encoder`): a transformers tokenizer (fast ones give offsets; special tokens as the
tokenizer adds them, e.g. none for GPT-2, BOS for Llama), a `tokenizers.Tokenizer`, or any
callable text -> list of ids or text -> (ids, offsets [(start, end) per token]).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from interp.tasks.base import Batch

NO_STATE = -1          # Batch.states of text: no ground-truth latent state
PADDINGS = ("right", "left")
FIELDS = ("clean", "corrupted", "answer", "wrong_answer", "roles", "corrupted_roles")
Encoded = tuple[list[int], list[tuple[int, int]] | None]   # token ids, character offsets (or None)


@dataclass
class PromptPair:
    """One clean / corrupted pair (module docstring). corrupted_roles: the roles' places in the
    corrupted prompt (None: the clean prompt's token positions). where: names it in errors (a file line)."""

    clean: str
    corrupted: str
    answer: str | int
    wrong_answer: str | int
    roles: dict = field(default_factory=dict)
    corrupted_roles: dict | None = None
    where: str = ""

    def __post_init__(self) -> None:
        name = self.where or "a prompt pair"
        for key in ("clean", "corrupted"):
            value = getattr(self, key)
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name}: field {key!r} must be a non-empty string; got {value!r}")
        for key in ("answer", "wrong_answer"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "" or \
                    (isinstance(value, int) and value < 0):
                raise ValueError(f"{name}: field {key!r} must be a non-empty string or a token id >= 0; got {value!r}")
        if not isinstance(self.roles, dict) or not all(isinstance(k, str) and k for k in self.roles):
            raise ValueError(f"{name}: field 'roles' must be an object of role name -> position; got {self.roles!r}")
        if self.corrupted_roles is None:
            return
        if not isinstance(self.corrupted_roles, dict) or not all(isinstance(k, str) and k for k in self.corrupted_roles):
            raise ValueError(f"{name}: field 'corrupted_roles' must be an object of role name -> position; got "
                             f"{self.corrupted_roles!r}")
        for role in [*self.roles, *self.corrupted_roles]:
            if (role in self.roles) != (role in self.corrupted_roles):
                has, lacks = ("roles", "corrupted_roles") if role in self.roles else ("corrupted_roles", "roles")
                raise ValueError(f"{name}: role {role!r} is in {has!r} but not in {lacks!r}; 'corrupted_roles' must "
                                 f"name the same roles {sorted(self.roles)}")


@dataclass
class Prompts:
    """Tokenized pairs: clean and corrupt Batches [N, T] (padded to one T), lengths [N] (tokens of
    each clean prompt), answers / wrong_answers [N] token ids, the pairs, the padding side,
    corrupt_lengths [N] (tokens of each corrupted prompt: the clean lengths unless the pairs give
    corrupted_roles)."""

    clean: Batch
    corrupt: Batch
    lengths: torch.Tensor
    answers: torch.Tensor
    wrong_answers: torch.Tensor
    pairs: list[PromptPair]
    padding: str
    corrupt_lengths: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.pairs)


def encoder(tokenizer, add_special_tokens: bool = True) -> Callable[[str], Encoded]:
    """text -> (ids, offsets or None) for a transformers tokenizer, a tokenizers.Tokenizer or a
    callable (module docstring)."""
    if hasattr(tokenizer, "is_fast") and hasattr(tokenizer, "convert_ids_to_tokens"):   # transformers
        def hf(text: str) -> Encoded:
            out = tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=bool(tokenizer.is_fast))
            return list(out["input_ids"]), ([tuple(o) for o in out["offset_mapping"]] if tokenizer.is_fast else None)
        return hf
    if type(tokenizer).__module__.startswith("tokenizers") and hasattr(tokenizer, "encode"):
        def fast(text: str) -> Encoded:
            out = tokenizer.encode(text, add_special_tokens=add_special_tokens)
            return list(out.ids), [tuple(o) for o in out.offsets]
        return fast
    if callable(tokenizer):
        def plain(text: str) -> Encoded:
            out = tokenizer(text)
            if isinstance(out, tuple) and len(out) == 2 and not isinstance(out[0], int):   # (ids, offsets)
                ids, offsets = _ids(out[0]), [tuple(o) for o in out[1]]
                if len(offsets) != len(ids):
                    raise TypeError(f"the tokenizer gave {len(ids)} ids and {len(offsets)} offsets for {text!r}; "
                                    "it must give one (start, end) per token")
                return ids, offsets
            return _ids(out), None
        return plain
    raise TypeError(f"tokenizer must be a transformers tokenizer, a tokenizers.Tokenizer or a callable text -> ids; "
                    f"got {type(tokenizer).__name__}")


def _ids(values) -> list[int]:
    ids = values.tolist() if hasattr(values, "tolist") else list(values)
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise TypeError(f"the tokenizer must return token ids (ints >= 0); got {ids[:8]!r}")
    return ids


def answer_id(tokenize: Callable[[str], Encoded], answer: str | int, where: str, key: str) -> int:
    """The token id of an answer: an id as given, or the one token a string tokenizes to."""
    if isinstance(answer, int):
        return answer
    ids, offsets = tokenize(answer)
    if offsets is not None:   # special tokens the tokenizer adds (BOS) have empty offsets
        ids = [i for i, (start, end) in zip(ids, offsets) if end > start]
    if len(ids) != 1:
        raise ValueError(f"{where}: field {key!r} {answer!r} tokenizes to {len(ids)} tokens {ids}; an answer must be "
                         "one token (give its token id, or a string such as ' Mary' with its leading space)")
    return ids[0]


def role_position(spec, text: str, offsets, n_tokens: int, where: str, name: str, side: str = "clean") -> int:
    """The token position (0 .. n_tokens-1 of the prompt) of one role spec (module docstring) in
    the `side` ("clean" or "corrupted") prompt `text`."""
    role = f"role {name!r}" if side == "clean" else f"{side} role {name!r}"
    if isinstance(spec, int) and not isinstance(spec, bool):
        if not -n_tokens <= spec < n_tokens:
            raise ValueError(f"{where}: {role} token position {spec} is outside the prompt's {n_tokens} tokens")
        return spec % n_tokens
    start, end = _char_span(spec, text, where, role, side)
    if offsets is None:
        raise ValueError(f"{where}: {role} names text, which needs the tokenizer's character offsets (a fast "
                         "transformers tokenizer, a tokenizers.Tokenizer, or a callable returning (ids, offsets)); "
                         "give a token position instead")
    hits = [t for t, (s, e) in enumerate(offsets) if s < end and e > start]
    if not hits:
        raise ValueError(f"{where}: {role} (characters {start}..{end}) overlaps no token")
    return hits[-1]


def _char_span(spec, text: str, where: str, role: str, side: str) -> tuple[int, int]:
    """[start, end) of a substring, [substring, k] or [start, end] role in text."""
    forms = "a substring, [substring, occurrence], [start, end] characters or an int token position"
    if isinstance(spec, str):
        spec = [spec, 0]
    if not isinstance(spec, (list, tuple)) or len(spec) != 2 or any(isinstance(s, bool) for s in spec):
        raise ValueError(f"{where}: {role} must be {forms}; got {spec!r}")
    if isinstance(spec[0], str) and isinstance(spec[1], int) and spec[0] and spec[1] >= 0:
        start = -1
        for _ in range(spec[1] + 1):
            start = text.find(spec[0], start + 1)
            if start < 0:
                raise ValueError(f"{where}: {role}: {spec[0]!r} does not occur {spec[1] + 1} time(s) in the "
                                 f"{side} prompt {text!r}")
        return start, start + len(spec[0])
    if all(isinstance(s, int) for s in spec) and 0 <= spec[0] < spec[1] <= len(text):
        return spec[0], spec[1]
    raise ValueError(f"{where}: {role} must be {forms} (a span within the prompt's {len(text)} characters); "
                     f"got {spec!r}")


def _pad_id(tokenizer, pad_id: int | None) -> int:
    if pad_id is not None:
        if isinstance(pad_id, bool) or not isinstance(pad_id, int) or pad_id < 0:
            raise ValueError(f"pad_id must be None or a token id >= 0; got {pad_id!r}")
        return pad_id
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, int):
            return value
    return 0


def _check_padding(padding: str) -> None:
    if padding not in PADDINGS:
        raise ValueError(f"padding must be one of {PADDINGS}; got {padding!r}")


def _batch(rows: list[list[int]], finals: list[int], roles: list[dict[str, int]], padding: str, pad: int,
           length: int) -> Batch:
    """A Batch of token rows (padded to `length`), the target at each row's last token `finals`,
    the roles' positions in each row (shifted by left padding)."""
    n = len(rows)
    tokens = torch.full((n, length), pad, dtype=torch.long)
    targets = torch.full((n, length), pad, dtype=torch.long)
    loss_mask = torch.zeros(n, length, dtype=torch.bool)
    shifts = [length - len(r) if padding == "left" else 0 for r in rows]
    for b, (row, final, shift) in enumerate(zip(rows, finals, shifts)):
        tokens[b, shift:shift + len(row)] = torch.tensor(row)
        targets[b, shift:shift + len(row)] = torch.tensor(row[1:] + [final])
        loss_mask[b, shift + len(row) - 1] = True
    positions = {name: torch.tensor([r[name] + s for r, s in zip(roles, shifts)], dtype=torch.long)
                 for name in roles[0]}
    states = torch.full((n, length), NO_STATE, dtype=torch.long)
    return Batch(tokens, targets, loss_mask, states, positions)


def _same_roles(pairs: Sequence[PromptPair]) -> None:
    names = sorted(pairs[0].roles)
    for pair in pairs[1:]:
        if sorted(pair.roles) != names:
            raise ValueError(f"{pair.where or 'a prompt pair'}: roles {sorted(pair.roles)} differ from the first "
                             f"pair's {names}; every pair must name the same roles")


def tokenize_pairs(tokenizer, pairs: Sequence[PromptPair], padding: str = "right", pad_id: int | None = None,
                   add_special_tokens: bool = True) -> Prompts:
    """Prompts (clean and corrupt Batches, aligned) of clean / corrupted pairs (module docstring).
    pad_id: default the tokenizer's pad token, else its EOS, else 0 (its value changes nothing
    with right padding)."""
    _check_padding(padding)
    pairs = list(pairs)
    if not pairs or not all(isinstance(p, PromptPair) for p in pairs):
        raise ValueError(f"pairs must be a non-empty list of PromptPair; got {pairs[:2]!r}")
    _same_roles(pairs)
    tokenize = encoder(tokenizer, add_special_tokens)
    plain = encoder(tokenizer, add_special_tokens=False)
    clean_rows, corrupt_rows, roles, corrupt_roles, answers, wrongs = [], [], [], [], [], []
    for index, pair in enumerate(pairs):
        where = pair.where or f"pair {index}"
        (clean, offsets), (corrupt, corrupt_offsets) = tokenize(pair.clean), tokenize(pair.corrupted)
        for key, ids in (("clean", clean), ("corrupted", corrupt)):
            if not ids:
                raise ValueError(f"{where}: field {key!r} {getattr(pair, key)!r} tokenizes to no tokens")
        if len(clean) != len(corrupt) and pair.corrupted_roles is None:
            raise ValueError(f"{where}: clean and corrupted prompts tokenize to {len(clean)} and {len(corrupt)} "
                             "tokens; they must align token by token (patching moves position t to position t), or "
                             "give 'corrupted_roles' to align them by role")
        roles.append({name: role_position(spec, pair.clean, offsets, len(clean), where, name)
                      for name, spec in pair.roles.items()})
        corrupt_roles.append(dict(roles[-1]) if pair.corrupted_roles is None else
                             {name: role_position(pair.corrupted_roles[name], pair.corrupted, corrupt_offsets,
                                                  len(corrupt), where, name, "corrupted") for name in pair.roles})
        answers.append(answer_id(plain, pair.answer, where, "answer"))
        wrongs.append(answer_id(plain, pair.wrong_answer, where, "wrong_answer"))
        if answers[-1] == wrongs[-1]:
            raise ValueError(f"{where}: answer and wrong_answer are the same token {answers[-1]}; the logit difference "
                             "needs two different tokens")
        clean_rows.append(clean)
        corrupt_rows.append(corrupt)
    pad, width = _pad_id(tokenizer, pad_id), max(len(r) for r in clean_rows + corrupt_rows)
    return Prompts(_batch(clean_rows, answers, roles, padding, pad, width),
                   _batch(corrupt_rows, wrongs, corrupt_roles, padding, pad, width),
                   torch.tensor([len(r) for r in clean_rows]), torch.tensor(answers), torch.tensor(wrongs), pairs,
                   padding, torch.tensor([len(r) for r in corrupt_rows]))


def read_prompts(path: str | Path) -> list[PromptPair]:
    """The pairs of a prompt file: JSONL (one object per line; blank lines skipped) or .json (a list
    of objects). Errors name the file, the line (JSONL) or item (JSON) and the field."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"prompt file {str(path)!r} is not UTF-8 text: {error}") from None
    if path.suffix == ".json":
        try:
            items = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: not valid JSON ({error})") from None
        if not isinstance(items, list):
            raise ValueError(f"{path}: a .json prompt file must hold a list of pairs; got {type(items).__name__}")
        entries = [(f"{path} item {i}", item) for i, item in enumerate(items)]
    else:
        entries = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    entries.append((f"{path} line {number}", json.loads(line)))
                except json.JSONDecodeError as error:
                    raise ValueError(f"{path} line {number}: not a JSON object ({error.msg})") from None
    if not entries:
        raise ValueError(f"{path}: holds no prompt pairs")
    return [_pair(where, item) for where, item in entries]


def _pair(where: str, item) -> PromptPair:
    if not isinstance(item, dict):
        raise ValueError(f"{where}: must be a JSON object with fields {list(FIELDS[:4])}; got {type(item).__name__}")
    for key in item:
        if key not in FIELDS:
            close = difflib.get_close_matches(key, FIELDS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"{where}: unknown field {key!r}{hint}; the fields are {list(FIELDS)}")
    missing = [key for key in FIELDS[:4] if key not in item]
    if missing:
        raise ValueError(f"{where}: field {missing[0]!r} is missing (each pair needs {list(FIELDS[:4])})")
    return PromptPair(**item, where=where)


# IOI: indirect-object identification (Wang et al. 2022). Names one token each for GPT-2 (with a space).
IOI_NAMES = ("Mary", "John", "Tom", "James", "Dan", "Sid", "Kate", "Anne", "Paul", "Mark", "Lisa", "Sarah")
IOI_TEMPLATES = (
    "When {IO} and {S} went to the store, {S} gave a drink to",
    "When {IO} and {S} went to the park, {S} gave a ball to",
    "After {S} and {IO} went to the office, {S} handed a book to",
    "Then, {IO} and {S} had a long argument, and afterwards {S} said to",
)
IOI_CORRUPTIONS = ("swap", "abc")


def ioi_pairs(n: int, seed: int = 0, names: Sequence[str] = IOI_NAMES, templates: Sequence[str] = IOI_TEMPLATES,
              corruption: str = "swap") -> list[PromptPair]:
    """n IOI pairs: a template (one {IO}, two {S}) filled with two distinct names; answer " IO",
    wrong_answer " S"; roles IO, S1, S2 (the names' tokens) and END (the last token), in the
    clean prompt and (corrupted_roles) at the same slots of the corrupted one, so that names of
    other token lengths stay aligned by role. The corrupted prompt: "swap" puts the IO name at
    S2 (its answer becomes S), "abc" three other names (neither answer is in it). Template and
    names are drawn with numpy's default_rng(seed)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int; got {n!r}")
    if corruption not in IOI_CORRUPTIONS:
        raise ValueError(f"corruption must be one of {IOI_CORRUPTIONS}; got {corruption!r}")
    names = list(dict.fromkeys(names))
    if len(names) < (5 if corruption == "abc" else 2):
        raise ValueError(f"names must hold at least {5 if corruption == 'abc' else 2} distinct names; got {names!r}")
    for template in templates:
        if template.count("{IO}") != 1 or template.count("{S}") != 2:
            raise ValueError(f"each template needs one {{IO}} and two {{S}}; got {template!r}")
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(n):
        template = templates[int(rng.integers(len(templates)))]
        picked = [names[i] for i in rng.choice(len(names), size=5 if corruption == "abc" else 2, replace=False)]
        io, s = picked[:2]
        clean, spans = _fill(template, [io, s, s])
        other = [io, s, io] if corruption == "swap" else picked[2:5]
        corrupted, other_spans = _fill(template, other)
        roles, corrupted_roles = ({"IO": at["IO"], "S1": at["S"][0], "S2": at["S"][1], "END": -1}
                                  for at in (spans, other_spans))
        pairs.append(PromptPair(clean, corrupted, " " + io, " " + s, roles, corrupted_roles))
    return pairs


def _fill(template: str, values: list[str]) -> tuple[str, dict]:
    """(text, {"IO": [start, end], "S": [[start, end], [start, end]]} character spans): the
    template's {IO} filled with values[0], its first and second {S} with values[1] and values[2]."""
    pieces, spans, text, s_seen = template.replace("{S}", "\0S\0").replace("{IO}", "\0IO\0").split("\0"), {}, "", 0
    for index, piece in enumerate(pieces):
        if index % 2 == 0:
            text += piece
            continue
        value = values[0] if piece == "IO" else values[1 + s_seen]
        span = [len(text), len(text) + len(value)]
        if piece == "IO":
            spans["IO"] = span
        else:
            spans.setdefault("S", []).append(span)
            s_seen += 1
        text += value
    return text, spans

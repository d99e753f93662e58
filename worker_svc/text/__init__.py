"""Sensitive-word text pipeline of the worker: normalisation, lexicon loading and matching."""

from __future__ import annotations

from worker_svc.text.lexicon_file import load_lexicon_file
from worker_svc.text.matcher import Hit, LexiconEntry, Matcher, MatchResult, Verdict
from worker_svc.text.normalize import Normalized, normalize, normalize_word
from worker_svc.text.rules import RULES, RuleConfig, fold

__all__ = [
    "RULES",
    "Hit",
    "LexiconEntry",
    "MatchResult",
    "Matcher",
    "Normalized",
    "RuleConfig",
    "Verdict",
    "fold",
    "load_lexicon_file",
    "normalize",
    "normalize_word",
]

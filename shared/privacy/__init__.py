"""Personal data in free text: one detector (Presidio + spaCy + checksums) and the capture policies.

    from shared.privacy import Redactor, PiiPolicy
    scan = Redactor().scan("mail me at dana@example.com", tenant="acme")   # scan.types == ["EMAIL_ADDRESS"]
    scan.redacted                                          # "mail me at <EMAIL_ADDRESS>"
"""

from shared.privacy.business import NO_DATA, BusinessData, parse_business_data, parse_business_names
from shared.privacy.checksums import card_ok, iban_ok, luhn_ok
from shared.privacy.detector import ENTITIES, PiiDetector, Span
from shared.privacy.instance import create_detector, get_detector
from shared.privacy.policy import PiiPolicy, Redactor, Scan, entity_types, parse_tenant_policies, redact

__all__ = ["ENTITIES", "NO_DATA", "BusinessData", "PiiDetector", "PiiPolicy", "Redactor", "Scan", "Span", "card_ok",
           "create_detector", "entity_types", "get_detector", "iban_ok", "luhn_ok", "parse_business_data",
           "parse_business_names",
           "parse_tenant_policies", "redact"]

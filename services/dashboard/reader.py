"""The topics --> the aggregates: one background thread reading graded records and model-update orders.

It reads every partition from the beginning with a consumer group of its own that never commits: the
aggregates live in memory, so a restarted dashboard rebuilds them from the topics (their retention is the
history it can show), and it never moves the offsets of a service's group. Undecodable records are
counted and skipped; the services that own those topics dead-letter them. Records whose writer cannot be
trusted (no valid signature by a principal allowed to write the topic, a replay, an old model update
re-sent: shared/kafka/trust.py) are skipped too and counted apart (`untrusted`, on the status API and in
`apprentice_records_refused_total`): a forged graded record must not move the pages' rewards.
"""

from __future__ import annotations

import logging
import threading
import uuid

from services.dashboard.aggregates import GradedFold, UpdatesFold
from shared.contracts.events import UndecodableEvent
from shared.contracts.validation import decode_record
from shared.kafka.consumer import EventConsumer
from shared.kafka.trust import RecordTrust, UntrustedRecord
from shared.proto.apprentice.v1 import events_pb2
from shared.retry import Backoff
from shared.settings import CommonSettings

log = logging.getLogger(__name__)

GROUP_PREFIX = "dashboard-"
"""Consumer groups of dashboards (one per process): the health page leaves them out of the lag table."""


class TopicReader:
    def __init__(self, common: CommonSettings, graded: GradedFold, updates: UpdatesFold) -> None:
        self.common, self.graded, self.updates = common, graded, updates
        t = common.topics
        self._topics = {t.graded: (events_pb2.GradedInteraction, graded.add),
                        t.model_updates: (events_pb2.ModelUpdate, updates.add)}
        self.group = t.group_id(f"{GROUP_PREFIX}{uuid.uuid4().hex[:12]}")
        self.undecodable = 0
        self.untrusted = 0
        # one check per topic: model updates are state orders (an old one re-sent is refused)
        self._trust = {t.graded: RecordTrust.from_settings(common),
                       t.model_updates: RecordTrust.from_settings(common, monotonic=True)}
        self.error = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dashboard-reader", daemon=True)

    def start(self) -> TopicReader:
        self._thread.start()
        return self

    def _run(self) -> None:
        consumer = EventConsumer(self.common.kafka_bootstrap, self.group, list(self._topics),
                                 auto_offset_reset="earliest", security=self.common)
        backoff = Backoff(2.0, 10.0)
        try:
            while not self._stop.is_set():
                try:
                    batch = consumer.poll_batch(max_records=1000, timeout=0.5)
                    self.error = ""
                    backoff.reset()
                except Exception as e:  # noqa: BLE001 - a broker outage shows on the health page; keep trying
                    self.error = str(e)
                    log.warning("dashboard reader: %s", e)
                    self._stop.wait(backoff.next())
                    continue
                for m in batch:
                    msg_type, fold = self._topics[str(m.topic())]
                    try:
                        # the checks every consumer applies (type header, finite and in-range values): a
                        # NaN reward would otherwise turn every page's JSON into an error
                        self._trust[str(m.topic())].check(m)
                        fold(decode_record(msg_type, m.value(), m.headers()))
                    except UntrustedRecord as e:
                        self.untrusted += 1
                        log.warning("dashboard reader: skipped %s", e,
                                    extra={"topic": m.topic(), "offset": m.offset()})
                    except UndecodableEvent:
                        self.undecodable += 1
                    except Exception:  # noqa: BLE001 - one record the folds cannot take must not stop the pages
                        self.undecodable += 1
                        log.exception("dashboard reader: a record could not be folded",
                                      extra={"topic": m.topic(), "offset": m.offset()})
        finally:
            consumer.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)

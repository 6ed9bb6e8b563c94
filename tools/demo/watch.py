"""Topics --> what the demo needs to know about the loop's progress (graded ids, knowledge versions,
checkpoints, model updates), from a background consumer in its own group."""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass, field

from shared.contracts.events import UndecodableEvent, decode
from shared.contracts.topics import Topics
from shared.kafka.consumers import new_consumer
from shared.proto.apprentice.v1 import events_pb2


@dataclass
class LoopState:
    graded: dict[str, events_pb2.GradedInteraction] = field(default_factory=dict)   # interaction id -> latest
    knowledge: dict[str, events_pb2.KnowledgeSnapshot] = field(default_factory=dict)  # key -> latest
    checkpoints: list[events_pb2.CheckpointPublished] = field(default_factory=list)
    updates: list[events_pb2.ModelUpdate] = field(default_factory=list)
    interactions: dict[str, int] = field(default_factory=lambda: defaultdict(int))    # id -> times seen
    deadletters: int = 0


class TopicWatcher:
    def __init__(self, bootstrap: str, topics: Topics) -> None:
        self.topics = topics
        self.state = LoopState()
        self.lock = threading.Lock()
        self._stop = threading.Event()
        # log_level 2: while the broker is down (chaos runs restart it) librdkafka would log every reconnect
        self._consumer = new_consumer(bootstrap, purpose="demo-watch", log_level=2)
        self._consumer.subscribe([topics.interactions, topics.graded, topics.knowledge, topics.checkpoints,
                                  topics.model_updates, topics.deadletter])
        self._thread = threading.Thread(target=self._run, name="topic-watcher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        t = self.topics
        while not self._stop.is_set():
            m = self._consumer.poll(0.3)
            if m is None or m.error():
                continue
            try:
                with self.lock:
                    s = self.state
                    if m.topic() == t.graded:
                        g = decode(events_pb2.GradedInteraction, m.value())
                        prev = s.graded.get(g.interaction.interaction_id)
                        if prev is None or g.revision >= prev.revision:
                            s.graded[g.interaction.interaction_id] = g
                    elif m.topic() == t.interactions:
                        s.interactions[decode(events_pb2.Interaction, m.value()).interaction_id] += 1
                    elif m.topic() == t.knowledge:
                        k = decode(events_pb2.KnowledgeSnapshot, m.value())
                        s.knowledge[k.key] = k
                    elif m.topic() == t.checkpoints:
                        s.checkpoints.append(decode(events_pb2.CheckpointPublished, m.value()))
                    elif m.topic() == t.model_updates:
                        s.updates.append(decode(events_pb2.ModelUpdate, m.value()))
                    else:
                        s.deadletters += 1
            except UndecodableEvent:
                continue

    def snapshot(self) -> LoopState:
        with self.lock:
            return LoopState(dict(self.state.graded), dict(self.state.knowledge), list(self.state.checkpoints),
                             list(self.state.updates), dict(self.state.interactions), self.state.deadletters)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._consumer.close()

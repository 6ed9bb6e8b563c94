"""Kafka helpers over confluent-kafka: idempotent producer, commit-after-effect consumer, admin, dead letters."""

from shared.kafka.admin import ensure_topics, wait_for_broker
from shared.kafka.consumer import EventConsumer
from shared.kafka.deadletter import DeadLetterPublisher
from shared.kafka.producer import DeliveryError, EventProducer

__all__ = ["DeadLetterPublisher", "DeliveryError", "EventConsumer", "EventProducer", "ensure_topics",
           "wait_for_broker"]

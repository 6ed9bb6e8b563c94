#!/bin/bash
# Starts the compose broker (apache/kafka image) SASL-only, with the admin password that
# kafka-secrets-init generated into the kafka-secrets volume (never in the repository, never in the
# container's configuration: `docker inspect` shows no secret).
#
# `admin` is the broker's super user, declared here in the JAAS file with SASL PLAIN: it must exist before
# the broker serves its metadata (SCRAM users live in that metadata), because the controller listener and
# inter-broker traffic authenticate as admin too. Every other principal of
# shared/contracts/topic_access.py is a SCRAM-SHA-512 user that kafka-access-init creates afterwards,
# together with the ACLs (tools/deploy_acls.py compose-apply).
set -euo pipefail

password_file=/run/kafka-admin/password
if [[ ! -s $password_file ]]; then
  echo "no admin password in $password_file: kafka-secrets-init must run first" >&2
  exit 1
fi
password=$(<"$password_file")

umask 077   # the JAAS file and the healthcheck's client settings hold the admin password: owner only
mkdir -p /tmp/apprentice
cat > /tmp/apprentice/kafka_server_jaas.conf <<JAAS
KafkaServer {
  org.apache.kafka.common.security.plain.PlainLoginModule required
    username="admin" password="$password" user_admin="$password";
  org.apache.kafka.common.security.scram.ScramLoginModule required;
};
JAAS
cat > /tmp/apprentice/admin.properties <<PROPS
security.protocol=SASL_PLAINTEXT
sasl.mechanism=PLAIN
sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="$password";
PROPS

export KAFKA_OPTS="${KAFKA_OPTS:+$KAFKA_OPTS }-Djava.security.auth.login.config=/tmp/apprentice/kafka_server_jaas.conf"
exec /etc/kafka/docker/run

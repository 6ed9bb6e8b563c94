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
#
# BROKER_ADMIN_PASSWORD_FILE, BROKER_SECRETS_DIR and BROKER_RUN exist for
# tests/integration/test_compose_broker.py, which runs this script with the compose file's broker settings
# against a Kafka outside Docker; compose sets none of them.
set -euo pipefail

password_file=${BROKER_ADMIN_PASSWORD_FILE:-/run/kafka-admin/password}
secrets_dir=${BROKER_SECRETS_DIR:-/tmp/apprentice}
if [[ ! -s $password_file ]]; then
  echo "no admin password in $password_file: kafka-secrets-init must run first" >&2
  exit 1
fi
password=$(<"$password_file")

umask 077   # the JAAS file and the healthcheck's client settings hold the admin password: owner only
mkdir -p "$secrets_dir"
cat > "$secrets_dir/kafka_server_jaas.conf" <<JAAS
KafkaServer {
  org.apache.kafka.common.security.plain.PlainLoginModule required
    username="admin" password="$password" user_admin="$password";
  org.apache.kafka.common.security.scram.ScramLoginModule required;
};
JAAS
cat > "$secrets_dir/admin.properties" <<PROPS
security.protocol=SASL_PLAINTEXT
sasl.mechanism=PLAIN
sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="$password";
PROPS

export KAFKA_OPTS="${KAFKA_OPTS:+$KAFKA_OPTS }-Djava.security.auth.login.config=$secrets_dir/kafka_server_jaas.conf"
exec "${BROKER_RUN:-/etc/kafka/docker/run}"

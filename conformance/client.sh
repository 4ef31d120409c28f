#!/usr/bin/env bash
# The conformance suite's client: the real `gatehouse` binary. The suite starts a test server for
# a scenario and runs this with its URL (and MCP_CONFORMANCE_SCENARIO, MCP_CONFORMANCE_CONTEXT).
# It writes an [[server]] for that URL into a fresh config folder, logs in when the scenario
# is an auth one (as an owner would: `gatehouse mcp login`, with the browser's part played by
# following the authorization server's redirect), then calls every tool the server lists, and
# logs in again when a call says the server asks for more access (a step-up; twice at most).
# For an elicitation scenario the server's forms go to the owners (elicitation = "owner"), and a
# test owner, in its own process beside the call, answers each form that waits with
# `gatehouse mcp answer ID accept`: the form as Gatehouse fills it in (the schema's defaults),
# as an owner pressing Accept in the console would.
set -euo pipefail
url="$1"
scenario="${MCP_CONFORMANCE_SCENARIO:-}"
bin="${GATEHOUSE_BIN:?GATEHOUSE_BIN names the gatehouse binary}"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT

context() { node -e 'const c=JSON.parse(process.env.MCP_CONFORMANCE_CONTEXT||"{}");process.stdout.write(String(c[process.argv[1]]??""))' "$1"; }

cat >"$dir/gatehouse.toml" <<TOML
[server]
# The OAuth redirect URI Gatehouse registers; nothing listens there: this script takes the code
# from the authorization server's redirect, as the owner's browser would carry it.
public_url = "http://127.0.0.1:9"
[database]
url = "sqlite://$dir/gatehouse.db"
[log]
filter = "warn,rmcp=error"
TOML

# The suite's tools have no annotations, so they count as destructive and high risk: without an
# owner to approve each call, this run lets them through (as approval_mode = "yolo" would).
printf 'approval_mode = "yolo"\n' >"$dir/tools.toml"

auth=""
oauth=""
elicit=""
if [[ "$scenario" == elicitation-* ]]; then
  elicit=$'elicitation = "owner"\nelicitation_ttl = "15s"'
fi
if [[ "$scenario" == auth/* ]]; then
  auth='auth = "oauth"'
  client_id="$(context client_id)"
  if [ -n "$client_id" ]; then
    export CONFORMANCE_CLIENT_SECRET="$(context client_secret)"
    oauth=$'[server.oauth]\nclient_id = "'"$client_id"$'"\nclient_secret = { secret = "CONFORMANCE_CLIENT_SECRET" }'
  fi
fi
cat >"$dir/mcp.toml" <<TOML
[[server]]
id = "conf"
trust = "trusted"
approval = "never"
destructive_needs_approval = false
call_timeout = "20s"
$auth
$elicit
[server.transport]
type = "http"
url = "$url"
$oauth
TOML

export GATEHOUSE_MCP_TOKEN_KEY="${GATEHOUSE_MCP_TOKEN_KEY:-$(node -e 'process.stdout.write(require("crypto").randomBytes(32).toString("hex"))')}"
gh() { "$bin" --config "$dir/gatehouse.toml" "$@"; }

login() {
  # `gatehouse mcp login` prints the address to open, then reads the address the browser
  # landed on. The authorization servers of the suite approve at once and redirect.
  coproc LOGIN { gh mcp login conf; }
  local auth_url landed
  IFS= read -r auth_url <&"${LOGIN[0]}"
  landed="$(node -e 'fetch(process.argv[1],{redirect:"manual"}).then(r=>process.stdout.write(r.headers.get("location")||""))' "$auth_url")"
  printf '%s\n' "$landed" >&"${LOGIN[1]}"
  wait "$LOGIN_PID"
}

if [ -n "$auth" ]; then login; fi

# The test owner: answers every form that waits, accepting what the form shows.
answer_forms() {
  while :; do
    for id in $(gh mcp forms 2>/dev/null | awk '$1 == "form" { print $2 }'); do
      gh mcp answer "$id" accept || true
    done
    sleep 0.5
  done
}
if [ -n "$elicit" ]; then
  # The database first (processes starting at once on a new file would take turns migrating
  # it; this just keeps the test owner from waiting).
  gh migrate >/dev/null
  answer_forms &
  owner_pid=$!
  trap 'kill "$owner_pid" 2>/dev/null || true; rm -rf "$dir"' EXIT
fi
args='{}'
[ "$scenario" = tools_call ] && args='{"a":5,"b":3}'
for attempt in 1 2 3; do
  gh mcp refresh conf >/dev/null || true
  status=0
  for tool in $(gh mcp tools conf | cut -f1); do
    out="$(gh tools call "$tool" --as owner --args "$args" 2>&1)" || status=1
    printf '%s\n' "$out"
    case "$out" in *MCP_NEEDS_LOGIN*) status=2 ;; esac
  done
  if [ "$status" != 2 ] || [ -z "$auth" ] || [ "$attempt" = 3 ]; then break; fi
  login
done

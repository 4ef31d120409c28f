#!/usr/bin/env bash
# The conformance suite's client: the real `gatehouse` binary. The suite starts a test server for
# a scenario and runs this with its URL (and MCP_CONFORMANCE_SCENARIO, MCP_CONFORMANCE_CONTEXT).
# It writes an [[server]] for that URL into a fresh config folder, logs in when the scenario
# is an auth one (as an owner would: `gatehouse mcp login`, with the browser's part played by
# following the authorization server's redirect), then calls every tool the server lists, and
# logs in again when a call says the server asks for more access (a step-up; twice at most).
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

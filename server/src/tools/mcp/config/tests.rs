use std::path::Path;

use super::*;
use crate::config::{Problem, tests::problems_mention};

fn load_text(text: &str, secrets: &[&str]) -> Result<McpConfig, Vec<Problem>> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("mcp.toml");
    std::fs::write(&path, text).expect("write");
    let set: Vec<String> = secrets.iter().map(|s| s.to_string()).collect();
    load(&path, &move |v| set.iter().any(|s| s == v))
}

const GOOD: &str = r#"
[[server]]
id = "everything"
trust = "trusted"
allow_tools = ["get-*", "echo"]
deny_tools = ["get-env"]
max_tools = 20
call_timeout = "5s"
default_audience = "public"
default_risk = "low"
approval = "never"
destructive_needs_approval = false
discovery = { timeout = "3s", max_pages = 4 }
[server.transport]
type = "stdio"
command = "node"
args = ["index.js", "stdio"]
env = { MODE = "test", TOKEN = { secret = "EVERYTHING_TOKEN" } }

[[server]]
id = "remote"
[server.transport]
type = "http"
url = "https://mcp.example/mcp"
headers = { Authorization = { secret = "REMOTE_TOKEN", prefix = "Bearer " } }
"#;

#[test]
fn loads_both_transports_with_defaults() {
    let cfg = load_text(GOOD, &["EVERYTHING_TOKEN", "REMOTE_TOKEN"]).expect("valid");
    let everything = cfg.get("everything").expect("server");
    assert_eq!(everything.trust, Trust::Trusted);
    assert_eq!(everything.discovery.max_pages, 4);
    assert_eq!(everything.discovery.max_description_chars, 1_000, "unset limits keep their defaults");
    assert!(everything.takes("get-sum") && everything.takes("echo"));
    assert!(!everything.takes("get-env"), "deny wins over allow");
    assert!(!everything.takes("toggle-simulated-logging"), "not allowed");
    let remote = cfg.get("remote").expect("server");
    assert_eq!(remote.trust, Trust::Untrusted, "untrusted unless said otherwise");
    assert_eq!(remote.default_audience, Audience::OwnerOnly);
    assert_eq!(remote.approval, Approval::Ask);
    assert_eq!(remote.transport.kind(), "http");
    let Transport::Http { headers, .. } = &remote.transport else { panic!("http") };
    let resolved = headers["Authorization"].resolve(&|v| (v == "REMOTE_TOKEN").then(|| "t0ken".into()));
    assert_eq!(resolved.as_deref(), Some("Bearer t0ken"));
}

#[test]
fn reports_every_problem_with_file_and_key() {
    let text = format!(
        "{GOOD}\n{}\n{}\n{}",
        "[[server]]\nid = \"Bad_Id\"\nmax_tools = 0\ncall_timeout = \"0s\"\ndestructive_needs_approval = false\n[server.transport]\ntype = \"http\"\nurl = \"ftp://x\"\nheaders = { \"bad header\" = \"v\" }\n",
        "[[server]]\nid = \"remote\"\n[server.transport]\ntype = \"stdio\"\ncommand = \"\"\nenv = { \"1X\" = \"v\" }\n",
        "[[server]]\nid = \"typo\"\ntrust = \"sure\"\nretries = 3\n[server.transport]\ntype = \"stdio\"\ncommand = \"x\"\n",
    );
    let problems = load_text(&text, &[]).expect_err("invalid");
    let shown = problems_mention(
        &problems,
        &[
            "server[0] (everything).transport: needs the environment variable EVERYTHING_TOKEN",
            "server[1] (remote).transport: needs the environment variable REMOTE_TOKEN",
            "server[2] (Bad_Id).id: must be 1 to 24",
            "server[2] (Bad_Id).max_tools",
            "server[2] (Bad_Id).call_timeout",
            "server[2] (Bad_Id).destructive_needs_approval: only a trusted server",
            "server[2] (Bad_Id).transport.url",
            "server[2] (Bad_Id).transport.headers",
            "server[3] (remote).id: \"remote\" is used by more than one server",
            "server[3] (remote).transport.command",
            "server[3] (remote).transport.env",
        ],
    );
    let has = |needle: &str| shown.iter().any(|s| s.contains(needle));
    assert!(has("server[4] (typo)") && (has("sure") || has("retries")), "{shown:#?}");
    assert!(problems.iter().all(|p| p.source.ends_with("mcp.toml")));
}

#[test]
fn unknown_transport_keys_are_refused() {
    let text = "[[server]]\nid = \"x\"\n[server.transport]\ntype = \"stdio\"\ncommand = \"x\"\nurl = \"http://a\"\n";
    let problems = load_text(text, &[]).expect_err("invalid");
    assert!(problems[0].to_string().contains("url"), "{problems:?}");
    let text = "[[server]]\nid = \"x\"\n[server.transport]\ntype = \"sse\"\nurl = \"http://a\"\n";
    assert!(load_text(text, &[]).is_err(), "the legacy SSE transport is not offered");
}

#[test]
fn disabled_servers_need_no_secrets() {
    let cfg = load_text(&GOOD.replace("id = \"remote\"", "id = \"remote\"\nenabled = false"), &["EVERYTHING_TOKEN"]).expect("valid");
    assert!(!cfg.get("remote").expect("server").enabled);
}

/// A disabled server's secrets need not be set, but must be named by variable: a secret pasted
/// in place of its variable's name is refused, without repeating it, for the console lists
/// the names (see `tools::secrets_named`).
#[test]
fn a_disabled_servers_pasted_secret_is_refused() {
    let pasted = "sk_live_51Habc-def.ghi";
    let text = "[[server]]\nid = \"crm\"\nenabled = false\n[server.transport]\ntype = \"stdio\"\ncommand = \"crm-mcp\"\n";
    let text = format!("{text}env = {{ CRM_TOKEN = {{ secret = \"{pasted}\" }} }}\n");
    let problems = load_text(&text, &[]).expect_err("a pasted secret is no variable's name");
    let said = format!("{problems:?}");
    assert!(said.contains("not an environment variable name") && !said.contains(pasted), "{said}");
}

#[test]
fn the_shipped_file_enables_nothing_and_its_examples_are_valid() {
    let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../config/mcp.toml"));
    let shipped = load(path, &|_| false).expect("shipped mcp.toml loads");
    assert!(shipped.servers.is_empty(), "no server is enabled by default");
    // The commented examples, uncommented, are a valid file.
    let text = std::fs::read_to_string(path).expect("read");
    let examples: String = text
        .lines()
        .skip_while(|l| !l.starts_with("# Examples"))
        .skip(1)
        .map(|l| l.strip_prefix("# ").or_else(|| l.strip_prefix('#')).unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    let cfg = load_text(&examples, &["NOTES_MCP_TOKEN"]).expect("examples are valid");
    assert_eq!(cfg.servers.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), ["time", "notes", "crm"]);
    assert!(cfg.servers.iter().all(|s| !s.enabled));
}

#[test]
fn server_ids_are_plain() {
    assert!(valid_server_id("everything"));
    assert!(valid_server_id("time-2"));
    assert!(!valid_server_id("-x"));
    assert!(!valid_server_id("a_b"), "'_' would blur the '__' separator");
    assert!(!valid_server_id(&"x".repeat(25)));
}

#[test]
fn oauth_servers_are_checked_key_by_key() {
    let good = r#"
[[server]]
id = "crm"
auth = "oauth"
oauth = { client_id = "gatehouse", client_secret = { secret = "CRM_CLIENT_SECRET" }, scopes = ["crm.read"] }
[server.transport]
type = "http"
url = "https://crm.example/mcp"
"#;
    let cfg = load_text(good, &["CRM_CLIENT_SECRET", TOKEN_KEY_VAR]).expect("valid");
    let crm = cfg.get("crm").expect("crm");
    assert_eq!((crm.auth, crm.oauth.client_id.as_deref()), (AuthMode::Oauth, Some("gatehouse")));
    assert_eq!(crm.elicitation, ElicitationPolicy::Decline, "elicitation is declined unless said otherwise");

    let problems = load_text(good, &["CRM_CLIENT_SECRET"]).expect_err("the key is missing");
    assert!(problems.iter().any(|p| p.to_string().contains(TOKEN_KEY_VAR)), "{problems:?}");

    let bad = r#"
[[server]]
id = "local"
auth = "oauth"
[server.transport]
type = "stdio"
command = "x"

[[server]]
id = "plain"
auth = "oauth"
oauth = { client_id = "c", client_secret = "written-in-the-file", scopes = ["two words"] }
[server.transport]
type = "http"
url = "https://a.example/mcp"

[[server]]
id = "stray"
oauth = { client_id = "c" }
elicitation = "ask_the_customer"
[server.transport]
type = "http"
url = "https://b.example/mcp"
"#;
    let text = load_text(bad, &[TOKEN_KEY_VAR]).expect_err("problems").iter().map(ToString::to_string).collect::<Vec<_>>().join("\n");
    for expected in ["auth", "needs an http transport", "oauth.client_secret", "never written in the file", "oauth.scopes", "elicitation"] {
        assert!(text.contains(expected), "{expected:?} missing from:\n{text}");
    }
}

#[test]
fn elicitation_forwarded_to_the_owner_has_its_own_wait() {
    let text = r#"
[[server]]
id = "asks"
elicitation = "owner"
elicitation_ttl = "5m"
call_timeout = "10s"
[server.transport]
type = "stdio"
command = "x"

[[server]]
id = "default"
elicitation = "owner"
[server.transport]
type = "stdio"
command = "x"
"#;
    let config = load_text(text, &[]).expect("valid");
    let asks = config.get("asks").expect("asks");
    assert_eq!((asks.owner_wait(), asks.call_deadline()), (Duration::from_secs(300), Duration::from_secs(310)));
    assert_eq!(config.get("default").expect("default").owner_wait(), Duration::from_secs(30), "call_timeout by default");
    let bad = "[[server]]\nid = \"x\"\nelicitation_ttl = \"1m\"\n[server.transport]\ntype = \"stdio\"\ncommand = \"x\"\n";
    let text = load_text(bad, &[]).expect_err("ttl without owner").iter().map(ToString::to_string).collect::<Vec<_>>().join("\n");
    assert!(text.contains("elicitation_ttl") && text.contains("only read with elicitation = \"owner\""), "{text}");
}

#[test]
fn a_form_must_fit_in_the_tool_call_budget() {
    let text = "[[server]]\nid = \"asks\"\nelicitation = \"owner\"\nelicitation_ttl = \"10m\"\n[server.transport]\ntype = \"stdio\"\ncommand = \"x\"\n";
    let config = load_text(text, &[]).expect("valid on its own");
    let path = Path::new("mcp.toml");
    let reserve = Duration::from_secs(65);
    let problems = fits_tool_call_budget(&config, path, Duration::from_secs(240), reserve);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].to_string().contains("elicitation_ttl") && problems[0].to_string().contains("jobs.timeouts.tool_call"), "{}", problems[0]);
    assert!(fits_tool_call_budget(&config, path, Duration::from_secs(3600), reserve).is_empty());
}

/// Without forms, a server's own call_timeout must leave its job the time to summarise and
/// answer: a call cut by its job would be made again by the job's retry.
#[test]
fn a_long_call_timeout_must_fit_in_the_tool_call_budget() {
    let text = "[[server]]\nid = \"slow\"\ncall_timeout = \"300s\"\n[server.transport]\ntype = \"stdio\"\ncommand = \"x\"\n";
    let config = load_text(text, &[]).expect("valid on its own");
    let path = Path::new("mcp.toml");
    let problems = fits_tool_call_budget(&config, path, Duration::from_secs(240), Duration::from_secs(65));
    assert_eq!(problems.len(), 1, "{problems:?}");
    let said = problems[0].to_string();
    assert!(said.contains("server (slow).call_timeout") && said.contains("jobs.timeouts.tool_call"), "{said}");
    // 170 s + 1 s + 65 s fits 240 s; 175 s does not.
    let fits = "[[server]]\nid = \"ok\"\ncall_timeout = \"170s\"\n[server.transport]\ntype = \"stdio\"\ncommand = \"x\"\n";
    assert!(fits_tool_call_budget(&load_text(fits, &[]).expect("valid"), path, Duration::from_secs(240), Duration::from_secs(65)).is_empty());
    let tight = fits.replace("170s", "175s");
    assert_eq!(fits_tool_call_budget(&load_text(&tight, &[]).expect("valid"), path, Duration::from_secs(240), Duration::from_secs(65)).len(), 1);
}

/// A misspelt key of a secret header is refused by name: dropped, the token went out without its
/// `Bearer ` prefix and every request was refused.
#[test]
fn a_misspelt_key_of_a_secret_value_is_refused() {
    let text = GOOD.replace("prefix = \"Bearer \"", "prefx = \"Bearer \"");
    let problems = load_text(&text, &["EVERYTHING_TOKEN", "REMOTE_TOKEN"]).expect_err("a misspelt key");
    problems_mention(&problems, &["unknown key \"prefx\""]);
    let problems = load_text(&GOOD.replace("secret = \"REMOTE_TOKEN\", ", ""), &["EVERYTHING_TOKEN"]).expect_err("no secret named");
    problems_mention(&problems, &["needs `secret`"]);
}
